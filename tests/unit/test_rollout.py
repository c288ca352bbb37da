"""The rollout engine's decisions (issue 23) against fake hosts: waves, canary, failure budget,
what happens to a failed host and to the hosts never reached, exit codes."""

from __future__ import annotations

import threading

import pytest

from orchestrator.apply.rollout import Strategy, run_rollout, waves
from orchestrator.errors import ApplyFailed, ExitCode, RemoteError


class FakeOps:
    def __init__(self, fail: dict[str, str] | None = None, unchanged: tuple[str, ...] = ()) -> None:
        self.fail = fail or {}
        self.unchanged = unchanged
        self.events: list[tuple[str, str]] = []
        self.in_router = set()
        self.lock = threading.Lock()
        self.release: dict[str, str] = {}
        self.gate: dict[str, str] = {}  # host -> why its wave fails the gate (canary analysis)

    def log(self, what: str, host: str) -> None:
        with self.lock:
            self.events.append((what, host))

    def prepare(self, host: str) -> bool:
        self.log("prepare", host)
        if self.fail.get(host) == "prepare":
            raise RemoteError(f"{host} unreachable")
        self.in_router.add(host)
        self.release[host] = "old"
        return host not in self.unchanged

    def cancel(self, host: str, why: str) -> str | None:
        self.log("cancel", host)
        return f"{host}-new"

    def drain(self, host: str, timeout_s: float) -> bool:
        self.log("drain", host)
        self.in_router.discard(host)
        return True

    def switch(self, host: str) -> None:
        self.log("switch", host)
        mode = self.fail.get(host)
        if mode == "rolled_back":
            raise ApplyFailed(f"{host} never became healthy", rolled_back=True)
        if mode == "rollback_failed":
            raise ApplyFailed(f"{host} broken", rolled_back=False)
        self.release[host] = "new"

    def verify_wave(self, hosts: list[str]) -> str | None:
        self.log("verify", "wave:" + ",".join(hosts))
        return next((self.gate[h] for h in hosts if h in self.gate), None)

    def revert(self, host: str, why: str) -> None:
        self.log("revert", host)
        if self.fail.get(host) == "revert":
            raise RemoteError(f"{host} unreachable")
        self.release[host] = "old"

    def begin_waves(self, result: object) -> None:
        pass

    def restore(self, host: str) -> None:
        self.log("restore", host)
        self.in_router.add(host)


HOSTS = [f"h{i}" for i in range(1, 8)]


def test_waves_canary_then_max_unavailable() -> None:
    assert waves(HOSTS, Strategy(canary=1, max_unavailable=3)) == [
        ["h1"], ["h2", "h3", "h4"], ["h5", "h6", "h7"]]
    assert waves(HOSTS[:3], Strategy(canary=0, max_unavailable=2)) == [["h1", "h2"], ["h3"]]
    assert waves(["only"], Strategy()) == [["only"]]  # the fleet of one: one wave


def test_every_host_moves_wave_by_wave() -> None:
    ops = FakeOps()
    res = run_rollout(HOSTS, ops, Strategy(canary=1, max_unavailable=2), router_host="r")
    assert res.exit_code == ExitCode.OK
    assert all(ops.release[h] == "new" for h in [*HOSTS, "r"])
    assert ops.in_router == {*HOSTS, "r"}
    # every prepare before the first switch; a host drained before its switch, restored after
    first_switch = ops.events.index(next(e for e in ops.events if e[0] == "switch"))
    assert sum(1 for e in ops.events[:first_switch] if e[0] == "prepare") == 8
    for h in HOSTS:
        i = [e for e in ops.events if e[1] == h]
        assert [w for w, _ in i] == ["prepare", "drain", "switch", "restore"]
    assert ("drain", "r") not in ops.events  # the router's own host is not drained
    # h3 (wave 2) switches only after the canary h1 was restored
    assert ops.events.index(("restore", "h1")) < ops.events.index(("switch", "h3"))


def test_canary_failure_stops_and_only_the_canary_moved() -> None:
    ops = FakeOps(fail={"h1": "rolled_back"})
    res = run_rollout(HOSTS[:3], ops, Strategy(canary=1, max_unavailable=1, max_failures=5))
    assert res.exit_code == ExitCode.ROLLED_BACK and res.stopped_after == 0
    assert res.outcomes["h1"].state == "rolled_back"
    assert [res.outcomes[h].state for h in ("h2", "h3")] == ["not_reached"] * 2
    # the hosts prepared for later waves are cancelled, never switched
    assert {h for w, h in ops.events if w == "cancel"} == {"h2", "h3"}
    assert "never switched" in res.outcomes["h2"].message
    assert ops.release == {"h1": "old", "h2": "old", "h3": "old"}
    assert ops.in_router == {"h1", "h2", "h3"}  # the canary serves its old release again
    assert "canary" in res.reason


def test_failure_budget() -> None:
    ops = FakeOps(fail={"h3": "rolled_back"})
    res = run_rollout(HOSTS[:5], ops, Strategy(canary=1, max_unavailable=1, max_failures=1))
    assert res.stopped_after is None and res.exit_code == ExitCode.ROLLED_BACK
    assert [ops.release[h] for h in HOSTS[:5]] == ["new", "new", "old", "new", "new"]
    ops = FakeOps(fail={"h3": "rolled_back"})
    res = run_rollout(HOSTS[:5], ops, Strategy(canary=1, max_unavailable=1, max_failures=0))
    assert res.stopped_after == 2
    assert [ops.release[h] for h in HOSTS[:5]] == ["new", "new", "old", "old", "old"]


def test_rollback_failed_and_prepare_failed_exit_codes() -> None:
    res = run_rollout(HOSTS[:2], FakeOps(fail={"h2": "rollback_failed"}), Strategy())
    assert res.exit_code == ExitCode.ROLLBACK_FAILED
    ops = FakeOps(fail={"h2": "prepare"})
    res = run_rollout(HOSTS[:3], ops, Strategy())
    assert res.exit_code == ExitCode.ERROR and res.stopped_after == -1
    assert not [e for e in ops.events if e[0] == "switch"]  # nothing switched
    assert "h2" in res.reason
    # the hosts that were prepared are cancelled; the failed one is not (nothing to cancel)
    assert {h for w, h in ops.events if w == "cancel"} == {"h1", "h3"}
    assert res.outcomes["h2"].state == "failed" and res.outcomes["h1"].state == "not_reached"


def test_unchanged_hosts_are_left_alone() -> None:
    ops = FakeOps(unchanged=("h2",))
    res = run_rollout(HOSTS[:3], ops, Strategy(canary=1))
    assert res.outcomes["h2"].state == "unchanged" and ("drain", "h2") not in ops.events
    assert res.exit_code == ExitCode.OK


@pytest.mark.parametrize("bad", [0, -1])
def test_strategy_schema_rejects_bad_values(bad: int) -> None:
    from pydantic import ValidationError

    from orchestrator.profile.schema import RolloutStrategy

    with pytest.raises(ValidationError, match="max_unavailable"):
        RolloutStrategy(max_unavailable=bad)


def test_listen_http_opens_the_tunnel_to_where_each_port_listens() -> None:
    """A fleet's engine listens on its host's service address, not loopback: the SSH tunnel of
    health checks, drains and status must open there (127.0.0.1 is refused)."""
    from types import SimpleNamespace

    from orchestrator.remote.connection import listen_http

    seen: list[tuple[int, str, dict[str, str] | None]] = []

    def http(method: str, port: int, path: str, *, address: str, **kw: object) -> None:
        seen.append((port, address, kw.get("headers")))  # type: ignore[arg-type]

    dep = SimpleNamespace(roles=[SimpleNamespace(port=30000, listen="10.0.1.11")],
                          router=SimpleNamespace(port=8000, host="0.0.0.0"))
    call = listen_http(http, dep, {"Authorization": "Bearer k"})
    call("GET", 30000, "/health")
    call("GET", 8000, "/workers")
    call("GET", 9999, "/x", headers={"X": "1"})
    assert seen == [(30000, "10.0.1.11", {"Authorization": "Bearer k"}),
                    (8000, "127.0.0.1", {"Authorization": "Bearer k"}),
                    (9999, "127.0.0.1", {"Authorization": "Bearer k", "X": "1"})]


def test_a_wave_failing_the_gate_is_rolled_back_like_a_failed_health_check() -> None:
    """Canary analysis: the canary moved and passed its health check, then fails the gate: it
    goes back to its old release, the later waves are never switched, exit 3; the reason is
    the gate's."""
    ops = FakeOps()
    ops.gate = {"h1": "canary analysis failed: ttft_p95 of the wave 0.99 s is 2.54x the "
                      "baseline's 0.39 s"}
    res = run_rollout(HOSTS[:3], ops, Strategy(canary=1, max_unavailable=1))
    assert res.exit_code == ExitCode.ROLLED_BACK and res.stopped_after == 0
    assert res.outcomes["h1"].state == "rolled_back"
    assert "0.99 s" in res.outcomes["h1"].message and "0.39 s" in res.outcomes["h1"].message
    assert ops.release == {"h1": "old", "h2": "old", "h3": "old"}
    assert ("switch", "h2") not in ops.events
    assert ops.events.index(("verify", "wave:h1")) < ops.events.index(("revert", "h1"))
    # a later wave failing it counts against the budget, as a failed host does
    ops = FakeOps()
    ops.gate = {"h2": "canary analysis failed"}
    res = run_rollout(HOSTS[:3], ops, Strategy(canary=1, max_unavailable=1, max_failures=1))
    assert res.stopped_after is None and ops.release == {"h1": "new", "h2": "old", "h3": "new"}
    assert res.exit_code == ExitCode.ROLLED_BACK
    # a revert that fails is a rollback that failed
    ops = FakeOps(fail={"h1": "revert"})
    ops.gate = {"h1": "canary analysis failed"}
    res = run_rollout(HOSTS[:2], ops, Strategy())
    assert res.exit_code == ExitCode.ROLLBACK_FAILED
    assert "rolling it back failed" in res.outcomes["h1"].message
