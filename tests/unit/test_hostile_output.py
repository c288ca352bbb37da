"""Issue 31, Deliver 7: invisible and control characters are always shown escaped.

Before: U+FEFF, U+200B, U+2060 and tag characters were printed raw in paths and history (two
different paths looked alike), and escape sequences were stripped (by click, in piped output)
rather than shown escaped, so what a pipe showed differed from the bytes deployed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.terminal import escape
from tests.unit.test_render_cli import _invoke
from tests.validate.helpers import INVENTORY, PROFILES


@pytest.mark.parametrize(("raw", "shown"), [
    ("a\u200bb", "a\\u200bb"), ("\ufeffx", "\\ufeffx"), ("a\u2060b", "a\\u2060b"),
    ("a\U000e0041b", "a\\udb40\\udc41b"), ("soft\u00adhyphen", "soft\\u00adhyphen"),
    ("a\x1b[2Jb", "a\\u001b[2Jb"),
])
def test_invisible_and_control_characters_are_escaped(raw: str, shown: str) -> None:
    assert escape(raw) == shown
    assert json.loads(f'"{shown}"') == raw  # inside JSON it decodes back to the same text
    assert escape(shown) == shown  # idempotent: escaping twice changes nothing


def test_a_path_with_invisible_characters_is_shown_escaped_in_piped_render_output(
        tmp_path: Path) -> None:
    prof = yaml.safe_load((PROFILES / "default.yaml").read_text())
    prof["model"]["path"] = "/models/DeepSeek\u200b-V4"
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof, allow_unicode=True))
    rc, out, err = _invoke("render", str(path), "--stdout")
    assert rc == 0, err
    text = out + err
    assert "\u200b" not in text
    assert "/models/DeepSeek\\u200b-V4" in text, text[-2000:]


def test_an_escape_sequence_in_piped_output_is_shown_not_stripped(
        capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.output import echo
    from orchestrator.terminal import escaped_output

    with escaped_output():
        echo("before \x1b[2K\x1b]0;title\x07 after")
        echo("raw \x1b[31m", raw=True)
    out = capsys.readouterr().out
    assert "before \\u001b[2K\\u001b]0;title\\u0007 after" in out
    assert "raw \\u001b[31m" in out
