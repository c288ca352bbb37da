"""The target resolver's refusals (issue 23, 30): a host not in the fleet, a group with hosts
outside it, and a RELEASE without --host (release ids differ from host to host), are refused with
the reason and the fix before any host is touched — no connection, no fleet lock. What ``--host``
selects (a member, a group) and where the driver drains. The runs themselves are on the harness
hosts (tests/integration/test_fleet_rollout.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import orchestrator.apply.fleet_ops as fleet_ops
from orchestrator.apply.fleet_rollback import rollback_fleet
from orchestrator.apply.rollout import Strategy
from orchestrator.errors import DsvError, ExitCode
from orchestrator.planner.targets import one_host, resolve_targets

HOSTS = {h: SimpleNamespace(install_root="/srv/dsv4") for h in ("gpu-a", "gpu-b", "router-1")}
GROUPS = {"fleet": ["gpu-a", "gpu-b"], "left": ["gpu-a"], "other": ["gpu-a", "gpu-x"]}


def targets(selector: str | None = None) -> Any:
    return resolve_targets("flash", ["gpu-a", "gpu-b"], "router-1", "router-1",
                           selector=selector, groups=GROUPS)


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    touched: list[str] = []

    def lock(self: Any) -> None:
        touched.append("fleet lock")

    monkeypatch.setattr(fleet_ops.FleetOps, "lock_fleet", lock)
    monkeypatch.setattr(fleet_ops.FleetOps, "remote", lambda self, h: touched.append(h))
    return touched


def test_unknown_host_is_refused() -> None:
    with pytest.raises(DsvError) as exc:
        targets("gpu-z")
    assert exc.value.exit_code == ExitCode.ERROR
    assert "host 'gpu-z' is not a host of fleet flash" in exc.value.message
    assert "gpu-a, gpu-b, router-1" in exc.value.message and "--host" in (exc.value.fix or "")
    assert "inventory groups: fleet, left, other" in exc.value.message


def test_group_with_a_host_outside_the_fleet_is_refused() -> None:
    with pytest.raises(DsvError) as exc:
        targets("other")
    assert "group 'other' has host(s) gpu-x that are not hosts of fleet flash" in \
        exc.value.message


def test_release_without_host_is_refused(no_ssh: list[str]) -> None:
    with pytest.raises(DsvError) as exc:
        rollback_fleet(targets(), HOSTS, {}, Strategy(), out=lambda _s: None, command="x",
                       release="r0001-20261201T180115Z-4d2f3dd8")
    assert "no --host was given" in exc.value.message and "--host NAME" in (exc.value.fix or "")
    with pytest.raises(DsvError) as exc:
        rollback_fleet(targets("fleet"), HOSTS, {}, Strategy(), out=lambda _s: None,
                       command="x", release="r0001-20261201T180115Z-4d2f3dd8")
    assert "--host selects 2 hosts (gpu-a, gpu-b)" in exc.value.message
    assert not no_ssh


def test_what_host_selects() -> None:
    whole = targets()
    assert whole.moved == ["gpu-a", "gpu-b", "router-1"] and whole.drain
    assert whole.lock_on == "router-1" and whole.fleet_lock == ".dsv4ctl-fleet-flash.lock"
    member = targets("gpu-b")
    assert member.moved == ["gpu-b"] and member.engines == ("gpu-b",) and member.drain
    assert member.router_host is None and member.selected == ("gpu-b",)
    group = targets("left")
    assert group.moved == ["gpu-a"] and group.selected == ("gpu-a",)
    assert targets("router-1").moved == ["router-1"]


def test_the_fleet_of_one_drains_nothing() -> None:
    """A host carrying its own router is fronted by nobody else: no drain; a router on another
    host (or fronting several) drains."""
    assert not one_host("h", "p", router=True).drain
    assert not one_host("h", "p").drain and one_host("h").fleet_lock is None
    # the fleet of one has its fleet lock too (taken with its host lock: test_fleet_lock.py)
    assert one_host("h", "p").fleet_lock == ".dsv4ctl-fleet-p.lock"
    assert one_host("h", "p", router=True).single
    assert resolve_targets("p", ["gpu-a"], "router-1", "router-1").drain
    assert resolve_targets("p", ["gpu-a", "gpu-b"], "gpu-a", None).drain
