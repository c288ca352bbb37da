"""Where clients connect (the symptom: apply ended with `Apply complete: r0002-... is healthy.`
and no endpoint; `mxfp4-tp8.yaml` served on 127.0.0.1:30000 and nothing said it was
loopback-only; the default router listened on 0.0.0.0:8000 without a key, unsaid; it now
listens on loopback unless the profile says otherwise)."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.planner.endpoints import endpoint_lines, endpoints
from orchestrator.planner.fleet import plan_from_paths
from tests.validate.helpers import INVENTORY, PROFILES


def test_the_default_router_says_it_is_loopback_only() -> None:
    dep = plan_from_paths(PROFILES / "default.yaml").deployment
    router, *engines = endpoints(dep, "gpu-host.internal")
    assert (router.name, router.url, router.exposure, router.key) == (
        "router", "http://127.0.0.1:8000/v1", "loopback", None)
    assert all(e.exposure == "loopback" and not e.client_facing for e in engines)
    lines = endpoint_lines(dep, "gpu-host.internal")
    assert lines[1] == ("  http://127.0.0.1:8000/v1  (router; loopback only (from the host "
                        "itself); no API key)")


def test_a_router_on_every_interface_is_reached_at_the_host_address(tmp_path: Path) -> None:
    prof = yaml.safe_load((PROFILES / "default.yaml").read_text())
    prof["topology"]["router"]["host"] = "0.0.0.0"
    prof["acknowledge"] = [{"id": "exposure.all-interfaces", "reason": "a firewall in front"}]
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    dep = plan_from_paths(tmp_path / "p.yaml").deployment
    lines = endpoint_lines(dep, "gpu-host.internal")
    assert lines[1] == "  http://gpu-host.internal:8000/v1  (router; every interface; no API key)"


def test_a_colocated_engine_says_it_is_loopback_only() -> None:
    dep = plan_from_paths(PROFILES / "mxfp4-tp8.yaml").deployment
    [e] = endpoints(dep, "gpu-host.internal")
    assert e.url == "http://127.0.0.1:30000/v1" and e.client_facing
    assert "loopback only (from the host itself)" in e.line()


def test_a_key_is_named(tmp_path: Path) -> None:
    prof = yaml.safe_load((PROFILES / "default.yaml").read_text())
    prof["secrets"] = {"DSV4_SECRET_API_KEY": {"env": "MY_KEY"}}
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    dep = plan_from_paths(tmp_path / "p.yaml").deployment
    assert all(e.key == "DSV4_SECRET_API_KEY" for e in endpoints(dep, "h"))
    assert "API key required (DSV4_SECRET_API_KEY)" in endpoints(dep, "h")[0].line()
