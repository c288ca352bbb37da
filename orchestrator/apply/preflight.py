"""The checks before anything changes: apply's and rollback's preflight steps, the stale-plan test,
the service user, the transition they decide, and the reconcile of records a lost run left behind.

Every read here runs before the switch; a failure leaves what serves untouched. Past ~400 lines:
apply's and rollback's preflights share the stale test, the transition and the secrets digests;
the seam is the reconcile of lost runs' records (``reconcile``, ``local_record_path``) into its own
module.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
from pathlib import Path
from typing import Any

from orchestrator.apply.context import (
    RELEASE_META,
    Context,
    Outcome,
    StepFailed,
    engine_http,
    load_release,
    resolve_secrets,
    role_units,
    tree_from_plan,
)
from orchestrator.errors import DsvError, StalePlan
from orchestrator.facts import EngineEnvFact, Facts
from orchestrator.planner.checks import gb
from orchestrator.planner.transition import (
    release_from_manifest,
    running_drift,
    transition,
    units_of,
)
from orchestrator.planner_model import Action, Plan, summarize_actions
from orchestrator.profile.inventory import Host
from orchestrator.release.record import (
    Event,
    ReleaseRecord,
    plan_id,
    stamp,
)
from orchestrator.release.store import (
    MANIFEST,
    PLAN,
    ReleaseStore,
    secrets_body,
)
from orchestrator.remote.drift import RELEASE_DIR, drift_command, probe_drift
from orchestrator.remote.lock import HostLock
from orchestrator.remote.probes import unit_dir_expr

# ---------------------------------------------------------------------------------- preflight ---

def stale_reason(plan: Plan, facts: Facts, host: Host, model_path: str | None) -> str | None:
    """Why a saved plan no longer matches the host, or None. ``facts`` were probed with the
    profile's checkpoint path; the planner may have probed without it (``gather_facts`` without
    ``model_paths``), so the fingerprint of that narrower probe is accepted too."""
    from orchestrator.remote.probes import probe_paths

    if plan.facts_source != "probed":
        return ("the plan was made from the inventory's declared facts, not from the live host; "
                "apply needs a plan made against the host "
                "(`dsv4ctl plan --live -o plan.json`, which carries the run's profile)")
    if plan.current_release != facts.current_release:
        return (f"the host's current release is {facts.current_release or 'none'}, the plan was "
                f"made against {plan.current_release or 'none'}")
    prints = {facts.fingerprint()}
    narrow = facts
    if model_path:
        disks, models = probe_paths(host, ())
        narrow = facts.model_copy(update={
            "models": [m for m in facts.models if m.path in models],
            "disks": [d for d in facts.disks if d.path in disks],
        })
        prints.add(narrow.fingerprint())
    if plan.facts_fingerprint not in prints:
        if plan.facts_fingerprint in {f.model_copy(update={"calibration": []}).fingerprint()
                                      for f in (facts, narrow)}:
            return ("the host's KV-pool calibration (calibration.json) changed since planning: "
                    "a newer measurement of its engine; re-plan to use it")
        if plan.facts_fingerprint in {f.model_copy(update={"kernel_qualification": []})
                                      .fingerprint() for f in (facts, narrow)}:
            return ("the host's kernel measurement (kernels-qualification.json) changed since "
                    "planning (`dsv4ctl qualify kernels`); re-plan to use it")
        return ("the host's facts (GPUs, disks, models, ports, units or KV-pool calibration) "
                "changed since planning")
    # free space is not in the fingerprint (Facts.fingerprint): what matters is that the
    # checkpoint still fits where the plan puts it
    for row in plan.disks:
        disk = next((d for d in facts.disks if d.path == row.path), None)
        if not row.present and disk is not None and disk.free_bytes < row.needed_bytes:
            return (f"{row.path} has {gb(disk.free_bytes)} free now, and the checkpoint needs "
                    f"{gb(row.needed_bytes)} (the plan saw {gb(row.free_bytes)} free)")
    return None


def check_target(plan: Plan, remote: Any, host_name: str, host: Host) -> None:
    """A saved plan binds its target (issue 31): refuse it on another machine, naming both, before
    anything runs there. Another address, port or user in the inventory is another target; so is
    another host key behind the same address (the inventory's name now points elsewhere)."""
    from orchestrator.planner.build import plan_target_of
    from orchestrator.planner_model import PlanTarget

    made = plan.target
    if made is None:  # a plan saved before targets were recorded: its fingerprint still holds
        return
    live = getattr(remote, "identity", None)
    now = PlanTarget(**{**plan_target_of(plan, host).model_dump(),
                        "host_key": live.host_key if live else None,
                        "peer": live.peer if live else None})
    same = (made.user, made.address, made.port, made.jump) == \
        (now.user, now.address, now.port, now.jump)
    if made.host_key and now.host_key and made.host_key != now.host_key:
        same = False
    if not same:
        raise StalePlan(
            f"this plan was made for {made.describe()}; host '{host_name}' is now "
            f"{now.describe()}: a different machine",
            fix=f"re-plan against the machine you mean (dsv4ctl plan --host {host_name} --live "
                "-o PLAN.json), or correct the inventory if it points at the wrong one")


def _refuse_if_applied(ctx: Context, plan: Plan,
                       records: list[ReleaseRecord] | None = None) -> None:
    """StalePlan if a release was made from this very plan (records read without the lock when
    not given: a read-only look, before the facts' staleness is reported)."""
    records = ctx.store.read_records() if records is None else records
    pid = plan_id(plan)
    done = [r for r in records if r.plan_id == pid]
    if done:
        raise StalePlan(f"this plan was already applied as release {done[-1].id} "
                        f"({done[-1].status})", fix=f"re-plan: dsv4ctl plan --host {ctx.host_name} --live")


def ensure_service_user(ctx: Context) -> str:
    """System scope: the units' ``User=`` (inventory ``service_user``) exists and is not root;
    created as a system user without a home or login shell when missing (issue 19). User scope:
    the units run as the SSH user, nothing to create."""
    if ctx.host.scope != "system":
        return ""
    user = shlex.quote(ctx.host.service_user)
    out = ctx.remote.check(
        f"if id -u {user} >/dev/null 2>&1; then echo exists; else "
        f"useradd --system --user-group --no-create-home --home-dir /nonexistent "
        f"--shell /usr/sbin/nologin {user} && echo created; fi; id -u {user}",
        timeout=60, what=f"checking or creating the service user {ctx.host.service_user}")
    state, _, uid = out.strip().partition("\n")
    if uid.strip() == "0":
        raise StepFailed(f"host.service_user {ctx.host.service_user!r} has uid 0 on host "
                         f"'{ctx.host_name}': the engines would run as root",
                         fix="set service_user in the inventory to an unprivileged user")
    return f"service user {ctx.host.service_user} (uid {uid.strip()}) {state}"


def preflight(ctx: Context, step: Any) -> Outcome:
    from orchestrator.apply.prefetch import Batch, prefetched
    from orchestrator.remote.probes import engine_env_command, facts_command

    plan = ctx.plan
    assert plan is not None and ctx.deployment is not None and ctx.profile is not None
    if ctx.saved_plan:  # before the lock: taking it writes on the machine
        check_target(plan, ctx.remote, ctx.host_name, ctx.host)
    if plan.errors:
        raise DsvError(f"the plan has {len(plan.errors)} error check(s): "
                       + "; ".join(c.id for c in plan.errors),
                       fix="fix the profile (see `dsv4ctl plan`); nothing was changed")
    ctx.secrets = resolve_secrets(ctx.profile)
    ctx.tree, ctx.manifest_sha, _ = tree_from_plan(plan, ctx.fleet_plans)
    ctx.target_files = release_from_manifest(json.loads(ctx.tree[MANIFEST][0]))
    # the lock first (issue 20 #9): a concurrent run must be told "locked" (exit 5), not that
    # the plan it holds went stale because the other run is changing the host. Everything read
    # below runs under it, in the lock's own round trip (issue 20 #10), predicted from the plan:
    # the release it was made against and the target's units (what a no-change apply reads)
    probe_token = "@@dsv4-" + secrets.token_hex(8)
    ahead = [ctx.store.ensure_layout_command(clean=True), ctx.store.current_command(),
             ctx.store.records_command(),
             ctx.svc.show_command(sorted(units_of(ctx.target_files).values())),
             ctx.store.secrets_digest_command(ctx.deployment.name)]
    if plan.current_release is not None:
        ahead.append(ctx.store.read_files_command(plan.current_release, list(RELEASE_META)))
    # The drift read and the engine env's trust walk, each once per run (issue 30: read twice,
    # they cost a no-change apply ~0.3 s, the drift read a python3 on the host). A saved plan
    # reads drift in its re-probe below and the env here; a profile's apply has both from the
    # probe this run made over this connection a moment ago (ctx.probed, None for a saved
    # plan). Read again here, they would guard against nothing more: another dsv4ctl run changes
    # the host only under this lock and through `current`, the records and the units, which are
    # all read again below; an edit outside dsv4ctl can land after any read, under the lock or
    # not.
    if not ctx.saved_plan and ctx.probed is None:
        ahead.append(drift_command(ctx.host.install_root, unit_dir_expr(ctx.host.scope),
                                   ctx.host.scope))
    if _env_checked(ctx.probed, ctx.deployment.engine_env) is None:
        # under the lock, in this batch (require_engine_env below reads its answer from it): its
        # own round trip cost a no-change apply ~0.4 s (issue 30)
        ahead.append(engine_env_command(ctx.deployment.engine_env))
    if ctx.saved_plan:
        ahead.append(facts_command(ctx.host, [ctx.deployment.model_path], probe_token))
    batch = Batch(ahead)
    ctx.lock = HostLock(ctx.remote, ctx.host.install_root, ctx.command, outer=ctx.fleet_lock)
    out = ctx.lock.acquire(then=batch.script)
    ctx.out(f"  {'fleet lock, then host lock' if ctx.fleet_lock else 'host lock'} taken "
            f"({ctx.host.install_root}/.dsv4ctl.lock)")
    with prefetched(ctx, batch.results(out)) as shell:
        return _preflight_reads(ctx, plan, shell, probe_token)


def _preflight_reads(ctx: Context, plan: Plan, shell: Any, probe_token: str) -> Outcome:
    from orchestrator.remote.probes import collect_facts, refuse_untrusted_env, require_engine_env

    assert ctx.deployment is not None
    facts = ctx.probed
    if ctx.saved_plan:
        ctx.out("  probing the host to check the saved plan is still current")
        facts = collect_facts(shell, ctx.host_name, ctx.host,
                              model_paths=[ctx.deployment.model_path], token=probe_token)
    # before anything runs from it (issue 31): the kernels step runs its python as the deploying
    # user, the units as the service user
    checked = _env_checked(facts, ctx.deployment.engine_env)
    if checked is not None:
        refuse_untrusted_env(checked, ctx.host_name)
    else:
        require_engine_env(shell, ctx.deployment.engine_env, ctx.host_name)
    if ctx.saved_plan:
        assert facts is not None
        why = stale_reason(plan, facts, ctx.host, ctx.deployment.model_path)
        if why:
            if plan.current_release == facts.current_release:
                # the host's facts moved, but this very plan was applied already: say that
                _refuse_if_applied(ctx, plan)
            raise StalePlan(f"saved plan is stale: {why}",
                            fix=f"re-plan: dsv4ctl plan --host {ctx.host_name} --live -o PLAN.json")
    ctx.store.ensure_layout(clean=True)
    service_user_note = ensure_service_user(ctx)
    current = ctx.store.current()
    if current != plan.current_release:  # changed between planning/probing and the lock
        raise StalePlan(f"the host's current release is {current or 'none'}, the plan was made "
                        f"against {plan.current_release or 'none'}",
                        fix=f"re-plan: dsv4ctl plan --host {ctx.host_name} --live")
    ctx.records = reconcile(ctx, ctx.store.read_records(), current)
    if ctx.saved_plan:
        _refuse_if_applied(ctx, plan, ctx.records)
    ctx.from_release = current
    # what was changed on the host outside dsv4ctl: the plan lists it as actions (the same probe,
    # planner.transition's ``outside``), so apply repairs it with the restarts it implies
    # and the command lines the units run (the drift probe's too), compared with the target's
    if facts is not None:  # the saved plan's re-probe, or this run's probe (preflight)
        ctx.drift, ctx.running = dict(facts.drift), dict(facts.running)
    else:
        ctx.drift, ctx.running = probe_drift(shell, ctx.host.install_root,
                                             unit_dir_expr(ctx.host.scope), ctx.host.scope)
    if current is not None and RELEASE_DIR not in ctx.drift:
        ctx.from_files, ctx.from_deployment, _ = load_release(ctx.store, current)
    ctx.actions = _transition(ctx)
    if ctx.actions != plan.actions:
        # the host moved between planning and now (a unit stopped, a release switched): what was
        # reviewed is not what would run
        raise StalePlan("the host changed since planning: the plan says "
                        f"{summarize_actions(plan.actions)!r}, the host now needs "
                        f"{summarize_actions(ctx.actions)!r}",
                        fix=f"re-plan: dsv4ctl plan --host {ctx.host_name} --live")
    # values are not in the plan (only names are): a rotated secret is found here, by comparing
    # with the active file, and restarts what reads it
    rotated = secrets_restarts(ctx, wanted_secrets_digest(ctx.secrets))
    ctx.actions = ctx.actions + rotated
    cur_rec = next((r for r in ctx.records if r.id == current), None)
    current_healthy = cur_rec is not None and cur_rec.status == "healthy"
    if not ctx.actions and (current is None or current_healthy):
        return Outcome(finish="No changes.", detail="release files identical, all units running")
    note = f"{service_user_note}; " if service_user_note else ""
    if rotated:
        note += ("the secrets the units read change (values not in the plan; never shown), so "
                 "every running role restarts at the switch; ")
    if current is not None and not current_healthy:
        # a release switched to but never proven healthy (its run was lost, or its restore
        # failed): the same files are proven healthy again as a new release (issue 20 #7)
        note += (f"current release {current} is recorded "
                 f"{cur_rec.status if cur_rec else 'without a record'}, so it is proven healthy "
                 "again as a new release; ")
    return Outcome(detail=note + _describe(ctx.actions))


def _env_checked(facts: Facts | None, env: str) -> EngineEnvFact | None:
    """The engine env's trust check as ``facts`` read it, when they read this very env."""
    fact = facts.engine_env if facts is not None else None
    return fact if fact is not None and fact.path == env else None


def _transition(ctx: Context) -> list[Action]:
    """The transition from the release the host runs to the target, given the units running now
    (the same function and inputs ``plan`` used)."""
    units = {*units_of(ctx.from_files).values(), *units_of(ctx.target_files).values()}
    states = {u: st.active for u, st in ctx.svc.show(sorted(units)).items()
              if st.loaded != "not-found"}
    current = ctx.from_files if ctx.from_release is not None else None
    return transition(current, ctx.target_files, states, outside=ctx.drift,
                      running=running_drift(ctx.deployment, ctx.running),
                      replace=ctx.plan.replace if ctx.plan is not None else ())


def _describe(actions: list[Action]) -> str:
    parts = [summarize_actions(actions)]
    for kind in ("stop", "restart", "start"):
        units = [a.target for a in actions if a.kind == kind]
        if units:
            parts.append(f"{kind} {', '.join(units)}")
    return "; ".join(parts)


def reconcile(ctx: Context, records: list[ReleaseRecord] | None = None,
              current: str | None = None) -> list[ReleaseRecord]:
    """At the start of every apply and rollback, under the lock: a record still "applying" was
    left by a run that was lost (killed, or its host connection dropped for good), since no other
    run can hold the lock. Mark it interrupted with what is known - the step it was in, whether
    ``current`` points at it - so the journal never stays "applying" (issue 20 #7); steps left
    "running" by a lost rollback are marked the same way. A record the host could not take was
    kept on the controller with its final status and cause: it is put back first, so the host
    tells the real error, not "the run was lost". ``records`` and ``current``: as just read under
    the lock (read here when not given). Returns the records as they are now on the host."""
    if records is None:
        current, records = ctx.store.current(), ctx.store.read_records()
    out = []
    for rec in records:
        out.append(rec)
        lost = [e for e in rec.journal if e.result == "running"]
        # the controller's own name for the host, never the record's (issue 31: a record's
        # host '../../x' made the controller write, read and delete outside its state directory)
        saved = _local_record(ctx.host_name, rec.id)
        if rec.status != "applying" and not lost and saved is None:
            continue
        t = stamp(ctx.now())
        if saved is not None and saved.status != "applying":
            # the run was not lost: it finished, but the host could not take its record
            saved.events.append(Event(time=t, kind="reconciled", detail=(
                "the outcome was kept on the controller (the host could not take the record "
                "then) and put back here by a later run")))
            try:
                ctx.store.write_record(saved)
            except DsvError as exc:
                ctx.out(f"  (could not put the saved record of {rec.id} back: {exc.message})")
                continue
            local_record_path(ctx.host_name, rec.id).unlink(missing_ok=True)
            ctx.out(f"  {rec.id}: its record ({saved.status}) was put back from the controller")
            out[-1] = saved
            continue
        if saved is not None:  # a record kept "applying" by an older dsv4ctl: no outcome in it
            local_record_path(ctx.host_name, rec.id).unlink(missing_ok=True)
        running = [e.step for e in rec.journal if e.result == "running"]
        for e in rec.journal:
            if e.result == "running":
                e.result, e.end = "interrupted", t
                e.error = "the run doing this step was lost (dsv4ctl killed or the host unreachable)"
        last = running[-1] if running else (rec.journal[-1].step if rec.journal else "none")
        serving = ("current points at it (it was switched to but never proven healthy)"
                   if current == rec.id else f"current is {current or 'none'}")
        if rec.status != "applying":
            # a rollback to this release was lost mid-way: its steps say so, its status (what
            # the release was before that rollback) is not the lost run's to change
            rec.events.append(Event(time=t, kind="reconciled", result="failed",
                                    detail=f"a run was lost at step {last}; {serving}"))
            try:
                ctx.store.write_record(rec)
            except DsvError as exc:
                ctx.out(f"  (could not mark the lost steps of {rec.id}: {exc.message})")
                continue
            ctx.out(f"  {rec.id}: the run at its step {last} was lost; its steps say so")
            continue
        rec.status = "interrupted"
        rec.events.append(Event(time=t, kind="reconciled", result="failed",
                                detail=f"found 'applying' with no run holding the lock; last "
                                       f"step {last}; {serving}"))
        try:
            ctx.store.write_record(rec)
        except DsvError as exc:
            ctx.out(f"  (could not mark {rec.id} as interrupted: {exc.message})")
            continue
        ctx.out(f"  {rec.id}: marked interrupted (its run was lost at step {last}; {serving})")
    return out


def local_record_path(host: str, release_id: str) -> Path:
    """$XDG_STATE_HOME/dsv4ctl/records/<host>/<id>.json: where a record the host could not take
    waits for the next run."""
    import os

    from orchestrator.host_data import HostDataError, slug
    from orchestrator.host_data import release_id as _rid

    try:  # both are checked again here: nothing else may reach this controller path
        slug(host)
        _rid(release_id)
    except ValueError as exc:
        raise HostDataError(f"refusing a controller state path for host {host[:80]!r}, release "
                            f"{release_id[:80]!r}: {exc}") from None
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "dsv4ctl" / "records" / host / f"{release_id}.json"


def _local_record(host: str, release_id: str) -> ReleaseRecord | None:
    path = local_record_path(host, release_id)
    try:
        return ReleaseRecord.from_host(path.read_bytes(), str(path))
    except (OSError, DsvError):
        return None


def missing_release_part(store: Any, release_id: str) -> str | None:
    """The first of the files a release is read back from that the host lacks (None: complete).
    The rollback's preflight refuses such a release; its preview says why it shows nothing."""
    for rel in (MANIFEST, PLAN, "profile.yaml"):
        if not store.exists(release_id, rel):
            return rel
    return None


def rollback_preflight(ctx: Context, step: Any) -> Outcome:
    assert ctx.target is not None
    rel = missing_release_part(ctx.store, ctx.target)
    if rel is not None:
        raise StepFailed(f"release {ctx.target} is incomplete on the host: {rel} is missing",
                         fix="pick another release from `dsv4ctl history`")
    ctx.target_files, ctx.deployment, ctx.profile = load_release(ctx.store, ctx.target)
    from orchestrator.remote.probes import require_engine_env

    require_engine_env(ctx.remote, ctx.deployment.engine_env, ctx.host_name)
    missing = [p for p in ctx.target_files if p.startswith("units/")
               and not ctx.store.exists(ctx.target, p)]
    if missing:
        raise StepFailed(f"release {ctx.target} lacks {', '.join(missing)}")
    ctx.actions = _transition(ctx)
    # the target's own secrets (its engines demand its API key; the switch makes them active):
    # a release applied before secrets were kept per release keeps the active file
    name = ctx.deployment.name
    own = ctx.store.read_secrets(name, ctx.target) if ctx.deployment.secret_names else {}
    if own is None:
        ctx.secrets = ctx.store.read_secrets(name) or {}
        wanted = ctx.store.secrets_digest(name)
    else:
        ctx.secrets = own
        wanted = ctx.store.secrets_digest(name, ctx.target) if own else None
    ctx.actions = ctx.actions + secrets_restarts(ctx, wanted)
    sick = unhealthy_running_roles(ctx)
    units = role_units(ctx.deployment)
    ctx.actions = ctx.actions + [
        Action(kind="restart", target=units[role], roles=[role], downtime="minutes"
               if role != "router" else "seconds", reason=f"runs but is unhealthy ({why})")
        for role, why in sick.items()]
    return Outcome(detail=f"{ctx.from_release or 'none'} -> {ctx.target}: {_describe(ctx.actions)}")


def unhealthy_running_roles(ctx: Context) -> dict[str, str]:
    """Roles of the target that run, that the transition leaves alone, and that fail their health
    checks right now: a restore must restart them, or recovering from a failed restore only ever
    re-verifies the same broken processes (issue 20 #4). The router is restarted only when every
    engine is healthy (a router whose workers are down recovers with them)."""
    from orchestrator.health import evaluate

    assert ctx.deployment is not None
    restarting = ctx.roles_to_restart
    units = {r: u for r, u in role_units(ctx.deployment).items() if r not in restarting}
    states = ctx.svc.show(list(role_units(ctx.deployment).values()))
    running = {r: u for r, u in units.items() if states.get(u) and states[u].running}
    if not running:
        return {}
    report = evaluate(engine_http(ctx), ctx.deployment, states, {}, timeout=5.0)
    bad: dict[str, str] = {}
    for res in report.failing():
        if res.subject in running and res.check != "unit":
            bad.setdefault(res.subject, f"{res.check}: {res.message}")
    if any(r != "router" for r in bad) or any(r != "router" for r in restarting):
        bad.pop("router", None)
    return bad


def wanted_secrets_digest(values: dict[str, str]) -> str | None:
    """sha256 of the secrets file a release with these values brings (None: no file), the
    digest the host's own ``sha256sum`` of that file gives."""
    return hashlib.sha256(secrets_body(values)).hexdigest() if values else None


def secrets_rotate(store: ReleaseStore, name: str, wanted: str | None) -> bool:
    """Whether the active secrets file differs from the one a release brings (``wanted``)."""
    return store.secrets_digest(name) != wanted


def secrets_restarts(ctx: Context, wanted: str | None) -> list[Action]:
    """Restarts for the running roles of the target that the transition leaves alone, when the
    secrets the target brings (``wanted``: the sha256 of its secrets file, None for none) differ
    from the active file's: every engine and router unit reads that file (``EnvironmentFile=-``)
    and a process keeps the values it started with, so a rotated key must restart them all at
    the switch (or a router presents an old key to a new engine). Compared by digest on the
    host's side: no value leaves the file for this."""
    assert ctx.deployment is not None
    if not secrets_rotate(ctx.store, ctx.deployment.name, wanted):
        return []
    affected = ctx.roles_to_restart
    units = role_units(ctx.deployment)
    states = ctx.svc.show(list(units.values()))
    return [Action(kind="restart", target=unit, roles=[role],
                   downtime="seconds" if role == "router" else "minutes",
                   reason="the secrets it reads change (values never shown)")
            for role, unit in units.items()
            if role not in affected and states.get(unit) and states[unit].running]
