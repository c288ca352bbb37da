"""`dsv4ctl status` of one host: its current release, each role's health, and drift.

Owns the report (:class:`StatusReport`): the release ``current`` points at and its record's
status, the lock holder, each role's unit as systemd sees it and its health (the same checks the
apply's wait-for-health runs), the kernels each engine loaded, and drift: the release's files
against its manifest (read and verified by :class:`~orchestrator.release.store.ReleaseStore`),
the secrets file and the installed units against the release's, the engine's own view of its
flags and its KV pool against the plan's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from orchestrator.profile.inventory import Host


@dataclass
class StatusReport:
    host: str
    current: str | None
    current_status: str | None
    locked_by: str | None
    roles: list[tuple[str, bool, str]] = field(default_factory=list)  # (role, ok, message)
    file_drift: list[str] = field(default_factory=list)
    profile_drift: list[str] = field(default_factory=list)
    pool_drift: list[str] = field(default_factory=list)  # live KV pool vs the plan's (issue 22)
    deployment: str | None = None  # the current release's deployment name
    metrics: list[Any] = field(default_factory=list)  # ReleaseMetrics from the host's records
    # what systemd says about each role's unit right now: role, unit, active/sub state, main pid,
    # restarts (NRestarts), so `status` can be checked against the host (issue 20)
    units: list[dict[str, Any]] = field(default_factory=list)
    # where clients connect: URL, exposure, key (planner/endpoints.py), from the current release
    endpoints: list[Any] = field(default_factory=list)  # planner.endpoints.Endpoint

    def roles_healthy(self) -> dict[str, dict[str, bool]]:
        """deployment -> role -> healthy just now, for ``selfmetrics.status_text``."""
        if self.deployment is None:
            return {}
        return {self.deployment: {role: ok for role, ok, _ in self.roles}}

    @property
    def healthy(self) -> bool:
        return self.current is not None and all(ok for _, ok, _ in self.roles)


def _server_info_drift(role: Any, dep: Any, info: dict[str, Any]) -> list[str]:
    """Differences between what the profile resolved to and what the engine says it runs."""
    from orchestrator.render.secrets import command_line_difference

    out = []
    for key, want in (("served_model_name", dep.served_name), ("model_path", dep.model_path),
                      ("tp_size", role.tp), ("port", role.port)):
        have = info.get(key)
        if have is not None and str(have) != str(want):
            out.append(f"{role.name}: {key} is {have!r}, the profile says {want!r}")
    launch = info.get("launch_command")
    if isinstance(launch, str):
        # the one comparison `plan --live` makes too (render.secrets)
        how = command_line_difference(dep, role, shlex.split(launch))
        if how:
            out.append(f"{role.name}: running command line differs from the release ({how})")
    return out


def status(host_name: str, host: Host) -> StatusReport:
    from orchestrator.apply.context import engine_client, load_release, role_units
    from orchestrator.apply.kernels_seen import loaded_by_pid
    from orchestrator.apply.metrics import release_metrics
    from orchestrator.health import evaluate
    from orchestrator.release.store import ReleaseStore
    from orchestrator.remote.connection import connect
    from orchestrator.remote.lock import is_locked, read_holder
    from orchestrator.remote.systemd import ServiceManager

    with connect(host_name, host) as remote:
        store = ReleaseStore(remote, host.install_root)
        current = store.current()
        rep = StatusReport(host=host_name, current=current, current_status=None, locked_by=None)
        if is_locked(remote, host.install_root):
            h = read_holder(remote, host.install_root)
            rep.locked_by = h.describe() if h else "unknown holder"
        records = store.read_records()
        rep.metrics = release_metrics(records, current)
        if current is None:
            return rep
        record = next((r for r in records if r.id == current), None)
        rep.current_status = record.status if record else store.read_record(current).status
        if rep.current_status == "applying" and rep.locked_by is None:
            rep.current_status = "interrupted"  # its run was lost (see `history`)
        _, dep, prof = load_release(store, current)
        rep.deployment = dep.name
        from orchestrator.planner.endpoints import endpoints

        rep.endpoints = endpoints(dep, host.address)
        svc = ServiceManager(remote, host.scope)
        units = role_units(dep)
        # the key from the host's secrets file: the controller need not have it
        http = engine_client(remote, dep, lambda name: store.read_secret(dep.name, name))
        states = svc.show(list(units.values()))
        for role, unit in units.items():
            st = states.get(unit)
            rep.units.append({"role": role, "unit": unit,
                              "active": f"{st.active}/{st.sub}" if st else "unknown",
                              "pid": st.main_pid if st else 0,
                              "restarts": st.restarts if st else 0})
        if dep.kernels_enabled:
            engines = {r.name for r in dep.roles}
            seen = loaded_by_pid(remote, store, dep.install_root,
                                 {u["role"]: u["pid"] for u in rep.units if u["role"] in engines})
            for u in rep.units:
                if u["role"] in seen:
                    u["kernels"] = seen[u["role"]]
        report = evaluate(http, dep, states, {})
        by_role: dict[str, list[Any]] = {}
        for r in report.results:
            by_role.setdefault(r.subject, []).append(r)
        for role, results in by_role.items():
            bad = [r for r in results if not r.ok]
            rep.roles.append((role, not bad, "; ".join(f"{r.check}: {r.message}" for r in bad)
                              or "ready, healthy, serving " + dep.served_name))
        rep.roles = _through_router(rep.roles, http, dep, prof)
        # files: the release tree against its manifest (someone edited a launch script?)
        rep.file_drift += store.verify_files(current)
        # the secrets file the units read against current's own (the switch copies it)
        secrets = store.secrets_drift(dep.name, current, bool(dep.secret_names))
        if secrets:
            rep.file_drift.append(secrets)
        # installed unit files against the release's
        for unit in units.values():
            res = remote.run(f"cmp -s {shlex.quote(store.path(current, 'units', unit))} "
                             f"{_unit_file(host.scope, unit)}", timeout=30)
            if not res.ok:
                rep.file_drift.append(f"installed unit {unit} differs from the release's")
        for role in dep.roles:
            try:
                resp = http("GET", role.port, "/server_info", timeout=10)
                info = resp.json() if resp.status == 200 else None
            except (OSError, ValueError):
                info = None
            if isinstance(info, dict):
                rep.profile_drift += _server_info_drift(role, dep, info)
                rep.pool_drift += _pool_drift(role.name, info, record)
    return rep


def _through_router(roles: list[tuple[str, bool, str]], http: Any, dep: Any, profile: Any
                    ) -> list[tuple[str, bool, str]]:
    """A role behind this host's router counts healthy only if a generation through the router
    works: every role can answer its own health checks while the router refuses to route to
    them (sglang-router 0.3.2 keeps a worker's circuit open 60 s after 10 failures: "No
    available prefill workers (all circuits open or unhealthy)"). One generation with the
    profile's smoke prompt, only when every role passed its own checks."""
    from orchestrator.health import smoke_generate

    if dep.router is None or not roles or not all(ok for _, ok, _ in roles):
        return roles
    res = smoke_generate(http, dep, profile.health.smoke_prompt, profile.health.smoke_max_tokens,
                         timeout=30)
    if res.ok:
        return roles
    why = f"generation through the router fails: {res.message}"
    return [(role, False, f"{msg}, but {why}") for role, _, msg in roles]


def _pool_drift(role: str, info: dict[str, Any], record: Any) -> list[str]:
    """The live pool (``/server_info``) against the pool the applied plan predicted."""
    from orchestrator.calibration import POOL_DRIFT_THRESHOLD, drift, server_info_pool

    live, _ = server_info_pool(info)
    planned = next((m for m in (record.pool if record else []) if m.role == role), None)
    if live is None or planned is None:
        return []
    d = drift(live, planned.predicted_tokens)
    if abs(d) <= POOL_DRIFT_THRESHOLD:
        return []
    return [f"{role}: the engine's KV pool is {live:,} tokens per rank, the plan predicted "
            f"{planned.predicted_tokens:,} ({d:+.1%}, threshold {POOL_DRIFT_THRESHOLD:.0%}); "
            "`dsv4ctl plan --live` now calibrates from the measurement"]


def _unit_file(scope: str, unit: str) -> str:
    from orchestrator.remote.systemd import unit_dir_expr

    return f"{unit_dir_expr(scope)}/{shlex.quote(unit)}"
