"""The fleet at a glance: `status -p FLEET`, `history -p FLEET` and where clients connect.

Owns what the fleet's status reads (each host's own status in parallel, the router's view of its
engines, the fleet lock's holder, the last run's journal, every host's endpoints), the fleet's
history (every run's journal in order), and which release's endpoints each host shows at the end
of a fleet run (:func:`run_endpoints`). Split from :mod:`.fleet_ops`, the driver, which it reads
through (connections, the router's client) without changing anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.apply.fleet_journal import read_journals
from orchestrator.apply.fleet_ops import FleetOps, targets_of
from orchestrator.errors import DsvError
from orchestrator.planner.targets import fleet_lock_name
from orchestrator.planner_model import FleetPlan
from orchestrator.profile.inventory import Host


def fleet_status(fleet: FleetPlan, hosts: dict[str, Host], *, status: Callable[[str, Host], Any],
                 command: str = "dsv4ctl status",
                 connect: Callable[[str, Host], Any] | None = None) -> dict[str, Any]:
    """The fleet at a glance: per host its current release, health (``status``: the single-host
    status of :func:`orchestrator.apply.status`, run in parallel), host lock holder and router
    membership (each of its engines listed healthy by the router); the last rollout's (or fleet
    rollback's) journal, and the holder of the fleet lock when one is running now."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.remote.lock import is_locked, read_holder
    from orchestrator.remote.router_api import RouterApiError

    names = list(fleet.hosts) + ([fleet.router_only_host] if fleet.router_only_host else [])
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(names)))) as pool:
        reports = dict(zip(names, pool.map(lambda n: _safe_status(status, n, hosts[n]), names),
                           strict=True))
    ops = FleetOps(targets_of(fleet), hosts, {p.host: p for p in fleet.plans},
                   out=lambda _s: None, command=command, connect=connect)
    listed: dict[str, bool] | None = None
    last: dict[str, Any] | None = None
    running: str | None = None  # the fleet lock's holder: a rollout or rollback in progress
    try:
        try:
            workers = {w.url: w.is_healthy for w in ops.router().workers()}
            listed = {h: all(workers.get(u, False) for u, *_ in ops._workers(h))
                      for h in fleet.hosts}
        except (RouterApiError, DsvError):
            listed = None
        on = fleet.router_on or fleet.hosts[0]
        name = fleet_lock_name(fleet.profile_name)
        if is_locked(ops.remote(on), hosts[on].install_root, name):  # a rollout running now
            h = read_holder(ops.remote(on), hosts[on].install_root, name)
            running = h.describe() if h else "unknown holder"
        found = read_journals(ops.remote(on), hosts[on].install_root, fleet.profile_name,
                              last=True)
        last = found[-1] if found else None
    except DsvError:
        pass
    finally:
        ops.close()
    rows = []
    for n in names:
        rep = reports[n]
        rows.append({
            "host": n, "role": "router" if n == fleet.router_only_host else "engine",
            "current": getattr(rep, "current", None),
            "current_status": getattr(rep, "current_status", None),
            "healthy": bool(getattr(rep, "healthy", False)),
            "locked_by": getattr(rep, "locked_by", None),
            "in_router": None if listed is None or n not in listed else listed[n],
            "error": rep if isinstance(rep, str) else None,
        })
    from orchestrator.planner.endpoints import fleet_endpoints

    # each host's from its current release (a host whose status failed has none to show)
    eps = fleet_endpoints(getattr(reports[n], "endpoints", []) for n in names)
    return {"profile": fleet.profile_name, "router_on": fleet.router_on, "hosts": rows,
            "router_answers": listed is not None, "last_rollout": last,
            "in_progress": running, "endpoints": eps}


def run_endpoints(ops: FleetOps) -> list[Any]:
    """Where clients connect at the end of a fleet run (planner.endpoints.Endpoint, the router
    first): a host the run left healthy on a release, that release's (its result's: a rollback's
    target may listen elsewhere than the profile says); any other host its plan's: what an
    unchanged host serves, and what the profile gives a host outside a ``--host`` selection."""
    from orchestrator.planner.endpoints import endpoints, fleet_endpoints

    def of(host: str) -> list[Any]:
        res = ops.results.get(host)
        if res is not None and res.endpoints:
            return list(res.endpoints)
        plan = ops.plans.get(host)
        return endpoints(plan.deployment, ops.hosts[host].address) if plan is not None else []

    return fleet_endpoints(of(h) for h in ops.targets.fleet_hosts)


def _safe_status(status: Callable[[str, Host], Any], name: str, host: Host) -> Any:
    try:
        return status(name, host)
    except DsvError as exc:
        return exc.message


def fleet_history(fleet: FleetPlan, hosts: dict[str, Host], *,
                  command: str = "dsv4ctl history") -> list[dict[str, Any]]:
    """Every run of the fleet's profile, in the order they ran: the fleet's journals on its
    lock host (each host's own releases: ``history --host NAME``)."""
    targets = targets_of(fleet)
    ops = FleetOps(targets, hosts, out=lambda _s: None, command=command)
    try:
        on = targets.lock_on
        return read_journals(ops.remote(on), hosts[on].install_root, fleet.profile_name)
    finally:
        ops.close()
