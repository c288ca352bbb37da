"""Putting a host back into the router after its switch (issue 23): a host that went away during
its switch (its SSH connection lost: sshd or the machine died) is left out of the router at once,
instead of the router being asked to add engines nobody can verify and waiting 60 s for them
(measured before: a host killed mid-wave stopped the rollout ~67 s after its death)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.apply.fleet_ops import FleetOps
from orchestrator.errors import RemoteError
from orchestrator.planner.targets import resolve_targets


class Remote:
    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def close(self) -> None:
        pass


def ops_with(remote: Remote) -> FleetOps:
    ops = FleetOps(resolve_targets("flash", ["gpu-a", "gpu-b"], None, None),
                   {"gpu-a": SimpleNamespace(install_root="/srv/dsv4")},
                   out=lambda _s: None, command="dsv4ctl apply", connect=lambda n, h: remote)
    ops.router_up = True
    ops.remote("gpu-a")  # connected at prepare, as the rollout does
    return ops


def test_host_lost_during_its_switch_is_left_out_of_the_router(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    ops = ops_with(Remote(alive=False))
    asked: list[Any] = []
    monkeypatch.setattr(ops, "router", lambda: asked.append("router"))
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as exc:
        ops.restore("gpu-a")
    assert time.monotonic() - t0 < 1.0
    assert not asked, "the router must not be asked to add a host that cannot be reached"
    assert "host 'gpu-a' cannot be reached" in exc.value.message
    assert "left out of the router" in exc.value.message
    assert "dsv4ctl status --host gpu-a" in (exc.value.fix or "")


def test_reachable_host_goes_back_into_the_router(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = ops_with(Remote(alive=True))
    asked: list[Any] = []

    def router() -> Any:
        asked.append("router")
        raise RemoteError("router asked")

    monkeypatch.setattr(ops, "router", router)
    with pytest.raises(RemoteError, match="router asked"):
        ops.restore("gpu-a")
    assert asked == ["router"]
