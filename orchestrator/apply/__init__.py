"""Apply, rollback, history, status and unlock: the library behind the host-changing commands.

Each function opens its own SSH connection (:mod:`orchestrator.remote`), works through the steps of
``playbooks/*.yaml`` (:mod:`.executor`, :mod:`.steps`) and returns a result for the CLI to print;
nothing here prints or exits. Only this package, the remote layer and ``dsv4ctl``'s command module
import fabric. An apply is :func:`prepare_apply` then its :class:`PreparedApply`'s switch; a fleet
(:mod:`.fleet_ops`) prepares every host before the first switch. Past ~400 lines: the seam, when
another engineer is not changing it, is status (with its drift and kernels readers) into its own
module.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import DsvError
from orchestrator.planner_model import Plan
from orchestrator.profile.inventory import Host
from orchestrator.release.record import rollback_target

Out = Callable[[str], None]


def _connect(host_name: str, host: Host) -> Any:
    from orchestrator.remote.connection import connect

    return connect(host_name, host)


def probe_for_apply(host_name: str, host: Host, model_path: str,
                    engine_env: str | None = None) -> tuple[Any, Any]:
    """(open connection, facts) for ``dsv4ctl apply PROFILE``: the probe's connection is kept for
    the apply that follows (one SSH handshake, not two: issue 20 #10). Pass it to
    :func:`apply_plan`, which closes it; close it yourself if you do not apply."""
    from orchestrator.remote.probes import collect_facts

    remote = _connect(host_name, host)
    try:
        return remote, collect_facts(remote, host_name, host, model_paths=[model_path],
                                     engine_env=engine_env)
    except BaseException:
        remote.close()
        raise


def apply_plan(plan: Plan, host_name: str, host: Host, *, out: Out, command: str,
               saved: bool, remote: Any = None) -> Any:
    """Apply ``plan`` to the host: :func:`prepare_apply`, then its switch. ``saved``: the plan
    came from a file, so it is checked for staleness against freshly probed facts (a plan made
    seconds ago in-process is not). ``remote``: an open connection to use (and close), e.g.
    from :func:`probe_for_apply`."""
    prepared = prepare_apply(plan, host_name, host, out=out, command=command, saved=saved,
                             remote=remote)
    return prepared.switch() if isinstance(prepared, PreparedApply) else prepared


@dataclass
class PreparedApply:
    """An apply whose release is on its host (uploaded, verified, kernels unpacked into
    ``releases/<id>/kernels/``) under the held host lock, nothing serving changed yet: the
    state between a fleet's parallel prepare phase and the host's wave (issue 23). Finish it
    with exactly one of :meth:`switch` or :meth:`cancel`; each closes the connection."""

    runner: Any
    ctx: Any
    profile: Any
    out: Out

    @property
    def release(self) -> str | None:
        return self.ctx.target

    def switch(self) -> Any:
        try:
            return self.runner.switch(self.ctx)
        finally:
            self._close()

    def cancel(self, why: str) -> Any:
        try:
            return self.runner.cancel(self.ctx, why)
        finally:
            self._close()

    def _close(self) -> None:
        try:
            _publish_metrics(self.ctx.remote, self.ctx.host, self.profile, self.out)
        finally:
            self.ctx.remote.close()


def prepare_apply(plan: Plan, host_name: str, host: Host, *, out: Out, command: str,
                  saved: bool, remote: Any = None) -> Any:
    """The prepare phase of :func:`apply_plan` (:meth:`.executor.Runner.prepare`): a
    :class:`PreparedApply`, or the apply's Result when it ended there (no changes, or a
    prepare step failed with nothing serving changed; the connection is then closed)."""
    from orchestrator.apply.context import Context, profile_from_plan
    from orchestrator.apply.executor import Runner

    try:
        if plan.host != host_name:
            raise DsvError(f"the plan is for host '{plan.host}', not '{host_name}'",
                           fix=f"apply it to its own host: --host {plan.host}")
        dep = plan.deployment
        if (dep.install_root, dep.scope) != (host.install_root, host.scope):
            raise DsvError(f"the plan targets {dep.install_root} (scope {dep.scope}) but the "
                           f"inventory now says {host.install_root} (scope {host.scope}) for host "
                           f"'{host_name}'", fix=f"re-plan: dsv4ctl plan --host {host_name} "
                                                 "--live -o PLAN.json")
        profile = profile_from_plan(plan)
        if saved:
            check_rederived(plan, profile, host_name, host)
    except BaseException:
        if remote is not None:
            remote.close()
        raise
    remote = remote if remote is not None else _connect(host_name, host)
    runner = Runner(out)
    done = True
    try:
        ctx = Context(remote=remote, host_name=host_name, host=host, out=out,
                      now=runner.now, command=command)
        ctx.plan, ctx.saved_plan = plan, saved
        ctx.deployment, ctx.profile = plan.deployment, profile
        res = runner.prepare(ctx)
        if res is not None:
            return res
        done = False
        return PreparedApply(runner, ctx, profile, out)
    finally:
        if done:
            try:
                _publish_metrics(remote, host, profile, out)
            finally:
                remote.close()


def secrets_would_restart(plan: Plan, host: Host, remote: Any) -> bool:
    """Whether applying ``plan`` would restart the running roles because a secret's value changed:
    the question preflight's ``secrets_restarts`` answers under the lock, asked here before the
    prompt (one round trip, only for a profile with secrets and a host with a release), because a
    plan never carries values and so cannot show it."""
    if not plan.deployment.secret_names or plan.current_release is None:
        return False
    from orchestrator.apply.context import profile_from_plan, resolve_secrets
    from orchestrator.apply.preflight import secrets_rotate, wanted_secrets_digest
    from orchestrator.release.store import ReleaseStore

    wanted = wanted_secrets_digest(resolve_secrets(profile_from_plan(plan)))
    return secrets_rotate(ReleaseStore(remote, host.install_root), plan.deployment.name, wanted)


def check_rederived(plan: Plan, profile: Any, host_name: str, host: Host) -> None:
    """A saved plan is input from a file, not a trusted value (issue 19): re-derive its deployment
    (unit names, ports, paths) and its release files from its own ``profile.yaml`` and the
    inventory, and refuse it as stale (exit 6) unless both match exactly. So a plan edited by hand
    (a unit named ``dsv4-x$(touch …).service``, a changed launch script) never reaches the host."""
    from orchestrator.errors import StalePlan
    from orchestrator.planner.build import PlanContext, resolve_deployment
    from orchestrator.render import render_release

    fix = f"re-plan: dsv4ctl plan --host {host_name} --live -o PLAN.json (never edit a saved plan)"
    from orchestrator.catalog import load_catalog
    from orchestrator.kernel_paths import with_planned_paths

    try:
        dep = resolve_deployment(PlanContext(profile, None, "", host_name, host, None))
        # the kernel paths were decided from the facts the plan was made with (a measurement
        # on the host; apply re-checks those facts by fingerprint): take them from the plan,
        # each checked to be one the catalog renders (no env of the plan's own reaches a file)
        dep = with_planned_paths(load_catalog().engine(dep.engine_name, dep.engine_version),
                                 dep, plan.deployment)
        tree = render_release(profile, dep)
    except DsvError as exc:
        raise StalePlan(f"saved plan is stale: its own profile no longer plans: {exc.message}",
                        fix=fix) from None
    if dep != plan.deployment:
        a, b = dep.model_dump(mode="json"), plan.deployment.model_dump(mode="json")
        fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        raise StalePlan("saved plan is stale: its deployment differs from the one its profile.yaml "
                        f"resolves to (fields: {', '.join(fields)})", fix=fix)
    import hashlib

    want = {p: (f.mode, f.sha256, tuple(f.roles)) for p, f in tree.files.items()}
    have = {f.path: (f.mode, None if f.content is None
                     else hashlib.sha256(f.content.encode("utf-8")).hexdigest(),
                     tuple(f.roles)) for f in plan.files if f.path != "manifest.json"}
    diff = sorted(p for p in want.keys() | have.keys() if want.get(p) != have.get(p))
    if diff:
        shown = ", ".join(repr(p) for p in diff[:5]) + (" ..." if len(diff) > 5 else "")
        raise StalePlan(f"saved plan is stale: its files differ from what its profile.yaml renders: "
                        f"{shown}", fix=fix)


def _publish_metrics(remote: Any, host: Host, profile: Any, out: Out) -> None:
    """After an apply or rollback, whatever its outcome: dsv4ctl's own metrics for the node
    exporter (issue 6), when ``monitoring.textfile_dir`` is set. Never raises (a warning line)."""
    if profile is None or profile.monitoring.textfile_dir is None:
        return
    from orchestrator.apply.metrics import publish_textfile
    from orchestrator.release.store import ReleaseStore

    path = publish_textfile(remote, ReleaseStore(remote, host.install_root),
                            str(profile.monitoring.textfile_dir), profile.name, out)
    if path:
        out(f"metrics textfile: {path}")


def rollback(host_name: str, host: Host, target: str | None, *, out: Out, command: str) -> Any:
    from orchestrator.apply.context import Context
    from orchestrator.apply.executor import Runner
    from orchestrator.release_ids import is_release_id

    remote = _connect(host_name, host)
    ctx: Any = None
    try:
        ctx = Context(remote=remote, host_name=host_name, host=host, out=out,
                      now=Runner(out).now, command=command)
        records = ctx.store.read_records()
        current = ctx.store.current()
        if target is None:
            target = rollback_target(records, current)
            if target is None:
                raise DsvError(f"no healthy release before {current or 'none'} on host "
                               f"'{host_name}'", fix=f"see `dsv4ctl history --host {host_name}`")
        elif not is_release_id(target) or target not in {r.id for r in records}:
            raise DsvError(f"release {target!r} does not exist on host '{host_name}'",
                           fix=f"pick one from `dsv4ctl history --host {host_name}`")
        if target == current:
            out(f"{target} is already current; re-verifying and restarting what is not running")
        return Runner(out).rollback(ctx, target)
    finally:
        try:
            _publish_metrics(remote, host, _rollback_profile(ctx), out)
        finally:
            remote.close()


def _rollback_profile(ctx: Any) -> Any:
    """The profile whose monitoring settings apply after a rollback: the target's (loaded by the
    rollback's preflight), else the release current points at. None if neither can be read."""
    if ctx is None:
        return None
    if ctx.profile is not None:
        return ctx.profile
    from orchestrator.apply.context import load_release

    try:
        current = ctx.store.current()
        return load_release(ctx.store, current)[2] if current else None
    except Exception:  # only decides whether to write metrics; never fails a rollback
        return None


@dataclass
class HistoryRow:
    id: str
    created: str
    status: str
    reason: str
    current: bool
    restarted: list[str]
    events: list[str]
    failed_step: str | None
    # {passed, reason, figures} from the qualify step; None when it did not run
    qualification: dict[str, Any] | None = None
    # per role, the KV pool the plan predicted and the engine reported (the measure step)
    pool: list[dict[str, Any]] = field(default_factory=list)
    # per engine process: role, pid and the kernels it loaded when the release was last verified
    # healthy (empty with kernels disabled)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    # per role, the path each hooked op ran in this release (engine | bundled)
    kernel_paths: dict[str, dict[str, str]] = field(default_factory=dict)


def _ms(v: Any) -> str:
    if not isinstance(v, int | float):
        return "-"
    return f"{v * 1000:.1f}" if v < 0.1 else f"{v * 1000:.0f}"


def qualification_line(q: dict[str, Any]) -> str:
    """One line per release for `dsv4ctl history`: the figures a regression shows up in (recall
    length, output tok/s, TTFT/ITL percentiles, chat behaviours); --json has every figure."""
    f = q.get("figures") or {}
    parts = []
    if "recall_full_tokens" in f:
        need = f.get("recall_required_tokens")
        parts.append(f"recall {f['recall_full_tokens']}" + (f"/{need}" if need else "") + " tok")
    if "load_output_tok_s" in f:
        need = f.get("load_required_tok_s")
        parts.append(f"{f['load_output_tok_s']:.1f} tok/s" + (f" (min {need:g})" if need else "")
                     + (f" @c{f['load_concurrency']}" if "load_concurrency" in f else ""))
    if "load_ttft_s_p50" in f or "load_ttft_s_p99" in f:
        parts.append(f"TTFT p50/p99 {_ms(f.get('load_ttft_s_p50'))}/"
                     f"{_ms(f.get('load_ttft_s_p99'))} ms")
    if "load_itl_s_p50" in f:
        parts.append(f"ITL p50 {_ms(f['load_itl_s_p50'])} ms")
    chat = {k[5:]: v for k, v in f.items() if k.startswith("chat_")}
    if chat:
        bad = sorted(k for k, v in chat.items() if v != "pass")
        parts.append("chat ok" if not bad else "chat FAIL " + ",".join(bad))
    line = ("PASS" if q.get("passed") else "FAIL") + (": " + ", ".join(parts) if parts else "")
    if not q.get("passed") and q.get("reason"):
        line += f" -- {q['reason']}"
    return line


def history(host_name: str, host: Host) -> list[HistoryRow]:
    from orchestrator.release.store import ReleaseStore
    from orchestrator.remote.lock import is_locked

    with _connect(host_name, host) as remote:
        store = ReleaseStore(remote, host.install_root)
        records, current = store.read_records(), store.current()
        locked = is_locked(remote, host.install_root)
    rows = []
    for r in records:
        failed = next((e.step + (f": {e.error}" if e.error else "") for e in r.journal
                       if e.result in ("failed", "interrupted")), None)
        if r.status == "applying" and not locked:
            # no run holds the lock, so none is applying it: its run was lost (the next apply
            # or rollback marks it interrupted on the host)
            r = r.model_copy(update={"status": "interrupted"})
            failed = failed or next((f"{e.step}: its run was lost" for e in r.journal
                                     if e.result == "running"), "its run was lost")
        rows.append(HistoryRow(
            id=r.id, created=r.created, status=r.status, reason=r.reason, current=r.id == current,
            restarted=r.restarted_roles, failed_step=failed,
            events=[f"{e.time} {e.kind} {e.other or ''}".strip() for e in r.events],
            qualification=r.qualification.model_dump(mode="json") if r.qualification else None,
            pool=[m.model_dump(mode="json") for m in r.pool],
            kernels=[k.model_dump(mode="json") for k in r.kernels],
            kernel_paths={role: dict(ops) for role, ops in r.kernel_paths.items()}))
    return rows


def pool_line(m: dict[str, Any]) -> str:
    """One line per role for `dsv4ctl history`: the plan's pool beside the engine's."""
    from orchestrator.calibration import drift

    d = drift(m["measured_tokens"], m["predicted_tokens"])
    line = (f"pool {m['role']}: predicted {m['predicted_tokens']:,}, measured "
            f"{m['measured_tokens']:,} tokens per rank ({d:+.1%}; {m['source']})")
    if m.get("predicted_tokens") != m.get("model_tokens"):
        line += f", model alone {m['model_tokens']:,}"
    return line


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
    from orchestrator.render.argv import engine_argv
    from orchestrator.render.secrets import strip_secret_args

    out = []
    for key, want in (("served_model_name", dep.served_name), ("model_path", dep.model_path),
                      ("tp_size", role.tp), ("port", role.port)):
        have = info.get(key)
        if have is not None and str(have) != str(want):
            out.append(f"{role.name}: {key} is {have!r}, the profile says {want!r}")
    launch = info.get("launch_command")
    if isinstance(launch, str):
        words = shlex.split(launch)
        first = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
        # secret flags come from the secrets file, not the release: neither compared nor shown
        running, wanted = strip_secret_args(dep, words[first:]), engine_argv(dep, role)
        if running != wanted:
            extra = sorted(set(running) - set(wanted))[:5]
            missing = sorted(set(wanted) - set(running))[:5]
            out.append(f"{role.name}: running command line differs from the release "
                       f"(only running: {extra or '-'}; only in release: {missing or '-'})")
    return out


def status(host_name: str, host: Host) -> StatusReport:
    from orchestrator.apply.context import load_release, role_units
    from orchestrator.apply.kernels_seen import loaded_by_pid
    from orchestrator.apply.metrics import release_metrics
    from orchestrator.health import evaluate
    from orchestrator.release.store import MANIFEST, ReleaseStore
    from orchestrator.remote.lock import is_locked, read_holder
    from orchestrator.remote.systemd import ServiceManager

    with _connect(host_name, host) as remote:
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
        _, dep, _ = load_release(store, current)
        rep.deployment = dep.name
        from orchestrator.planner.endpoints import endpoints

        rep.endpoints = endpoints(dep, host.address)
        svc = ServiceManager(remote, host.scope)
        units = role_units(dep)
        http = _authed_http(remote, store, dep)
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
        # files: the release tree against its manifest (someone edited a launch script?)
        check = store.shell.run(
            f"cd {shlex.quote(store.path(current))} && python3 -c "
            + shlex.quote("import json,hashlib,sys\nm=json.load(open('" + MANIFEST + "'))\n"
                          "for p,v in sorted(m['files'].items()):\n"
                          "  h=v.get('sha256')\n"
                          "  try: d=hashlib.sha256(open(p,'rb').read()).hexdigest()\n"
                          "  except OSError: d=None\n"
                          "  if h and d!=h: print(p, 'missing' if d is None else 'modified')\n"),
            timeout=60)
        rep.file_drift += [line for line in check.stdout.splitlines() if line.strip()]
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


def _authed_http(remote: Any, store: Any, dep: Any) -> Any:
    """``remote.http`` with the engine's API key as a bearer token when the release sets one
    (SGLang answers 401 on /v1/models and /server_info without it); the key is read from the
    host's secrets file, the controller need not have it."""
    from orchestrator.remote.connection import listen_http
    from orchestrator.render.secrets import api_key_names

    eng, rt = api_key_names(dep)

    def bearer(name: str | None) -> dict[str, str] | None:
        value = store.read_secret(dep.name, name) if name else None
        return {"Authorization": f"Bearer {value}"} if value else None

    return listen_http(remote.http, dep, bearer(eng), router_headers=bearer(rt))


def _unit_file(scope: str, unit: str) -> str:
    from orchestrator.remote.systemd import unit_dir_expr

    return f"{unit_dir_expr(scope)}/{shlex.quote(unit)}"


def unlock(host_name: str, host: Host, *, force: bool, out: Out) -> bool:
    """Show the lock holder; with ``force`` end it. Returns whether the lock is free afterwards."""
    from orchestrator.remote.lock import force_unlock, is_locked, read_holder

    with _connect(host_name, host) as remote:
        if not is_locked(remote, host.install_root):
            out(f"host '{host_name}' is not locked")
            return True
        holder = read_holder(remote, host.install_root)
        out(f"host '{host_name}' is locked by: {holder.describe() if holder else 'unknown'}")
        if not force:
            out("not unlocking without --force (the holder may still be running)")
            return False
        force_unlock(remote, host.install_root)
        out("lock released")
        return True
