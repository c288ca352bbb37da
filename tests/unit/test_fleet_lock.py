"""The fleet lock keeps two rollouts of one fleet apart (issue 23): a second, concurrent
``apply_fleet`` of the same profile is refused with the "locked" exit code (5) and the first
rollout's holder shown, before it touches any host or starts a rollout.

The lock is the real one (:class:`orchestrator.remote.lock.HostLock`: ``flock`` run by a shell),
its "host" a local directory reached through a subprocess instead of SSH."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import orchestrator.apply.rollout as rollout
import orchestrator.remote.connection as connection
from orchestrator.apply.fleet_ops import FleetOps, apply_fleet, fleet_lock_name, targets_of
from orchestrator.apply.rollout import Strategy
from orchestrator.errors import ExitCode, LockHeld
from orchestrator.remote.probes import CommandResult


class LocalChannel:
    """The part of a paramiko channel :class:`HostLock` uses, over a local process."""

    def __init__(self, command: str) -> None:
        self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.closed = False

    def settimeout(self, timeout: float) -> None:
        pass

    def recv(self, n: int) -> bytes:
        return os.read(self.proc.stdout.fileno(), n)

    def recv_exit_status(self) -> int:
        return self.proc.wait(timeout=30)

    def recv_stderr(self, n: int) -> bytes:
        return self.proc.stderr.read(n)

    def shutdown_write(self) -> None:
        self.proc.stdin.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if not self.proc.stdin.closed:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
            self.proc.stdout.close()
            self.proc.stderr.close()


class LocalRemote:
    """A host whose commands run locally; records every command it is asked to run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.commands: list[str] = []
        self.channels: list[LocalChannel] = []

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return CommandResult(command, p.returncode, p.stdout, p.stderr)

    def open_process(self, command: str) -> LocalChannel:
        self.commands.append(command)
        chan = LocalChannel(command)
        self.channels.append(chan)
        return chan

    def close(self) -> None:
        for c in self.channels:
            c.close()


@pytest.fixture
def fleet() -> Iterator[tuple[Any, dict[str, Any]]]:
    # not pytest's tmp_path: the lock script checks the install root like a host's, and refuses
    # one under a world-writable /tmp (tests/unit/test_hostile_fs_shell.py); the repository's
    # ignored cache directory is a root it accepts
    cache = Path(__file__).resolve().parents[2] / ".pytest_cache"
    cache.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="fleet-lock-", dir=cache))
    plan = SimpleNamespace(router_on=None, hosts=["gpu-a", "gpu-b"], profile_name="flash",
                           router_only_host=None, plans=[])
    hosts = {h: SimpleNamespace(install_root=str(root)) for h in plan.hosts}
    try:
        yield plan, hosts
    finally:
        shutil.rmtree(root)


def test_second_rollout_refused_by_the_fleet_lock(fleet: tuple[Any, dict[str, Any]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    plan, hosts = fleet
    remotes: list[LocalRemote] = []

    def connect(name: str, host: Any) -> LocalRemote:
        remotes.append(LocalRemote(name))
        return remotes[-1]

    # the first rollout: holds the fleet lock, as apply_fleet does while its waves run
    first = FleetOps(targets_of(plan), hosts, out=lambda _s: None,
                     command="dsv4ctl apply flash.yaml #1",
                     connect=connect)
    first.lock_fleet()
    assert first.fleet_lock.held
    lock_file = Path(hosts["gpu-a"].install_root) / fleet_lock_name("flash")
    assert lock_file.exists()

    # the second, concurrent rollout of the same fleet over its own connections
    monkeypatch.setattr(connection, "connect", connect)
    started: list[Any] = []
    monkeypatch.setattr(rollout, "run_rollout", lambda *a, **k: started.append(a))
    # the plans' own checks need no host (and these fakes have no plans to check)
    monkeypatch.setattr(FleetOps, "check", lambda self: None)
    n_before = len(remotes)
    try:
        with pytest.raises(LockHeld) as exc:
            apply_fleet(targets_of(plan), hosts, {}, Strategy(canary=1, max_unavailable=1),
                        out=lambda _s: None,
                        command="dsv4ctl apply flash.yaml #2", saved=False)
    finally:
        first.close()
    assert exc.value.exit_code == ExitCode.LOCKED == 5
    # the holder shown is the first rollout (the fleet lock's own info file, not the host lock's)
    assert "dsv4ctl apply flash.yaml #1" in exc.value.message, exc.value.message
    assert f"pid {os.getpid()}" in exc.value.message
    assert not started, "the refused rollout must not run"
    # it touched nothing but the lock: one connection (the lock's host), no other command
    second = remotes[n_before:]
    assert [r.name for r in second] == ["gpu-a"]
    assert all("flock" in c or "cat " in c for c in second[0].commands), second[0].commands
    # once the first is done, the fleet can be locked again (the refusal took nothing over)
    third = FleetOps(targets_of(plan), hosts, out=lambda _s: None,
                     command="dsv4ctl apply flash.yaml #3",
                     connect=connect)
    try:
        third.lock_fleet()
        assert third.fleet_lock.held
    finally:
        third.close()


def test_concurrent_lock_attempts_one_wins(fleet: tuple[Any, dict[str, Any]]) -> None:
    """Two rollouts racing for the fleet lock: exactly one holds it, the other is told 5."""
    plan, hosts = fleet
    results: list[Any] = []
    ops = [FleetOps(targets_of(plan), hosts, out=lambda _s: None,
                    command=f"dsv4ctl apply #{i}",
                    connect=lambda n, h: LocalRemote(n)) for i in range(2)]
    gate = threading.Barrier(2)

    def take(o: FleetOps) -> None:
        gate.wait()
        try:
            o.lock_fleet()
            results.append("held")
        except LockHeld as exc:
            results.append(int(exc.exit_code))

    threads = [threading.Thread(target=take, args=(o,)) for o in ops]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for o in ops:
        o.close()
    assert sorted(results, key=str) == [5, "held"], results


def test_status_names_the_running_rollout(fleet: tuple[Any, dict[str, Any]]) -> None:
    """`status -p FLEET` while a rollout holds the fleet lock names it (the fleet lock's holder);
    once it is done, nothing is shown as running."""
    from orchestrator.apply.fleet_view import fleet_status

    plan, hosts = fleet
    first = FleetOps(targets_of(plan), hosts, out=lambda _s: None,
                     command="dsv4ctl apply flash.yaml #1",
                     connect=lambda n, h: LocalRemote(n))
    first.lock_fleet()
    st_args = {"status": lambda n, h: "not probed in this test"}
    try:
        st = fleet_status(plan, hosts, **st_args, connect=lambda n, h: LocalRemote(n))
    finally:
        first.close()
    assert st["in_progress"] and "dsv4ctl apply flash.yaml #1" in st["in_progress"], st
    st = fleet_status(plan, hosts, **st_args, connect=lambda n, h: LocalRemote(n))
    assert st["in_progress"] is None


@pytest.fixture
def one_host(fleet: tuple[Any, dict[str, Any]]) -> Iterator[tuple[LocalRemote, str, str]]:
    """(the host, its install root, the fleet of one's fleet lock name); the host's channels
    closed at the end (every lock they hold freed)."""
    _plan, hosts = fleet
    remote = LocalRemote("gpu-a")
    try:
        yield remote, hosts["gpu-a"].install_root, fleet_lock_name("flash")
    finally:
        remote.close()


def test_the_fleet_of_one_takes_its_fleet_lock_then_its_host_lock(
        one_host: tuple[LocalRemote, str, str]) -> None:
    """Issue 30: one lock protocol, the fleet lock then the host lock, for one host too. The
    fleet of one takes both in its host lock's one command (no extra round trip): a run of the
    same profile holding either one refuses it, naming that lock's own holder; and once it holds
    both, a fleet-lock-only run (another driver of the same profile) and a host-lock-only run
    are each refused."""
    from orchestrator.remote.lock import LOCK_NAME, HostLock, is_locked, lock_holders, read_holder

    remote, root, name = one_host
    # the fleet of one's driver: both locks in one command
    both = HostLock(remote, root, "dsv4ctl apply one.yaml #1", outer=name)
    both.acquire()
    opened = len(remote.channels)
    assert opened == 1 and is_locked(remote, root, name) and is_locked(remote, root, LOCK_NAME)
    # each lock's info file names its own holder process (the one the kernel lists)
    fleet_holder, host_holder = read_holder(remote, root, name), read_holder(remote, root)
    assert fleet_holder and host_holder
    assert fleet_holder.remote_pid in lock_holders(remote, root, name)
    assert host_holder.remote_pid == both.remote_pid in lock_holders(remote, root)
    assert "one.yaml #1" in fleet_holder.info["command"]
    for other in (HostLock(remote, root, "#2", name=name),  # a fleet run's fleet lock
                  HostLock(remote, root, "#3"),  # a run of the host alone
                  HostLock(remote, root, "#4", outer=name)):  # the fleet of one again
        with pytest.raises(LockHeld) as exc:
            other.acquire()
        assert exc.value.exit_code == ExitCode.LOCKED
        assert "one.yaml #1" in exc.value.message, exc.value.message
    # the refusal names the lock it met: the fleet's, taken first
    assert name in exc.value.message
    both.release()
    assert not is_locked(remote, root, name) and not is_locked(remote, root, LOCK_NAME)
    # its info files are gone with it (only ours are removed)
    assert read_holder(remote, root, name) is None and read_holder(remote, root) is None

    # a run holding only the host lock: the fleet of one gets the fleet lock, is refused at
    # the host lock and names that holder; and leaves the fleet lock free again
    host_only = HostLock(remote, root, "dsv4ctl apply --host gpu-a #5")
    host_only.acquire()
    with pytest.raises(LockHeld) as exc:
        HostLock(remote, root, "#6", outer=name).acquire()
    assert "#5" in exc.value.message and "host 'gpu-a' is locked" in exc.value.message
    host_only.release()
    assert not is_locked(remote, root, name)


def test_force_unlock_of_the_fleet_of_ones_fleet_lock_frees_both(
        one_host: tuple[LocalRemote, str, str]) -> None:
    """`unlock --force` on the fleet lock ends its holder, and with it the host lock taken
    inside it (one holder process chain): nothing stays half-locked."""
    from orchestrator.remote.lock import LOCK_NAME, HostLock, force_unlock, is_locked

    remote, root, name = one_host
    both = HostLock(remote, root, "dsv4ctl apply one.yaml", outer=name)
    both.acquire()
    force_unlock(remote, root, name)
    for _ in range(50):
        if not is_locked(remote, root, LOCK_NAME):
            break
        time.sleep(0.1)
    assert not is_locked(remote, root, name) and not is_locked(remote, root, LOCK_NAME)
    both.release()
