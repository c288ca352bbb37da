"""`dsv4ctl apply` asks before changing a host when a person is at the terminal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import orchestrator.apply
from orchestrator.cli import main
from orchestrator.paths import data_dir
from orchestrator.planner.build import plan_from_paths, save_plan


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
    monkeypatch.setattr(orchestrator.apply, "apply_plan",
                        lambda *a, **k: pytest.fail("apply_plan ran after 'n'"))
    assert _apply(saved_plan) == 1
    err = capsys.readouterr().err
    assert "cancelled at the prompt; nothing was changed" in err


def test_yes_skips_the_prompt(saved_plan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", _Tty(""))  # an empty answer would mean "no"
    called: list[str] = []

    class _Done(Exception):
        pass

    def fake_apply(plan, name, host, **kw):
        called.append(name)
        raise _Done

    monkeypatch.setattr(orchestrator.apply, "apply_plan", fake_apply)
    with pytest.raises(_Done):
        _apply(saved_plan, "--yes")
    assert called == ["gpu-host"]
