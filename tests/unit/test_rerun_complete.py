"""Printed commands carry the run's -p, -i and --host (orchestrator/cli/rerun.py); the harness
test (tests/integration/test_rerun.py) runs the ones real flows print."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from orchestrator.cli import _options
from orchestrator.cli.output import _fold_keeping_commands
from orchestrator.cli.rerun import Target, complete

T = Target(Path("/p/my profile.yaml"), Path("/p/inv.yaml"), "box")


def test_a_fix_gets_the_runs_target() -> None:
    opts = _options()
    out = complete("fix: re-plan: dsv4ctl plan --host box --live -o PLAN.json", T, opts)
    assert out == ("fix: re-plan: dsv4ctl plan -p '/p/my profile.yaml' -i /p/inv.yaml "
                   "--host box --live -o PLAN.json")
    assert complete("see `dsv4ctl history`", T, opts) == (
        "see `dsv4ctl history -p '/p/my profile.yaml' -i /p/inv.yaml --host box`")


def test_what_a_command_names_is_left_as_written() -> None:
    opts = _options()
    # the subject given as an operand (or a placeholder): no second -p
    assert "-p" not in complete("dsv4ctl apply plan.json", T, opts)
    assert "-p" not in complete("run `dsv4ctl apply PROFILE` without --yes", T, opts)
    assert complete("dsv4ctl status -i other.yaml --host other", T, opts).count("-i") == 1
    # diff has no -p; prose is not a command
    assert "-p" not in complete("dsv4ctl diff a.yaml b.yaml", T, opts)
    assert complete("dsv4ctl sets CUDA_VISIBLE_DEVICES itself", T, opts) == (
        "dsv4ctl sets CUDA_VISIBLE_DEVICES itself")
    assert complete("dsv4ctl plan: default (host box)", T, opts) == "dsv4ctl plan: default (host box)"


def test_a_command_is_never_folded_in_two() -> None:
    line = ("  fix: re-plan: " + complete("dsv4ctl plan --host box --live -o PLAN.json", T,
                                          _options()) + " (never edit a saved plan)")
    pieces = _fold_keeping_commands(line, 60)
    whole = next(p for p in pieces if "dsv4ctl" in p)
    cmd = whole[whole.index("dsv4ctl"):].split(" (never")[0]
    assert shlex.split(cmd)[-2:] == ["-o", "PLAN.json"]


def test_a_lock_holders_command_is_shown_as_it_was_run() -> None:
    """The holder's command line is a fact about another run: completing it with this run's -p
    and -i showed a command the holder never ran ("running: dsv4ctl apply -p ... -i ...
    other-plan.json"). The fix beside it is still completed."""
    from orchestrator.remote.lock import Holder

    holder = Holder(None, {"user": "ops", "controller": "vm", "pid": 7,
                           "started": "2026-12-02T06:00:00Z",
                           "command": "dsv4ctl apply other-plan.json"})
    text = (f"host 'box' is locked by another dsv4ctl run: {holder.describe()}; fix: "
            f"`dsv4ctl unlock --force --host box` ends it")
    out = complete(text, T, _options())
    assert 'running: "dsv4ctl apply other-plan.json"' in out
    assert "`dsv4ctl unlock -p '/p/my profile.yaml' -i /p/inv.yaml --force --host box`" in out


def _profiles(tmp_path: Path) -> tuple[Path, Path, Path]:
    import shutil

    import yaml

    from tests.validate.helpers import INVENTORY, PROFILES

    inv = tmp_path / "hosts.yaml"
    shutil.copy(INVENTORY, inv)
    data = yaml.safe_load((PROFILES / "mxfp4-tp8.yaml").read_text())
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(data, sort_keys=False))
    data["name"] = "renamed"
    data["secrets"] = {"HF_TOKEN": {"env": "DSV4_TEST_HF_TOKEN"}}
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(data, sort_keys=False))
    return old, new, inv


def test_a_file_diff_shows_the_files_lines_not_completed_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A unified diff is the files' text: a rendered file's header naming `dsv4ctl render` got
    this run's -i inserted, so the diff no longer showed (nor applied as) the real file."""
    from orchestrator.cli import main

    old, new, inv = _profiles(tmp_path)
    assert main(["diff", str(old), str(new), "-i", str(inv), "-v"]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith(("-# Generated",
                                                                     "+# Generated"))]
    assert headers and all(line.endswith("`dsv4ctl render` rewrites it.") for line in headers)


def test_a_plans_documents_complete_their_fixes(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """plan --format json prints the checks raw: a fix's command named `apply PROFILE` (a
    placeholder for the profile the run had) and carried no -i."""
    import json
    import shlex

    from orchestrator.cli import main

    _, new, inv = _profiles(tmp_path)
    assert main(["plan", str(new), "-i", str(inv), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [fix] = [c["fix"] for c in doc["checks"] if c["id"] == "secrets.values-not-planned"]
    cmd = fix.split("`")[1]
    assert shlex.split(cmd) == ["dsv4ctl", "apply", "-p", str(new), "-i", str(inv)]


def test_a_host_named_alone_gets_a_profile_placeholder_not_the_default_profile() -> None:
    """`status --host h -i inv` (no profile: the host's own releases) printed `dsv4ctl plan -i
    inv --host h --live`, which plans the bundled default profile onto the host: another
    deployment. The profile is not known there, so the command says so."""
    opts = _options()
    alone = Target(None, Path("/p/inv.yaml"), "h")
    line = "`dsv4ctl plan --live` now calibrates from the measurement"
    out = complete(line, alone, opts, run_verb="status")
    assert "`dsv4ctl plan -p PROFILE -i /p/inv.yaml --host h --live`" in out
    # a run that itself took the default profile (apply, plan) prints the same default
    assert "-p" not in complete(line, alone, opts, run_verb="apply")
    # status's own commands act on the host alone: no profile needed
    assert "-p" not in complete("see `dsv4ctl history`", alone, opts, run_verb="status")


def test_every_group_command_gets_the_runs_target() -> None:
    """A group's commands (``qualify kernels``, ``calibrate ...``, ``probe ...``) are completed
    like the top-level ones: `dsv4ctl qualify kernels` printed by a kernel-path check was left
    bare, so run as printed it measured for the bundled default profile (found by the suite's
    printed-command check in test_qualify_kernels)."""
    opts = _options()
    t = Target(profile=Path("p.yaml"), inventory=Path("inv.yaml"), host="h")
    groups = sorted({verb for verb in opts if " " in verb})
    assert "qualify kernels" in groups
    for verb in groups:
        if not {"-p", "-i", "--host"} <= opts[verb]:
            continue
        got = complete(f"re-run `dsv4ctl {verb}`", t, opts)
        assert got == f"re-run `dsv4ctl {verb} -p p.yaml -i inv.yaml --host h`", verb
