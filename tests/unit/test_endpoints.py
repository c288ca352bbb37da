"""Where clients connect (the symptom: apply ended with `Apply complete: r0002-... is healthy.`
and no endpoint; `mxfp4-tp8.yaml` served on 127.0.0.1:30000 and nothing said it was
loopback-only; the default router listened on 0.0.0.0:8000 without a key, unsaid; it now
listens on loopback unless the profile says otherwise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    lines = endpoint_lines(endpoints(dep, "gpu-host.internal"))
    assert lines[1] == ("  http://127.0.0.1:8000/v1  (router; loopback only (from the host "
                        "itself); no API key)")


def test_a_router_on_every_interface_is_reached_at_the_host_address(tmp_path: Path) -> None:
    prof = yaml.safe_load((PROFILES / "default.yaml").read_text())
    prof["topology"]["router"]["host"] = "0.0.0.0"
    prof["acknowledge"] = [{"id": "exposure.all-interfaces", "reason": "a firewall in front"}]
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    dep = plan_from_paths(tmp_path / "p.yaml").deployment
    lines = endpoint_lines(endpoints(dep, "gpu-host.internal"))
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


# -- a fleet: the router (its front door) first, then each engine host's engines, each named with
# its host (before: an engine host's engine said it was client-facing, "(engine; ...)", and the end
# of a fleet run and `status -p FLEET` named no endpoint at all) --------------------------------

FLEET_ROUTER = "  http://10.0.1.10:8000/v1  (router on router-1; one host address; no API key)"


def _fleet_engine(host: str, addr: str, port: int = 30000) -> str:
    return (f"  http://{addr}:{port}/v1  (engine on {host}, behind the router; one host address; "
            "no API key)")


FLEET_LINES = ["Endpoints:", FLEET_ROUTER, _fleet_engine("gpu-a", "10.0.1.11"),
               _fleet_engine("gpu-b", "10.0.1.12"), _fleet_engine("gpu-c", "10.0.1.13")]


def _fleet() -> tuple[Any, dict[str, Any]]:
    from orchestrator.planner.fleet import load_fleet, plan_fleet

    fctx = load_fleet(PROFILES / "fleet-3x.yaml", INVENTORY)
    return plan_fleet(fctx), dict(fctx.all_hosts)


def test_a_fleet_engine_is_behind_the_router_on_another_host() -> None:
    fleet, hosts = _fleet()
    [e] = endpoints(fleet.plan("gpu-a").deployment, hosts["gpu-a"].address)
    assert f"  {e.line()}" == _fleet_engine("gpu-a", "10.0.1.11")
    assert (e.host, e.client_facing) == ("gpu-a", False)
