"""The libyaml fast path of the profile loader (issue 20 #10: a no-change apply parses nine YAML
texts) must give what the pure parser gives, data and positions alike, and hand everything it
does not take plainly (duplicate keys, several documents, syntax errors, alias bombs) to the pure
parser so errors read exactly as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.errors import InputError
from orchestrator.profile import loader
from orchestrator.profile.loader import parse_yaml

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "profiles").glob("*.yaml"))


def _pure(text: str) -> tuple[object, yaml.Node]:
    node = yaml.compose(text, Loader=loader._Loader)
    return yaml.load(text, Loader=loader._Loader), node


def _marks(node: yaml.Node) -> list[tuple[str, int, int]]:
    out = [(type(node).__name__, node.start_mark.line, node.start_mark.column)]
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            out += _marks(k) + _marks(v)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            out += _marks(v)
    return out


def test_libyaml_is_there() -> None:
    """setup installs PyYAML with libyaml; without it the fast path is silently off."""
    assert loader._CLoader is not None


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_fast_path_equals_the_pure_parser(path: Path) -> None:
    text = path.read_text()
    fast = loader._parse_fast(text)
    assert fast is not None, "a plain shipped file must take the fast path"
    data, node = fast
    want_data, want_node = _pure(text)
    assert data == want_data
    assert _marks(node) == _marks(want_node)
    assert parse_yaml(text, path.name)[0] == want_data


@pytest.mark.parametrize(("text", "says"), [
    ("a: 1\na: 2\n", "duplicate"),
    ("a: 1\n---\nb: 2\n", "more than one YAML document"),
    ("a: [1, 2\n", "YAML syntax"),
    ("a: &x [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &y [*x, *x, *x, *x, *x, *x, *x, *x, *x, *x]\n"
     "c: &z [*y, *y, *y, *y, *y, *y, *y, *y, *y, *y]\nd: [*z, *z, *z, *z, *z, *z, *z, *z, *z, *z]\n"
     + "".join(f"{k}: [*z, *z, *z, *z, *z, *z, *z, *z, *z, *z]\n" for k in "efghij"),
     "expands to more than"),
])
def test_what_the_fast_path_declines_is_reported_by_the_pure_parser(text: str, says: str) -> None:
    assert loader._parse_fast(text) is None
    with pytest.raises(InputError) as exc:
        parse_yaml(text, "p.yaml")
    assert says.lower() in " ".join(p.message.lower() for p in exc.value.problems)
