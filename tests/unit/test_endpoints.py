"""Where clients connect (the symptom: apply ended with `Apply complete: r0002-... is healthy.`
and no endpoint; `mxfp4-tp8.yaml` served on 127.0.0.1:30000 and nothing said it was
loopback-only; the default router listened on 0.0.0.0:8000 without a key, unsaid; it now
listens on loopback unless the profile says otherwise)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
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


@contextlib.contextmanager
def _format(fmt: str) -> Iterator[None]:
    """``--format`` as the CLI sets it (text lines go to stderr under json): the contextvar
    another test's `main([... "--format", "json"])` may have left set."""
    from orchestrator.cli.output import FORMAT

    token = FORMAT.set(fmt)
    try:
        yield
    finally:
        FORMAT.reset(token)


def _ended_run(verb: str, fmt: str, capsys: pytest.CaptureFixture[str], *,
               served: bool = False) -> tuple[int, str]:
    """The end of a fleet run whose every host moved, as `finish` prints it. ``served``: gpu-b's
    result carries the endpoints of the release it went to (its engine on another port than the
    profile's, as a rollback's target may), the other hosts' none (as a host with no changes);
    else no host's result carries any (each host's from its plan)."""
    from orchestrator.apply.fleet_ops import FleetOps, targets_of
    from orchestrator.apply.rollout import HostOutcome, RolloutResult
    from orchestrator.cli.fleet_cmd import finish

    fleet, hosts = _fleet()
    t = targets_of(fleet)
    ops = FleetOps(t, hosts, {p.host: p for p in fleet.plans}, out=lambda _s: None,
                   command="dsv4ctl apply fleet-3x.yaml")
    if served:
        from orchestrator.apply.executor import Result

        [b] = endpoints(fleet.plan("gpu-b").deployment, hosts["gpu-b"].address)
        ops.results = {"gpu-b": Result("r2", "healthy", "ok", endpoints=[
            replace(b, url=b.url.replace(":30000", ":30001"))])}
    result = RolloutResult(waves=[[h] for h in t.moved], outcomes={
        h: HostOutcome(h, i, "moved") for i, h in enumerate(t.moved)})
    capsys.readouterr()
    with _format(fmt):
        rc = finish(result, ops, "router-1:/srv/dsv4/fleet/fleet-3x/00000001.json",
                    what="rollout of fleet-3x", verb=verb)
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("verb", ["Apply", "Rollback"])
def test_a_fleet_run_ends_with_the_router_then_every_engine_host(
        verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _ended_run(verb, "text", capsys)
    lines = out.rstrip("\n").splitlines()
    assert rc == 0 and lines[-6].startswith(f"{'Rollout' if verb == 'Apply' else 'Rollback'} "
                                            "complete"), out
    assert lines[-5:] == FLEET_LINES, out


def test_a_host_the_run_moved_shows_the_release_it_serves(
        capsys: pytest.CaptureFixture[str]) -> None:
    _, out = _ended_run("Rollback", "text", capsys, served=True)
    want = [*FLEET_LINES]
    want[3] = _fleet_engine("gpu-b", "10.0.1.12", 30001)  # not the profile's 30000
    assert out.rstrip("\n").splitlines()[-5:] == want, out


def test_a_fleet_run_json_document_carries_the_endpoints(
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    rc, out = _ended_run("Apply", "json", capsys, served=True)
    doc = json.loads(out)
    assert rc == 0 and doc["ok"]
    assert [(e["name"], e["host"], e["url"], e["exposure"], e["client_facing"])
            for e in doc["endpoints"]] == [
        ("router", "router-1", "http://10.0.1.10:8000/v1", "host", True),
        ("engine", "gpu-a", "http://10.0.1.11:30000/v1", "host", False),
        ("engine", "gpu-b", "http://10.0.1.12:30001/v1", "host", False),
        ("engine", "gpu-c", "http://10.0.1.13:30000/v1", "host", False)]


def test_fleet_status_ends_with_every_hosts_endpoints(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`status -p FLEET`: each host's endpoints from its own status (its current release), the
    router's first; a host whose status failed has none to show. The router's worker API and the
    fleet lock's host do not answer here (no SSH): the status says so and goes on."""
    import json

    import orchestrator.apply.status as status_mod
    import orchestrator.remote.connection as connection
    from orchestrator.apply.status import StatusReport
    from orchestrator.cli.fleet_cmd import fleet_status
    from orchestrator.errors import DsvError, RemoteError

    fleet, hosts = _fleet()

    def status(name: str, host: Any) -> StatusReport:
        if name == "gpu-c":
            raise DsvError("host 'gpu-c' cannot be reached")
        rep = StatusReport(host=name, current="r1", current_status="healthy", locked_by=None)
        rep.endpoints = endpoints(fleet.plan(name).deployment, host.address)
        return rep

    def unreachable(name: str, host: Any) -> Any:
        raise RemoteError(f"host {name!r} cannot be reached")

    monkeypatch.setattr(status_mod, "status", status)
    monkeypatch.setattr(connection, "connect", unreachable)
    capsys.readouterr()
    with _format("text"):
        assert fleet_status(fleet, hosts, "text") == 1  # the router does not answer
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert lines[-4:] == [*FLEET_LINES[:3], _fleet_engine("gpu-b", "10.0.1.12")], lines
    with _format("json"):
        assert fleet_status(fleet, hosts, "json") == 1
    st = json.loads(capsys.readouterr().out)
    assert [(e["host"], e["url"]) for e in st["endpoints"]] == [
        ("router-1", "http://10.0.1.10:8000/v1"), ("gpu-a", "http://10.0.1.11:30000/v1"),
        ("gpu-b", "http://10.0.1.12:30000/v1")]


def test_a_stopped_fleet_run_names_the_journals_to_read_not_a_placeholder_host(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The stop's fix said `dsv4ctl history --host NAME`: run as printed (completed with the
    run's -p and -i), a host no fleet has. It names the host that was rolled back."""
    from orchestrator.apply.fleet_ops import FleetOps, targets_of
    from orchestrator.apply.rollout import HostOutcome, RolloutResult, RolloutStopped
    from orchestrator.cli.fleet_cmd import finish

    fleet, hosts = _fleet()
    t = targets_of(fleet)
    ops = FleetOps(t, hosts, {p.host: p for p in fleet.plans}, out=lambda _s: None,
                   command="dsv4ctl apply fleet-3x.yaml")
    states = {"gpu-a": "moved", "gpu-b": "rolled_back"}
    result = RolloutResult(waves=[[h] for h in t.moved], stopped_after=1, reason="gpu-b failed",
                           outcomes={h: HostOutcome(h, i, states.get(h, "not_reached"))
                                     for i, h in enumerate(t.moved)})
    with _format("text"), pytest.raises(RolloutStopped) as stop:
        finish(result, ops, None, what="rollout of fleet-3x", verb="Apply")
    capsys.readouterr()
    assert "`dsv4ctl history --host gpu-b`" in (stop.value.fix or ""), stop.value.fix
    assert "NAME" not in (stop.value.fix or "")
