"""The step implementations that ``playbooks/*.yaml`` name, and the state they share.

A step is a function ``(ctx, step) -> Outcome``. It reads and changes :class:`Context` and raises a
typed :class:`~orchestrator.errors.DsvError` on failure; the executor (:mod:`.executor`) journals,
persists the record and decides about rollback. Steps never print: they report through
``ctx.out``.

The same steps serve apply and rollback because both are one *transition*: from the files the
host runs now (``from_files``) to a target release on the host (``target_files``). Only roles whose
files differ are stopped and restarted; roles that are not running are started.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import secrets
import shlex
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator import kernels_package
from orchestrator.apply.measure import measure_pool
from orchestrator.deployment import Deployment
from orchestrator.errors import DsvError, RemoteError, StalePlan
from orchestrator.facts import Facts
from orchestrator.planner.checks import gb
from orchestrator.planner.transition import (
    ROLE_ORDER,
    ReleaseFile,
    release_from_manifest,
    roles_affected,
    transition,
    unit_plan,
    units_of,
)
from orchestrator.planner_model import Action, Plan, summarize_actions
from orchestrator.profile.inventory import Host
from orchestrator.profile.schema import Profile
from orchestrator.release.record import (
    Event,
    KernelsSeen,
    Qualification,
    ReleaseRecord,
    plan_id,
    stamp,
)
from orchestrator.release.store import (
    MANIFEST,
    PLAN,
    ReleaseStore,
    release_files,
    secrets_body,
)
from orchestrator.remote.connection import RemoteHost
from orchestrator.remote.lock import HostLock
from orchestrator.remote.systemd import ServiceManager


class StepFailed(DsvError):
    """A step's own failure (health, smoke, self-test); the executor decides what follows."""


@dataclass(frozen=True)
class Outcome:
    result: str = "ok"  # ok | skipped
    detail: str | None = None
    finish: str | None = None  # stop the playbook successfully with this message


def role_units(dep: Deployment | None) -> dict[str, str]:
    """role -> unit name, engines first, router last (start order; reverse for stop)."""
    if dep is None:
        return {}
    out = {r.name: r.unit for r in sorted(dep.roles, key=lambda r: ROLE_ORDER.index(r.name))}
    if dep.router is not None:
        out["router"] = dep.router.unit
    return out


@dataclass
class Context:
    remote: RemoteHost
    host_name: str
    host: Host
    out: Callable[[str], None]
    now: Callable[[], datetime]
    command: str
    store: ReleaseStore = field(init=False)
    svc: ServiceManager = field(init=False)
    lock: HostLock | None = None
    record: ReleaseRecord | None = None
    persist: bool = False
    journal_prefix: str = ""
    # the transition
    target: str | None = None
    target_files: dict[str, ReleaseFile] = field(default_factory=dict)
    deployment: Deployment | None = None
    profile: Profile | None = None
    from_release: str | None = None
    from_files: dict[str, ReleaseFile] = field(default_factory=dict)
    from_deployment: Deployment | None = None
    # apply only
    plan: Plan | None = None
    saved_plan: bool = False
    tree: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    manifest_sha: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    # planner.transition's actions from (from_files, target_files, the units running at preflight):
    # the only list stop_changed and start_units execute
    actions: list[Action] = field(default_factory=list)
    # what happened
    stopped: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    switched: bool = False
    rollback_timeout_s: float = 1800.0
    health: str = ""
    records: list[ReleaseRecord] = field(default_factory=list)
    # apply's forward steps fail when their journal cannot be written (issue 20 #1); a rollback
    # carries on without it (putting a release back matters more than its journal), keeps the
    # record in memory and says so
    journal_strict: bool = True
    journal_error: str | None = None

    @property
    def roles_to_restart(self) -> set[str]:
        """Roles whose process the transition stops, starts or restarts."""
        return set(roles_affected(self.actions))

    def __post_init__(self) -> None:
        self.store = ReleaseStore(self.remote, self.host.install_root)
        self.svc = ServiceManager(self.remote, self.host.scope)

    def condition(self, name: str) -> tuple[bool, str]:
        assert self.deployment is not None and self.profile is not None
        if name == "kernels_enabled":
            return self.deployment.kernels_enabled, "kernels.enabled is false in the profile"
        if name == "qualify_configured":
            return self.profile.health.qualify is not None, "health.qualify is not set"
        raise KeyError(name)

    def timeout(self, name: str | None) -> float:
        assert self.profile is not None
        if name == "rollback":
            return self.rollback_timeout_s
        return float(self.profile.health.startup_timeout_s)

    def save_record(self) -> None:
        if not self.persist or self.record is None:
            return
        try:
            self.store.write_record(self.record)
            self.journal_error = None
        except DsvError as exc:
            if self.journal_strict:
                raise
            if self.journal_error is None:
                self.out(f"  (the journal could not be written, carrying on: {exc.message})")
            self.journal_error = exc.message


# ------------------------------------------------------------------------------------ loading ---

RELEASE_META = (MANIFEST, PLAN, "profile.yaml")  # what load_release reads of a release


def load_release(store: ReleaseStore, release_id: str) -> tuple[dict[str, ReleaseFile], Deployment,
                                                                 Profile]:
    """Manifest, deployment (from its plan.json) and resolved profile of a release on the host."""
    from orchestrator.profile.loader import load_text

    text = store.read_files(release_id, list(RELEASE_META))
    files = release_from_manifest(json.loads(text[MANIFEST]))
    plan = Plan.model_validate_json(text[PLAN])
    profile = load_text(Profile, text["profile.yaml"], f"{release_id}/profile.yaml")
    return files, plan.deployment, profile


def profile_from_plan(plan: Plan) -> Profile:
    from orchestrator.profile.loader import load_text

    for f in plan.files:
        if f.path == "profile.yaml" and f.content is not None:
            return load_text(Profile, f.content, "plan:profile.yaml")
    raise StalePlan("the plan carries no profile.yaml (plan saved without file contents?)",
                    fix="re-create it with `dsv4ctl plan --host NAME --live -o plan.json`")


MAX_SECRET_BYTES = 64 * 1024


def _read_secret_file(name: str, path: str) -> str:
    """A secret file's text: a regular file whose real path (links resolved) is not under /proc,
    /dev or /sys, at most MAX_SECRET_BYTES (issue 19: ``/proc/self/environ``, or a link to it,
    shipped the controller's whole environment to the host)."""
    import os
    import stat

    from orchestrator.profile.schema import forbidden_secret_dir

    real = os.path.realpath(path)
    where = forbidden_secret_dir(real)
    if where is not None:
        raise DsvError(f"secrets.{name}.file: {path} resolves to {real}, under {where}, which is "
                       "not a secret store", fix="put the secret in a regular file, or use env:")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise DsvError(f"secrets.{name}.file: cannot read {path}: {exc.strerror}",
                       fix="check the path and permissions of the secret file") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DsvError(f"secrets.{name}.file: {path} is not a regular file",
                           fix="point it at a regular file holding only the secret")
        data = fh.read(MAX_SECRET_BYTES + 1)
    if len(data) > MAX_SECRET_BYTES:
        raise DsvError(f"secrets.{name}.file: {path} is larger than {MAX_SECRET_BYTES} bytes",
                       fix="point it at a file holding only the secret")
    return data.decode("utf-8", "replace").strip()


def resolve_secrets(profile: Profile) -> dict[str, str]:
    """Read the profile's secret refs on the controller. Values never enter a plan, a record or
    output; only the names do."""
    import os

    out: dict[str, str] = {}
    for name, ref in sorted(profile.secrets.items()):
        if ref.env is not None:
            value = os.environ.get(ref.env)
            if value is None:
                raise DsvError(f"secret {name}: environment variable {ref.env} is not set on the "
                               "controller", fix=f"export {ref.env}=... before `dsv4ctl apply`")
        else:
            assert ref.file is not None
            value = _read_secret_file(name, ref.file)
        out[name] = value
    return out


def tree_from_plan(plan: Plan) -> tuple[dict[str, tuple[bytes, int]], dict[str, str], str]:
    """The release tree (files + manifest.json + plan.json), the manifest's hashes and its text.

    The manifest is the renderer's (:meth:`orchestrator.render.ReleaseTree.manifest`, its one
    writer), built from the plan's files after :func:`release_files` checked each against the
    sha256 the plan recorded."""
    from orchestrator.render import ReleaseTree, RenderedFile

    files = release_files(plan.files)
    manifest_text = ReleaseTree(plan.deployment.name, {
        p: RenderedFile(d.decode("utf-8"), m, tuple(r)) for p, (d, m, r) in files.items()
    }).manifest()
    hashes = {p: f.sha256 for p, f in release_from_manifest(json.loads(manifest_text)).items()
              if f.sha256}
    tree = {p: (d, m) for p, (d, m, _) in files.items()}
    tree[MANIFEST] = (manifest_text.encode(), 0o644)
    tree[PLAN] = (plan.model_dump_json(indent=2).encode() + b"\n", 0o644)
    return tree, hashes, manifest_text


# ---------------------------------------------------------------------------------- preflight ---

def stale_reason(plan: Plan, facts: Facts, host: Host, model_path: str | None) -> str | None:
    """Why a saved plan no longer matches the host, or None. ``facts`` were probed with the
    profile's checkpoint path; the planner may have probed without it (``gather_facts`` without
    ``model_paths``), so the fingerprint of that narrower probe is accepted too."""
    from orchestrator.remote.probes import probe_paths

    if plan.facts_source != "probed":
        return ("the plan was made from the inventory's declared facts, not from the live host; "
                "apply needs a plan made against the host "
                "(`dsv4ctl plan PROFILE --live -o plan.json`)")
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
    from orchestrator.remote.probes import facts_command

    plan = ctx.plan
    assert plan is not None and ctx.deployment is not None and ctx.profile is not None
    if plan.errors:
        raise DsvError(f"the plan has {len(plan.errors)} error check(s): "
                       + "; ".join(c.id for c in plan.errors),
                       fix="fix the profile (see `dsv4ctl plan`); nothing was changed")
    ctx.secrets = resolve_secrets(ctx.profile)
    ctx.tree, ctx.manifest_sha, _ = tree_from_plan(plan)
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
    if ctx.saved_plan:
        ahead.append(facts_command(ctx.host, [ctx.deployment.model_path], probe_token))
    batch = Batch(ahead)
    ctx.lock = HostLock(ctx.remote, ctx.host.install_root, ctx.command)
    out = ctx.lock.acquire(then=batch.script)
    ctx.out(f"  host lock taken ({ctx.host.install_root}/.dsv4ctl.lock)")
    with prefetched(ctx, batch.results(out)) as shell:
        return _preflight_reads(ctx, plan, shell, probe_token)


def _preflight_reads(ctx: Context, plan: Plan, shell: Any, probe_token: str) -> Outcome:
    from orchestrator.remote.probes import collect_facts

    assert ctx.deployment is not None
    if ctx.saved_plan:
        ctx.out("  probing the host to check the saved plan is still current")
        facts = collect_facts(shell, ctx.host_name, ctx.host,
                              model_paths=[ctx.deployment.model_path], token=probe_token)
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
    if current is not None:
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
    wanted = hashlib.sha256(secrets_body(ctx.secrets)).hexdigest() if ctx.secrets else None
    rotated = secrets_restarts(ctx, wanted)
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


def _transition(ctx: Context) -> list[Action]:
    """The transition from the release the host runs to the target, given the units running now
    (the same function and inputs ``plan`` used)."""
    units = {*units_of(ctx.from_files).values(), *units_of(ctx.target_files).values()}
    states = {u: st.active for u, st in ctx.svc.show(sorted(units)).items()
              if st.loaded != "not-found"}
    current = ctx.from_files if ctx.from_release is not None else None
    return transition(current, ctx.target_files, states)


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
    ``current`` points at it - so the journal never stays "applying" (issue 20 #7). ``records``
    and ``current``: as just read under the lock (read here when not given). Returns the records
    as they are now on the host."""
    if records is None:
        current, records = ctx.store.current(), ctx.store.read_records()
    out = []
    for rec in records:
        out.append(rec)
        if rec.status != "applying":
            continue
        t = stamp(ctx.now())
        saved = _local_record(rec.host, rec.id)
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
            local_record_path(rec.host, rec.id).unlink(missing_ok=True)
            ctx.out(f"  {rec.id}: its record ({saved.status}) was put back from the controller")
            out[-1] = saved
            continue
        running = [e.step for e in rec.journal if e.result == "running"]
        for e in rec.journal:
            if e.result == "running":
                e.result, e.end = "interrupted", t
                e.error = "the run doing this step was lost (dsv4ctl killed or the host unreachable)"
        last = running[-1] if running else (rec.journal[-1].step if rec.journal else "none")
        serving = ("current points at it (it was switched to but never proven healthy)"
                   if current == rec.id else f"current is {current or 'none'}")
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

    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "dsv4ctl" / "records" / host / f"{release_id}.json"


def _local_record(host: str, release_id: str) -> ReleaseRecord | None:
    try:
        return ReleaseRecord.model_validate_json(
            local_record_path(host, release_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def rollback_preflight(ctx: Context, step: Any) -> Outcome:
    assert ctx.target is not None
    for rel in (MANIFEST, PLAN, "profile.yaml"):
        if not ctx.store.exists(ctx.target, rel):
            raise StepFailed(f"release {ctx.target} is incomplete on the host: {rel} is missing",
                             fix="pick another release from `dsv4ctl history`")
    ctx.target_files, ctx.deployment, ctx.profile = load_release(ctx.store, ctx.target)
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


# ----------------------------------------------------------------------------- upload/kernels ---

def upload_release(ctx: Context, step: Any) -> Outcome:
    assert ctx.target is not None and ctx.deployment is not None
    total = sum(len(d) for d, _ in ctx.tree.values())
    ctx.store.upload(ctx.target, ctx.tree, ctx.manifest_sha)
    ctx.store.mkdirs("logs", what="creating the log dir")
    if ctx.secrets:
        # the release's own 0600 file beside the active one; the units read it only once the
        # switch makes it active (switch_current), so a failed apply never changes what the
        # serving release's processes get on their next (re)start (issues 19, 20)
        ctx.store.write_secrets(ctx.deployment.name, ctx.target, ctx.secrets)
    return Outcome(detail=f"{len(ctx.tree)} files, {total} bytes"
                   + (f"; secrets file of the release with {len(ctx.secrets)} value(s)"
                      if ctx.secrets else ""))


def kernels_source() -> Path:
    src = kernels_package.source()
    if src is None:
        raise StepFailed("the bundled kernels package (kernels/) is not part of this dsv4ctl "
                         "install", fix="install dsv4ctl from a source checkout, or set "
                                        "kernels.enabled: false")
    return src


kernels_package_files = kernels_package.package_files


def install_kernels(ctx: Context, step: Any) -> Outcome:
    """Unpack the kernels package into the target release (``releases/<id>/kernels/``), where
    the engine imports it from: render puts ``<install_root>/current/kernels`` on the engine's
    ``PYTHONPATH`` (:data:`orchestrator.render.KERNELS_PATH_ENV`), so the ``current`` switch
    and a rollback select the kernels with the release. Issue 20 item 6: they used to be
    pip-installed into the shared engine env, and after ``rollback r1`` the restarted decode
    loaded r2's kernels."""
    assert ctx.deployment is not None and ctx.target is not None
    src = kernels_source()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in kernels_package_files(src):
            tar.add(src / rel, arcname=f"kernels/{rel}", recursive=False)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:12]
    release = ctx.store.path(ctx.target)
    dest = f"{release}/kernels"
    tgz = f"{ctx.host.install_root}/.incoming/kernels-{digest}.tar.gz"
    ctx.store.mkdirs(".incoming", f"releases/{ctx.target}", what="preparing the kernels upload")
    ctx.remote.put_bytes(data, tgz, mode=0o600)
    # a re-applied release replaces what an earlier attempt left, never merges into it
    ctx.remote.check(f"rm -rf {shlex.quote(dest)} && tar -xzf {shlex.quote(tgz)} -C "
                     f"{shlex.quote(release)} && rm -f {shlex.quote(tgz)}", timeout=120,
                     what="unpacking the kernels package into the release")
    ctx.out(f"  dsv4-kernels ({digest}) into {dest}")
    # The engine env's python with the release's kernels first on its path, as the engine runs
    py = f"PYTHONPATH={shlex.quote(dest)} {shlex.quote(f'{ctx.deployment.engine_env}/bin/python')}"
    # The .pth activation hook (kernels/dsv4_kernels/sglang_hook.py) in the engine env: one line
    # that imports dsv4_kernels.sglang_hook from the engine's path (the release's copy). The
    # rendered units route SGLang's sm_120 decode and indexer through the Python entry points this
    # hook replaces; without it they would run SGLang's slow stock fallbacks, so a refusal (e.g.
    # another SGLang version) fails the step before anything is switched.
    ctx.remote.check(f"{py} -m dsv4_kernels.sglang_hook install", timeout=120,
                     what="installing the SGLang activation hook of the kernels")
    if not ctx.deployment.kernels_selftest:
        return Outcome(detail=f"installed {digest}; self-test disabled (kernels.selftest: false)")
    res = ctx.remote.run(f"{py} -m dsv4_kernels.selftest", timeout=1800)
    # keep the full JSON report next to the installed package; summarise it in the journal
    with contextlib.suppress(DsvError):
        ctx.remote.put_bytes(res.stdout.encode(), f"{dest}/selftest.json", mode=0o644)
    try:
        summary = json.dumps(json.loads(res.stdout), separators=(",", ":"))[:300]
    except ValueError:
        summary = res.stdout.strip()[-300:]
    if res.rc != 0:
        raise StepFailed(f"kernel self-test failed (exit {res.rc}): {summary or res.stderr[-300:]}",
                         fix="see the self-test JSON; set kernels.enabled: false to deploy without "
                             "the custom kernels")
    return Outcome(detail=f"installed {digest}; self-test passed: {summary}")


# ------------------------------------------------------------------------- stop/switch/start ---

def stop_changed(ctx: Context, step: Any) -> Outcome:
    stop, _ = unit_plan(ctx.actions)
    stop = ctx.svc.stop(stop) if stop else []
    if not stop:
        return Outcome(detail="nothing to stop")
    ctx.stopped = stop
    return Outcome(detail="stopped " + ", ".join(stop))


SECRETS_SWITCHED = {
    "activated": "its secrets file is now the one the units read",
    "none": "it has no secrets: the units' secrets file was removed",
    "kept": "it names secrets but has no file of its own (applied before secrets were kept per "
            "release): the units' secrets file was left as it was",
}


def switch_current(ctx: Context, step: Any) -> Outcome:
    """``current`` and the secrets file the units read move to the target together
    (:meth:`ReleaseStore.switch`, the one owner of "which secrets are active"), for apply, the
    restore after a failed apply and ``dsv4ctl rollback``."""
    assert ctx.target is not None and ctx.deployment is not None
    how = ctx.store.switch(ctx.target, secrets=(ctx.deployment.name,
                                                bool(ctx.deployment.secret_names)))
    ctx.switched = True
    return Outcome(detail=f"current -> releases/{ctx.target}; {SECRETS_SWITCHED[how]}")


def secrets_restarts(ctx: Context, wanted: str | None) -> list[Action]:
    """Restarts for the running roles of the target that the transition leaves alone, when the
    secrets the target brings (``wanted``: the sha256 of its secrets file, None for none) differ
    from the active file's: every engine and router unit reads that file (``EnvironmentFile=-``)
    and a process keeps the values it started with, so a rotated key must restart them all at
    the switch (or a router presents an old key to a new engine). Compared by digest on the
    host's side: no value leaves the file for this."""
    assert ctx.deployment is not None
    if ctx.store.secrets_digest(ctx.deployment.name) == wanted:
        return []
    affected = ctx.roles_to_restart
    units = role_units(ctx.deployment)
    states = ctx.svc.show(list(units.values()))
    return [Action(kind="restart", target=unit, roles=[role],
                   downtime="seconds" if role == "router" else "minutes",
                   reason="the secrets it reads change (values never shown)")
            for role, unit in units.items()
            if role not in affected and states.get(unit) and states[unit].running]


def install_units(ctx: Context, step: Any) -> Outcome:
    assert ctx.target is not None
    new = list(role_units(ctx.deployment).values())
    gone = [u for u in role_units(ctx.from_deployment).values() if u not in new]
    if gone:
        ctx.svc.stop(gone)
        ctx.remote.run(f"{ctx.svc.ctl} disable {' '.join(shlex.quote(u) for u in gone)}",
                       timeout=60)
        ctx.svc.remove_units(gone)
    ctx.svc.install_units(ctx.store.path(ctx.target, "units"), new)
    ctx.svc.daemon_reload()
    ctx.remote.run(f"{ctx.svc.ctl} enable {' '.join(shlex.quote(u) for u in new)}", timeout=60)
    return Outcome(detail=f"installed {', '.join(new)}" + (f"; removed {', '.join(gone)}"
                                                           if gone else ""))


def start_units(ctx: Context, step: Any) -> Outcome:
    _, start = unit_plan(ctx.actions)
    # a unit of the target that stopped since preflight (it crashed) is started too: the target
    # release is meant to run whole; the journal names it separately
    units = list(role_units(ctx.deployment).values())
    states = ctx.svc.show(units)
    late = [u for u in units if u not in start and not (states.get(u) and states[u].running)]
    if not start and not late:
        return Outcome(detail="nothing to start")
    # a unit waiting out RestartSec after a crash (sub-state auto-restart) keeps a start job
    # queued until that hold-off ends (systemd src/core/service.c, service_start(): "the
    # service should be manually restarted, not started"), up to 30 s in which the health
    # checks see it crashed: restart those now (issue 20, recovering after a full disk)
    held = [u for u in start + late if states.get(u) and states[u].sub == "auto-restart"]
    ctx.svc.reset_failed(start + late)
    ctx.svc.start([u for u in start + late if u not in held])
    ctx.svc.restart(held)
    ctx.started = start + late
    return Outcome(detail="started " + ", ".join(start)
                   + (f"; also {', '.join(late)} (stopped since preflight)" if late else "")
                   + (f"; restarted {', '.join(held)} (waiting to restart after a crash)"
                      if held else ""))


# ------------------------------------------------------------------------------------ health ---

def wait_healthy(ctx: Context, step: Any) -> Outcome:
    from orchestrator.health import wait_healthy as wait
    from orchestrator.health import watch_stable

    assert ctx.deployment is not None and ctx.profile is not None
    units = list(role_units(ctx.deployment).values())
    baseline = {u: s.restarts for u, s in ctx.svc.show(units).items() if u not in ctx.started}
    timeout = ctx.timeout(getattr(step, "timeout", None))
    poll = ctx.profile.health.poll_interval_s
    budget = ("rollout.rollback_timeout_s" if getattr(step, "timeout", None) == "rollback"
              else "health.startup_timeout_s")
    ctx.out(f"  startup phase: up to {timeout:.0f}s ({budget}), polling every {poll:g}s")
    report = wait(engine_http(ctx), ctx.deployment, lambda: ctx.svc.show(units),
                  timeout_s=timeout, poll_s=poll, baseline_restarts=baseline,
                  progress=ctx.out, settle_s=max(poll, 2.0))
    ctx.health = report.summary()
    if not report.ok:
        raise StepFailed(f"not healthy after {report.elapsed_s:.0f}s: {report.summary()}",
                         fix=f"see the engine logs in {ctx.host.install_root}/logs/ on the host")
    healthy_after = report.elapsed_s
    window = stability_window_s(ctx)
    if window > 0:
        stable = watch_stable(engine_http(ctx), ctx.deployment, lambda: ctx.svc.show(units),
                              window_s=window, poll_s=poll, baseline_restarts=baseline,
                              progress=ctx.out)
        if not stable.ok:
            ctx.health = stable.summary()
            raise StepFailed(f"healthy after {healthy_after:.0f}s, then failed "
                             f"{stable.elapsed_s:.0f}s into the {window:g}s stability window: "
                             f"{stable.summary()}",
                             fix=f"see the engine logs in {ctx.host.install_root}/logs/ on the "
                                 "host (health.stability_window_s sets the window)")
    return Outcome(detail=f"healthy after {healthy_after:.0f}s"
                   + (f", stable for {window:g}s" if window > 0 else ""))


def stability_window_s(ctx: Context) -> float:
    """``health.stability_window_s``, or the router's own time to drop a dead worker."""
    from orchestrator.catalog import load_catalog
    from orchestrator.health import default_stability_window_s

    assert ctx.profile is not None and ctx.deployment is not None
    if ctx.profile.health.stability_window_s is not None:
        return float(ctx.profile.health.stability_window_s)
    rules = load_catalog().router("sglang-router", ctx.deployment.router_version)
    return default_stability_window_s(rules.defaults)


def engine_http(ctx: Context) -> Callable[..., Any]:
    """``remote.http``, with ``Authorization: Bearer`` when the profile sets the engine's API key
    (``secrets: DSV4_SECRET_API_KEY``): SGLang then answers 401 on /v1/models and the generation
    endpoints (only /health*, /ready*, /metrics* stay open, sglang/srt/utils/auth.py). Sent to
    the address each port listens on (a fleet's engines: the host's service address)."""
    from orchestrator.remote.connection import listen_http
    from orchestrator.render.secrets import SECRET_PREFIX

    key = ctx.secrets.get(f"{SECRET_PREFIX}API_KEY")
    return listen_http(ctx.remote.http, ctx.deployment,
                       {"Authorization": f"Bearer {key}"} if key else None)


def smoke_generate(ctx: Context, step: Any) -> Outcome:
    from orchestrator.health import smoke_generate as smoke

    assert ctx.deployment is not None and ctx.profile is not None
    res = smoke(engine_http(ctx), ctx.deployment, ctx.profile.health.smoke_prompt,
                ctx.profile.health.smoke_max_tokens)
    if not res.ok:
        raise StepFailed(f"smoke generation failed: {res.message}")
    return Outcome(detail=res.message)


def qualify(ctx: Context, step: Any) -> Outcome:
    assert ctx.deployment is not None and ctx.profile is not None
    cfg = ctx.profile.health.qualify
    assert cfg is not None
    from orchestrator.probes.qualify import run_qualification  # issue 6; imported only when used
    from orchestrator.render.secrets import SECRET_PREFIX

    port = ctx.deployment.router.port if ctx.deployment.router else ctx.deployment.roles[0].port
    with ctx.remote.forward(port) as local_port:
        res = run_qualification(f"http://127.0.0.1:{local_port}", ctx.deployment, cfg,
                                api_key=ctx.secrets.get(f"{SECRET_PREFIX}API_KEY"))
    if ctx.record is not None:  # saved with the journal entry (or by the rollback that follows)
        ctx.record.qualification = Qualification(passed=res.passed, reason=res.reason,
                                                 figures=dict(res.figures))
    figures = ", ".join(f"{k}={v}" for k, v in sorted(res.figures.items()))
    if not res.passed:
        if cfg.on_fail == "keep":
            return Outcome(detail=f"FAILED but kept (on_fail: keep): {res.reason}; {figures}")
        raise StepFailed(f"qualification failed: {res.reason} ({figures})")
    return Outcome(detail=f"passed: {figures}")


# ------------------------------------------------------------------------------------ record ---

def kernels_seen(ctx: Context) -> list[KernelsSeen]:
    """The kernels each engine process of the target release loaded (its unit's MainPID, the
    hook's line in its log), for the record of a release just verified healthy; empty when the
    release ships no kernels. A failed read is recorded as such, never fails the step."""
    from orchestrator.apply.kernels_seen import loaded_by_pid

    dep = ctx.deployment
    if dep is None or not dep.kernels_enabled:
        return []
    units = {r.name: r.unit for r in dep.roles}
    try:
        states = ctx.svc.show(list(units.values()))
        pids = {role: states[u].main_pid if u in states else 0 for role, u in units.items()}
        seen = loaded_by_pid(ctx.remote, ctx.store, ctx.host.install_root, pids)
    except DsvError as exc:
        return [KernelsSeen(role=role, pid=0, loaded=f"unreadable: {exc.message}")
                for role in sorted(units)]
    return [KernelsSeen(role=role, pid=pids[role], loaded=seen[role]) for role in sorted(seen)]


def record_healthy(ctx: Context, step: Any) -> Outcome:
    assert ctx.record is not None and ctx.profile is not None
    ctx.record.status = "healthy"
    ctx.record.kernels = kernels_seen(ctx)
    ctx.save_record()
    pruned = ctx.store.prune(ctx.profile.rollout.keep_releases, last_healthy=ctx.record.id)
    return Outcome(detail="pruned " + ", ".join(pruned) if pruned else "nothing to prune")


def record_rollback(ctx: Context, step: Any) -> Outcome:
    """Mark both sides of a rollback: the target serves again (healthy), the source was left.
    The record being journaled (``ctx.record``) is changed in memory, the other one on the host."""
    assert ctx.target is not None
    t = stamp(ctx.now())
    own = ctx.record
    seen = kernels_seen(ctx)

    def update(release: str, change: Callable[[ReleaseRecord], None]) -> None:
        if own is not None and own.id == release:
            change(own)
            return
        with contextlib.suppress(DsvError):
            rec = ctx.store.read_record(release)
            change(rec)
            ctx.store.write_record(rec)

    def to(rec: ReleaseRecord) -> None:
        rec.status = "healthy"
        rec.kernels = seen
        rec.events.append(Event(time=t, kind="rollback-to", other=ctx.from_release,
                                detail=ctx.health or None))

    update(ctx.target, to)
    if ctx.from_release and ctx.from_release != ctx.target:
        update(ctx.from_release, lambda rec: rec.events.append(
            Event(time=t, kind="rolled-back-from", other=ctx.target)))
    return Outcome(detail=f"{ctx.target} serves again")


ACTIONS: dict[str, Callable[[Context, Any], Outcome]] = {
    "preflight": preflight,
    "rollback_preflight": rollback_preflight,
    "upload_release": upload_release,
    "install_kernels": install_kernels,
    "stop_changed": stop_changed,
    "switch_current": switch_current,
    "install_units": install_units,
    "start_units": start_units,
    "wait_healthy": wait_healthy,
    "smoke_generate": smoke_generate,
    "measure_pool": measure_pool,
    "qualify": qualify,
    "record_healthy": record_healthy,
    "record_rollback": record_rollback,
}


__all__ = ["ACTIONS", "Context", "Outcome", "RemoteError", "StepFailed", "reconcile"]
