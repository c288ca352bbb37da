"""Property tests: thousands of malformed and hostile profiles end in a located error, never a traceback."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import InputError
from orchestrator.paths import data_dir
from orchestrator.profile import Profile, load_text

BASE = yaml.safe_load((data_dir("profiles") / "default.yaml").read_text())

HOSTILE = [
    "$(reboot)", "`id`", "a; rm -rf /", "x\ny", "%h", "%n%%", "'", '"', "\\", "\x00", "\x1b[31m",
    "../../etc/passwd", "/models/$(id)", " ", "", "🚀", "a" * 5000, "-1", "1e309", "nan", "null",
]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=40), st.sampled_from(HOSTILE),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(BASE)


@st.composite
def mutated_profiles(draw: st.DrawFn) -> str:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        parent = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["replace", "delete", "extra"]))
            if action == "replace":
                parent[path[-1]] = draw(values)
            elif action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced this branch
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _assert_clean(text: str) -> None:
    try:
        load_text(Profile, text, "fuzz.yaml")
    except InputError as exc:
        assert exc.problems, "an InputError must carry at least one problem"
        for p in exc.problems:
            assert p.file == "fuzz.yaml"
            assert p.message
            # every problem inside the document is located; only whole-document ones may lack a line
            assert p.line is not None or p.path == "", p
        assert exc.render().startswith("error: ")


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_profiles())
def test_mutated_profiles_never_traceback(text: str) -> None:
    _assert_clean(text)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_tracebacks(text: str) -> None:
    _assert_clean(text)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["{", "}", "[", "]", ":", "- ", "\n", "  ", "&a ", "*a", "!!python/object ",
                                 "key", "'", '"', "#", "---\n", "? ", "|\n", ">\n", "\t", "%YAML 1.1\n"]),
                max_size=40).map("".join))
def test_yaml_syntax_soup_never_tracebacks(text: str) -> None:
    _assert_clean(text)
