"""`dsv4ctl apply` asks before changing a host when a person is at the terminal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import orchestrator.apply.fleet_ops as fleet_ops
import orchestrator.apply.fleet_rollback as fleet_rollback
from orchestrator.cli import main
from orchestrator.paths import data_dir
from orchestrator.planner.build import save_plan
from orchestrator.planner.fleet import plan_from_paths


class _Tty:
    def __init__(self, answer: str) -> None:
        self.answer = answer

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self.answer


@pytest.fixture
def saved_plan(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    save_plan(plan_from_paths(data_dir("profiles") / "default.yaml"), path)
    return path


def _apply(saved_plan: Path, *extra: str) -> int:
    return main(["apply", str(saved_plan), "--inventory", str(data_dir("profiles") / "inventory.yaml"),
                 *extra])


def test_no_at_the_prompt_changes_nothing(saved_plan: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", _Tty("n\n"))
    monkeypatch.setattr(fleet_ops, "apply_fleet",
                        lambda *a, **k: pytest.fail("the driver ran after 'n'"))
    assert _apply(saved_plan) == 1
    err = capsys.readouterr().err
    assert "cancelled at the prompt; nothing was changed" in err


def test_yes_skips_the_prompt(saved_plan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", _Tty(""))  # an empty answer would mean "no"
    called: list[str] = []

    class _Done(Exception):
        pass

    def fake_apply(targets, hosts, plans, strategy, **kw):
        called.extend(targets.moved)
        raise _Done

    monkeypatch.setattr(fleet_ops, "apply_fleet", fake_apply)
    with pytest.raises(_Done):
        _apply(saved_plan, "--yes")
    assert called == ["gpu-host"]


class _Pipe:
    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        return "y\n"  # a pipe that says yes is not a person who read the plan


def test_apply_without_yes_refuses_when_stdin_is_not_a_terminal(
        saved_plan: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", _Pipe())
    monkeypatch.setattr(fleet_ops, "apply_fleet",
                        lambda *a, **k: pytest.fail("the driver ran with nobody to confirm"))
    assert _apply(saved_plan) == 1
    err = capsys.readouterr().err
    assert "stdin is not a terminal; nothing was changed" in err and "--yes" in err


def test_rollback_without_yes_refuses_when_stdin_is_not_a_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", _Pipe())
    monkeypatch.setattr(fleet_rollback, "rollback_fleet",
                        lambda *a, **k: pytest.fail("rollback ran with nobody to confirm"))
    inv = str(data_dir("profiles") / "inventory.yaml")
    assert main(["rollback", "--host", "gpu-host", "--inventory", inv]) == 1
    err = capsys.readouterr().err
    assert "rollback needs confirmation and stdin is not a terminal" in err
    # the command for scripts is this one with --yes, runnable as printed (it said `dsv4ctl
    # rollback ... --yes`, whose `...` the completion turned into a release named '...')
    assert f"(`dsv4ctl rollback --host gpu-host --inventory {inv} --yes`)" in err, err


def test_rollback_with_yes_runs(monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", _Pipe())
    called: list[str | None] = []

    from types import SimpleNamespace

    def fake_rollback(targets, hosts, plans, strategy, *, release, **kw):
        called.append(release)
        res = SimpleNamespace(status="healthy", message="rolled back")
        return (SimpleNamespace(errors={}), SimpleNamespace(targets=targets,
                                                            results={targets.moved[0]: res}), None)

    monkeypatch.setattr(fleet_rollback, "rollback_fleet", fake_rollback)
    from orchestrator.apply import preview
    from orchestrator.planner_model import Action

    shown = [Action(kind="restart", target="dsv4-default-decode.service", roles=["decode"],
                    reason="bin/launch-decode.sh changed", downtime="minutes")]
    monkeypatch.setattr(preview, "preview_rollback", lambda name, host, release: (
        release, shown, False))
    inv = str(data_dir("profiles") / "inventory.yaml")
    assert main(["rollback", "r1", "--yes", "--host", "gpu-host", "--inventory", inv]) == 0
    assert called == ["r1"]
    out = capsys.readouterr().out
    # show, then act: the transition before the rollback runs
    assert out.index("Rollback of host 'gpu-host' to r1:") < out.index("1 to restart") \
        < out.index("rolled back")
