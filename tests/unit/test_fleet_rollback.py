"""Fleet rollback's refusals (issue 23): a host not in the fleet, and a RELEASE without --host
(release ids differ from host to host), are refused with the reason and the fix before any host
is touched — no connection, no fleet lock. The rollback itself runs on the harness hosts
(tests/integration/test_fleet_rollout.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import orchestrator.apply.fleet_ops as fleet_ops
from orchestrator.apply.fleet_rollback import rollback_fleet
from orchestrator.apply.rollout import Strategy
from orchestrator.errors import DsvError, ExitCode

FLEET = SimpleNamespace(router_on="router-1", hosts=["gpu-a", "gpu-b"], profile_name="flash",
                        router_only_host="router-1", plan=lambda h: None)
HOSTS = {h: SimpleNamespace(install_root="/srv/dsv4") for h in ("gpu-a", "gpu-b", "router-1")}


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    touched: list[str] = []

    def lock(self: Any) -> None:
        touched.append("fleet lock")

    monkeypatch.setattr(fleet_ops.FleetOps, "lock_fleet", lock)
    return touched


def test_unknown_host_is_refused(no_ssh: list[str]) -> None:
    with pytest.raises(DsvError) as exc:
        rollback_fleet(FLEET, HOSTS, Strategy(), out=lambda _s: None, command="x", only="gpu-z")
    assert exc.value.exit_code == ExitCode.ERROR
    assert "host 'gpu-z' is not a host of fleet flash" in exc.value.message
    assert "gpu-a, gpu-b, router-1" in exc.value.message and "--host" in (exc.value.fix or "")
    assert not no_ssh


def test_release_without_host_is_refused(no_ssh: list[str]) -> None:
    with pytest.raises(DsvError) as exc:
        rollback_fleet(FLEET, HOSTS, Strategy(), out=lambda _s: None, command="x",
                       release="r0001-20261201T180115Z-4d2f3dd8")
    assert "no --host was given" in exc.value.message and "--host NAME" in (exc.value.fix or "")
    assert not no_ssh
