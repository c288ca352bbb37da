"""Printed commands carry the run's -p, -i and --host (orchestrator/cli/rerun.py); the harness
test (tests/integration/test_rerun.py) runs the ones real flows print."""

from __future__ import annotations

import shlex
from pathlib import Path

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
