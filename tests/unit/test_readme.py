"""The README cannot drift from the CLI: its command and exit-code tables are what
scripts/gen_readme.py makes from the CLI now, and its first two commands stay `make plan` and
`make test`. Shell completion is documented with the variable click really reads."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

from orchestrator.errors import EXIT_CODE_MEANINGS, ExitCode
from tests.conftest import REPO

README = REPO / "README.md"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_readme", REPO / "scripts" / "gen_readme.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_tables_are_generated_from_the_cli() -> None:
    text = README.read_text(encoding="utf-8")
    assert _gen().render(text) == text, "README.md drifted: run python scripts/gen_readme.py"


def test_a_changed_command_makes_the_check_fail() -> None:
    from orchestrator.cli import cli

    gen = _gen()
    text = README.read_text(encoding="utf-8")
    cmd = cli.commands["validate"]
    old = cmd.help
    try:
        cmd.help = "Something else entirely."
        assert gen.render(text) != text
    finally:
        cmd.help = old


def test_every_exit_code_is_documented() -> None:
    assert set(EXIT_CODE_MEANINGS) == set(ExitCode)
    text = README.read_text(encoding="utf-8")
    for code in ExitCode:
        assert f"| {int(code)} |" in text


def test_readme_starts_with_make_plan_and_make_test() -> None:
    cmds = re.findall(r"^(make \w+)", README.read_text(encoding="utf-8"), re.M)
    assert cmds[:2] == ["make plan", "make test"]


def test_documented_completion_works() -> None:
    assert "_DSV4CTL_COMPLETE=bash_source dsv4ctl" in README.read_text(encoding="utf-8")
    env = {**os.environ, "_DSV4CTL_COMPLETE": "bash_complete", "COMP_WORDS": "dsv4ctl pla",
           "COMP_CWORD": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", "from orchestrator.cli import entrypoint; "
                          "import sys; sys.argv[0] = 'dsv4ctl'; entrypoint()"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert "plain,plan" in out.stdout, (out.stdout, out.stderr)
