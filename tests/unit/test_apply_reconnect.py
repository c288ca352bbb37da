"""After a transfer fails, the apply reconnects before it writes the record (issue 20 #7).

CI (2 cores, whole suite) saw a killed sshd's connection still flagged active by paramiko when
the apply went to record the failed upload: it trusted the flag, wrote down the dead connection,
and left the host's record "applying". These tests drive the decision with fakes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

import orchestrator.remote.lock as lock_mod
from orchestrator.apply import executor
from orchestrator.errors import RemoteError
from orchestrator.remote.probes import CommandResult


class FakeRemote:
    def __init__(self, *, answers: bool) -> None:
        self.alive = True  # the lagging flag
        self.answers = answers
        self.connects = 0
        self.closed = 0

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        if not self.answers:
            raise RemoteError("channel closed")
        return CommandResult(command, 0, "", "")

    def close(self) -> None:
        self.closed += 1

    def connect(self) -> FakeRemote:
        self.connects += 1
        self.answers = True
        return self


class FakeLock:
    taken: ClassVar[list[str]] = []

    def __init__(self, remote: Any, root: str, command: str, *, outer: str | None = None) -> None:
        self.command = command
        self.held = False

    def acquire(self) -> None:
        self.held = True
        FakeLock.taken.append(self.command)

    def release(self) -> None:
        self.held = False


def ctx(remote: FakeRemote) -> Any:
    old_lock = SimpleNamespace(held=True, release=lambda: None)
    return SimpleNamespace(remote=remote, lock=old_lock, host=SimpleNamespace(install_root="/x"),
                           command="dsv4ctl apply", out=lambda line: None, fleet_lock=None)


@pytest.fixture(autouse=True)
def fake_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeLock.taken = []
    monkeypatch.setattr(lock_mod, "HostLock", FakeLock)


def test_a_connection_flagged_alive_that_does_not_answer_is_replaced() -> None:
    remote = FakeRemote(answers=False)
    c = ctx(remote)
    assert executor._reconnect(c) is True
    assert remote.connects == 1 and remote.closed == 1
    assert FakeLock.taken == ["dsv4ctl apply (recording)"] and c.lock.held


def test_a_live_connection_is_kept() -> None:
    remote = FakeRemote(answers=True)
    c = ctx(remote)
    assert executor._reconnect(c) is True
    assert remote.connects == 0 and FakeLock.taken == []


def test_the_final_record_write_reconnects_once_when_the_connection_died_under_it() -> None:
    remote = FakeRemote(answers=True)
    writes: list[str] = []

    def write_record(rec: Any) -> None:
        writes.append(rec)
        if len(writes) == 1:
            remote.answers = False
            raise RemoteError("write failed: socket closed")

    c = ctx(remote)
    c.persist, c.record, c.journal_error = True, "rec", "x"
    c.store = SimpleNamespace(write_record=write_record)
    assert executor._save_final(c) == ""
    assert writes == ["rec", "rec"] and remote.connects == 1 and c.journal_error is None
