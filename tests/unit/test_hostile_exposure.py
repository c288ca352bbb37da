"""Issue 31, Deliver 6: who can reach what the deployment listens on.

- ``classify_listen`` is the one owner of loopback / host address / every interface (status prints
  the same classification), compared as parsed addresses, not strings;
- an engine on every interface is an error unless acknowledged, then an acknowledged warning;
- any endpoint beyond loopback without an API key is a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.exposure import classify_listen
from orchestrator.paths import data_dir
from orchestrator.planner.build import plan_from_paths

PROFILES = data_dir("profiles")


@pytest.mark.parametrize(("address", "where"), [
    ("127.0.0.1", "loopback"), ("127.3.4.5", "loopback"), ("::1", "loopback"), ("[::1]", "loopback"),
    ("localhost", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("127.1", "loopback"),
    ("0.0.0.0", "all"), ("::", "all"), ("[::]", "all"), ("0", "all"), ("", "all"),
    ("::ffff:0.0.0.0", "all"), ("0:0:0:0:0:0:0:0", "all"), ("*", "all"),
    ("10.0.1.11", "host"), ("fe80::1%eth0", "host"), ("gpu-a.internal", "host"),
    ("2001:db8::1", "host"),
])
def test_a_listen_address_is_classified_as_parsed(address: str, where: str) -> None:
    assert classify_listen(address) == where


def _fleet_plan(tmp_path: Path, address: str, *, ack: bool = False, key: bool = False) -> Any:
    inv = yaml.safe_load((PROFILES / "inventory.yaml").read_text())
    inv["groups"]["fleet-3x"]["hosts"]["gpu-a"]["service_address"] = address
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inv))
    prof = yaml.safe_load((PROFILES / "fleet-3x.yaml").read_text())
    if ack:
        prof.setdefault("acknowledge", []).append(
            {"id": "exposure.all-interfaces", "reason": "nftables admits only the router"})
    if key:
        (tmp_path / "key").write_text("k" * 32)
        prof.setdefault("secrets", {})["DSV4_SECRET_API_KEY"] = {"file": str(tmp_path / "key")}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return plan_from_paths(path, host_override="gpu-a")


@pytest.mark.parametrize("address", ["0.0.0.0", "::"])
def test_an_engine_on_every_interface_is_an_error(tmp_path: Path, address: str) -> None:
    plan = _fleet_plan(tmp_path, address)
    bad = [c for c in plan.errors if c.id == "exposure.all-interfaces"]
    assert bad, [c.id for c in plan.checks]
    assert address in bad[0].message and "every interface" in bad[0].message
    assert "acknowledge exposure.all-interfaces" in (bad[0].fix or "")


def test_an_acknowledged_all_interfaces_binding_is_an_acknowledged_warning(tmp_path: Path) -> None:
    plan = _fleet_plan(tmp_path, "0.0.0.0", ack=True)
    assert not [c for c in plan.errors if c.id.startswith(("exposure.", "profile.ack"))]
    acked = [c for c in plan.checks if c.id == "exposure.all-interfaces"]
    assert acked and acked[0].acknowledged and acked[0].severity == "warning"


def test_beyond_loopback_without_a_key_is_a_warning_and_a_key_ends_it(tmp_path: Path) -> None:
    plan = _fleet_plan(tmp_path, "10.0.1.11")
    warn = [c for c in plan.checks if c.id == "exposure.no-key"]
    assert warn and all(c.severity == "warning" for c in warn)
    assert any("10.0.1.11" in c.message for c in warn)
    keyed = _fleet_plan(tmp_path, "10.0.1.11", key=True)
    assert not [c for c in keyed.checks if c.id == "exposure.no-key"]


def test_the_default_router_on_every_interface_without_a_key_is_reported() -> None:
    plan = plan_from_paths(PROFILES / "default.yaml")
    warn = [c for c in plan.checks if c.id == "exposure.no-key"]
    assert [c.subject for c in warn] == ["router"]
    assert "0.0.0.0:8000" in warn[0].message
