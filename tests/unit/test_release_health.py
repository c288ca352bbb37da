"""Model-aware health checks and the wait loop, on scripted responses (no host, fake clock).

The end-to-end behaviour against the engine simulator is in tests/integration/test_apply.py; these
pin the decisions: what counts as ready, crashed, registered, and when the wait gives up.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from orchestrator.deployment import Deployment, resolve
from orchestrator.health import (
    check_role,
    check_router,
    check_units,
    count_workers,
    default_stability_window_s,
    smoke_generate,
    wait_healthy,
    watch_stable,
)
from orchestrator.profile import load_text
from orchestrator.profile.inventory import Host
from orchestrator.profile.schema import Profile
from orchestrator.remote.systemd import UnitState


@dataclass
class Resp:
    status: int
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


def dep(mode: str = "pd") -> Deployment:
    topo: dict[str, Any] = (
        {"mode": "pd", "prefill": {"gpus": [0, 1, 2, 3], "tp": 4},
         "decode": {"gpus": [4, 5, 6, 7], "tp": 4}} if mode == "pd"
        else {"mode": "colocated", "engine": {"gpus": list(range(8)), "tp": 8}})
    p = load_text(Profile, yaml.safe_dump({"name": "t", "host": "h", "topology": topo, "model": {
        "variant": "dsv4-flash-nvfp4", "path": "/models/x"}}), "p.yaml")
    host = Host(address="h", gpus={"model": "x", "count": 8})
    return resolve(p, "h", host, default_index_topk=512, max_context_length=1 << 20)


def models(name: str) -> Resp:
    return Resp(200, json.dumps({"object": "list", "data": [{"id": name}]}).encode())


def workers(p: int, d: int, unhealthy_decode: int = 0) -> Resp:
    ws = ([{"worker_type": "prefill", "is_healthy": True}] * p
          + [{"worker_type": "decode", "is_healthy": True}] * d
          + [{"worker_type": "decode", "is_healthy": False}] * unhealthy_decode)
    return Resp(200, json.dumps({"workers": ws, "total": len(ws), "stats": {}}).encode())


def http_from(table: dict[tuple[int, str], Resp | Exception]) -> Callable[..., Resp]:
    def http(method: str, port: int, path: str, **kw: Any) -> Resp:
        r = table.get((port, path), Resp(404))
        if isinstance(r, Exception):
            raise r
        return r
    return http


def healthy_table(d: Deployment) -> dict[tuple[int, str], Resp | Exception]:
    t: dict[tuple[int, str], Resp | Exception] = {}
    for r in d.roles:
        t[(r.port, "/ready")] = Resp(200)
        t[(r.port, "/health")] = Resp(200)
        t[(r.port, "/v1/models")] = models(d.served_name)
    if d.router:
        t[(d.router.port, "/readiness")] = Resp(200)
        t[(d.router.port, "/workers")] = workers(1, 1)
    return t


def running(d: Deployment, **override: UnitState) -> dict[str, UnitState]:
    units = [r.unit for r in d.roles] + ([d.router.unit] if d.router else [])
    out = {u: UnitState(u, "active", "running", 100, 0, "success", "loaded") for u in units}
    out.update(override)
    return out


def test_role_checks_stop_at_first_failure() -> None:
    d = dep()
    role = d.roles[1]
    t = healthy_table(d)
    assert all(r.ok for r in check_role(http_from(t), role.name, role.port, d.served_name))
    t[(role.port, "/health")] = Resp(503)
    res = check_role(http_from(t), role.name, role.port, d.served_name)
    assert [(r.check, r.ok) for r in res] == [("ready", True), ("health", False)]
    t[(role.port, "/ready")] = ConnectionRefusedError()
    (r,) = check_role(http_from(t), role.name, role.port, d.served_name)
    assert r.message == "no answer (refused)"
    t = healthy_table(d)
    t[(role.port, "/v1/models")] = models("other-model")
    assert "expected 'deepseek-v4-flash'" in check_role(http_from(t), role.name, role.port,
                                                        d.served_name)[-1].message


def test_engine_dying_between_health_and_models_reads_as_no_answer() -> None:
    """An engine that crashes after /health answered but before /v1/models (seen in CI under load)
    is reported as a dead port, not as "/v1/models answered None"."""
    d = dep()
    role = d.roles[1]
    t = healthy_table(d)
    t[(role.port, "/v1/models")] = ConnectionRefusedError()
    res = check_role(http_from(t), role.name, role.port, d.served_name)
    assert [(r.check, r.ok) for r in res] == [("ready", True), ("health", True), ("models", False)]
    assert res[-1].message == "no answer (refused)"
    t[(role.port, "/v1/models")] = Resp(500)
    assert check_role(http_from(t), role.name, role.port, d.served_name)[-1].message \
        == "/v1/models answered HTTP 500"


def test_router_worker_counts() -> None:
    assert count_workers(json.loads(workers(1, 2, unhealthy_decode=3).body)) == (1, 2, 0)
    assert count_workers({"stats": {"prefill_count": 2, "decode_count": 1}}) == (2, 1, 0)
    assert count_workers("nonsense") == (0, 0, 0)
    t = {(8000, "/readiness"): Resp(200), (8000, "/workers"): workers(1, 0, 1)}
    res = check_router(http_from(t), 8000, 1, 1)
    assert not res[-1].ok and res[-1].message == "1/1 prefill, 0/1 decode healthy"


def test_unit_states_crash_detection() -> None:
    d = dep()
    u = d.roles[1].unit
    ok = check_units(running(d), {u: "decode"}, {})
    assert ok[0].ok
    crashed = running(d, **{u: UnitState(u, "activating", "auto-restart", 0, 0, "exit-code",
                                         "loaded")})
    assert "crashed" in check_units(crashed, {u: "decode"}, {})[0].message
    restarted = running(d, **{u: UnitState(u, "active", "running", 7, 2, "success", "loaded")})
    assert "restarted 2x" in check_units(restarted, {u: "decode"}, {u: 1})[0].message
    assert check_units(restarted, {u: "decode"}, {u: 2})[0].ok  # restarts before this apply


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_wait_until_ready_with_progress() -> None:
    d = dep()
    t = healthy_table(d)
    clock = Clock()
    decode = d.roles[1]

    def http(method: str, port: int, path: str, **kw: Any) -> Resp:
        if port == decode.port and path == "/ready" and clock.t < 30:
            return Resp(503)
        return http_from(t)(method, port, path)

    lines: list[str] = []
    rep = wait_healthy(http, d, lambda: running(d), timeout_s=60, poll_s=5, baseline_restarts={},
                       progress=lines.append, clock=clock, sleep=clock.sleep)
    assert rep.ok and 30 <= rep.elapsed_s <= 45
    assert any("decode ready: HTTP 503" in ln for ln in lines)
    assert any("all checks pass" in ln for ln in lines)


def test_wait_times_out_and_catches_crash_during_settle() -> None:
    d = dep()
    clock = Clock()
    never = healthy_table(d)
    never[(d.roles[0].port, "/ready")] = Resp(503)
    rep = wait_healthy(http_from(never), d, lambda: running(d), timeout_s=20, poll_s=3,
                       baseline_restarts={}, clock=clock, sleep=clock.sleep)
    assert not rep.ok and 20 <= rep.elapsed_s < 24
    # healthy at first, then the decode process dies during the confirmation wait
    clock = Clock()
    u = d.roles[1].unit

    def states() -> dict[str, UnitState]:
        if clock.t > 0:
            return running(d, **{u: UnitState(u, "activating", "auto-restart", 0, 0, "exit-code",
                                               "loaded")})
        return running(d)

    rep = wait_healthy(http_from(healthy_table(d)), d, states, timeout_s=60, poll_s=1,
                       baseline_restarts={}, clock=clock, sleep=clock.sleep, settle_s=2)
    assert not rep.ok and "crashed" in rep.summary()


def test_stability_window_catches_a_crash_after_healthy() -> None:
    """Issue 20 #2: a unit that restarts 3 s after the checks passed fails the window; a stable
    deployment passes it after the whole window, not before."""
    d = dep()
    u = d.roles[1].unit
    clock = Clock()

    def states() -> dict[str, UnitState]:
        if clock.t >= 3:
            return running(d, **{u: UnitState(u, "active", "running", 101, 1, "success",
                                               "loaded")})
        return running(d)

    rep = watch_stable(http_from(healthy_table(d)), d, states, window_s=180, poll_s=1,
                       baseline_restarts={}, clock=clock, sleep=clock.sleep)
    assert not rep.ok and "crashed" in rep.summary() and 3 <= rep.elapsed_s < 5
    clock = Clock()
    rep = watch_stable(http_from(healthy_table(d)), d, lambda: running(d), window_s=10, poll_s=3,
                       baseline_restarts={}, clock=clock, sleep=clock.sleep)
    assert rep.ok and rep.elapsed_s >= 10


def test_default_stability_window_is_the_routers_own_detection_time() -> None:
    from orchestrator.catalog import load_catalog
    from orchestrator.profile.schema import Health

    rules = load_catalog().router("sglang-router", "0.3.2")
    assert default_stability_window_s(rules.defaults) == 60 * 3  # interval x failure threshold
    assert Health().stability_window_s is None
    with pytest.raises(ValueError, match="stability_window_s"):
        Health(stability_window_s=-1)


@pytest.mark.parametrize("resp,ok,text", [
    (Resp(200, json.dumps({"choices": [{"message": {"content": "ready"}}],
                           "usage": {"completion_tokens": 1}}).encode()), True, "1 tokens"),
    (Resp(200, json.dumps({"choices": [{"message": {"content": ""}}],
                           "usage": {"completion_tokens": 0}}).encode()), False, "empty"),
    (Resp(500, b"boom"), False, "HTTP 500"),
    (Resp(200, b"{}"), False, "malformed"),
])
def test_smoke_generation(resp: Resp, ok: bool, text: str) -> None:
    d = dep()
    calls: list[tuple[int, str, Any]] = []

    def http(method: str, port: int, path: str, body: Any = None, **kw: Any) -> Resp:
        calls.append((port, path, body))
        return resp

    res = smoke_generate(http, d, "say ready", 8)
    assert res.ok is ok and text in res.message
    assert calls[0][:2] == (8000, "/v1/chat/completions")  # through the router
    assert calls[0][2]["model"] == d.served_name and calls[0][2]["max_tokens"] == 8
    colocated = dep("colocated")
    smoke_generate(http, colocated, "x", 1)
    assert calls[-1][0] == colocated.roles[0].port  # no router: the engine itself


def test_server_info_drift() -> None:
    from orchestrator.apply.status import _server_info_drift
    from orchestrator.render.argv import engine_argv

    d = dep()
    role = d.roles[1]
    argv = engine_argv(d, role)
    same = {"served_model_name": d.served_name, "model_path": d.model_path, "tp_size": role.tp,
            "port": role.port, "launch_command": shlex.join(["sglang", "serve", *argv])}
    assert _server_info_drift(role, d, same) == []
    drifted = {**same, "tp_size": 8,
               "launch_command": shlex.join(["python", "-m", "sglang.launch_server", *argv,
                                             "--disable-radix-cache"])}
    out = _server_info_drift(role, d, drifted)
    assert out[0] == "decode: tp_size is 8, the profile says 4"
    assert out[1] == ("decode: running command line differs from the release (only running: "
                      "['--disable-radix-cache']; only in release: -)")


def test_the_stability_window_says_what_ctrl_c_does_and_how_far_it_is() -> None:
    """A 180 s window printed nothing for three minutes, and Ctrl-C in it rolled back without
    saying so first."""
    d = dep()
    said: list[str] = []
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    rep = watch_stable(http_from(healthy_table(d)), d, lambda: running(d), window_s=180,
                       poll_s=5, baseline_restarts={}, progress=said.append,
                       clock=lambda: now[0], sleep=sleep,
                       interrupt_note="Ctrl-C now rolls back to the last healthy release")
    assert rep.ok
    assert "Ctrl-C now rolls back" in said[0]
    beats = [s for s in said[1:] if "all checks pass" in s]
    assert len(beats) == 5 and "30s of 180s" in beats[0]  # 30, 60, ..., 150
