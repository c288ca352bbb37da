"""The step implementations that ``playbooks/*.yaml`` name (:data:`ACTIONS`).

A step is a function ``(ctx, step) -> Outcome``. It reads and changes :class:`Context` and raises a
typed :class:`~orchestrator.errors.DsvError` on failure; the executor (:mod:`.executor`) journals,
persists the record and decides about rollback. Steps never print: they report through
``ctx.out``.

The same steps serve apply and rollback because both are one *transition*: from the files the
host runs now (``from_files``) to a target release on the host (``target_files``). Only roles whose
files differ are stopped and restarted; roles that are not running are started.

The state the steps share and how a release is read back live in :mod:`.context`; the checks
before anything changes (preflight, reconcile) in :mod:`.preflight`. Past ~400 lines: every step the
playbooks name sits beside :data:`ACTIONS`, the registry; the seam is the kernel steps
(``install_kernels``, ``selftest_outcome``, ``qualify``, ``kernels_seen``) into their own module.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shlex
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import kernels_package
from orchestrator.apply.context import (
    Context,
    Outcome,
    StepFailed,
    engine_http,
    role_units,
)
from orchestrator.apply.measure import measure_pool
from orchestrator.apply.preflight import preflight, rollback_preflight
from orchestrator.errors import DsvError
from orchestrator.planner.transition import (
    unit_plan,
)
from orchestrator.release.record import (
    Event,
    KernelsSeen,
    Qualification,
    ReleaseRecord,
    stamp,
)

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
                                        "kernels.attention/indexer/mhc_pre: engine")
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
    # The engine env's python with the release's kernels first on its path, as the engine runs;
    # checked right before it runs (issue 31: a replaced bin/python ran as the deploying user)
    from orchestrator.remote.probes import require_engine_env

    require_engine_env(ctx.remote, ctx.deployment.engine_env, ctx.host_name)
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
    # only what this release runs: the ops some role takes the bundled path for
    ops = sorted({p.op for r in ctx.deployment.roles for p in r.kernels if p.path == "bundled"})
    res = ctx.remote.run(f"{py} -m dsv4_kernels.selftest --ops {shlex.quote(','.join(ops))}",
                         timeout=1800)
    # keep the full JSON report next to the installed package; summarise it in the journal
    with contextlib.suppress(DsvError):
        ctx.remote.put_bytes(res.stdout.encode(), f"{dest}/selftest.json", mode=0o644)
    return selftest_outcome(ctx, res, digest, f"{dest}/selftest.json")


SELFTEST_TRACEBACK_LINES = 200


def selftest_outcome(ctx: Context, res: Any, digest: str, report: str) -> Outcome:
    """The self-test's verdict. A failure prints the self-test's stderr (a traceback) once,
    whole, and the error carries one line: the failing checks from the JSON, else the
    traceback's last line (the exception), never a slice cut mid-word that every later summary
    repeats."""
    try:
        summary = json.dumps(json.loads(res.stdout), separators=(",", ":"))
        parsed = True
    except ValueError:
        summary, parsed = res.stdout.strip(), False
    if res.rc == 0:
        return Outcome(detail=f"installed {digest}; self-test passed: {_clip(summary, 300)}")
    lines = [ln for ln in (res.stderr or "").rstrip().splitlines() if ln.strip()]
    if lines:
        shown = lines[-SELFTEST_TRACEBACK_LINES:]
        ctx.out(f"  kernel self-test stderr ({len(lines)} lines"
                + (f", the last {len(shown)}" if len(shown) < len(lines) else "") + "):")
        for line in shown:
            ctx.out(f"    | {line}")
    why = (_clip(summary, 300) if parsed and summary else
           lines[-1].strip() if lines else _clip(summary, 300) or "no output")
    raise StepFailed(f"kernel self-test failed (exit {res.rc}): {why}",
                     fix=f"see {report} on the host (and the stderr above); set the failing "
                         "kernels.<op> to engine to deploy without that bundled kernel")


def _clip(text: str, n: int) -> str:
    """``text`` cut at a word boundary within ``n`` characters, marked when cut."""
    if len(text) <= n:
        return text
    cut = text[:n].rsplit(" ", 1)[0] if " " in text[:n] else text[:n]
    return cut.rstrip(",:") + " ..."


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
        logs = show_log_tails(ctx, [r.subject for r in report.failing()])
        raise StepFailed(f"not healthy after {report.elapsed_s:.0f}s: {report.summary()} "
                         f"(log: {logs})",
                         fix=f"read {logs} on the host (its last lines are above)")
    healthy_after = report.elapsed_s
    window = stability_window_s(ctx)
    if window > 0:
        back = ("Ctrl-C now rolls back to the last healthy release" if ctx.from_release else
                "Ctrl-C now stops the new release's units (no earlier release to restore)")
        stable = watch_stable(engine_http(ctx), ctx.deployment, lambda: ctx.svc.show(units),
                              window_s=window, poll_s=poll, baseline_restarts=baseline,
                              progress=ctx.out, interrupt_note=back)
        if not stable.ok:
            ctx.health = stable.summary()
            logs = show_log_tails(ctx, [r.subject for r in stable.failing()])
            raise StepFailed(f"healthy after {healthy_after:.0f}s, then failed "
                             f"{stable.elapsed_s:.0f}s into the {window:g}s stability window: "
                             f"{stable.summary()} (log: {logs})",
                             fix=f"read {logs} on the host (its last lines are above; "
                                 "health.stability_window_s sets the window)")
    return Outcome(detail=f"healthy after {healthy_after:.0f}s"
                   + (f", stable for {window:g}s" if window > 0 else ""))


LOG_TAIL_LINES = 15
LOG_TAIL_TIMEOUT_S = 5


def show_log_tails(ctx: Context, roles: list[str]) -> str:
    """Print the last lines of each failing role's log (``<install_root>/logs/<role>.log``, where
    its unit appends stdout and stderr), every secret value of this apply redacted and each line
    bounded; return the log paths, for the error's fix."""
    known = set(role_units(ctx.deployment))
    roles = [r for r in dict.fromkeys(roles) if r in known] or sorted(known)
    paths = []
    secrets = sorted((v for v in ctx.secrets.values() if len(v) >= 4), key=len, reverse=True)
    for role in roles:
        path = f"{ctx.host.install_root.rstrip('/')}/logs/{role}.log"
        paths.append(path)
        try:  # best effort, briefly: a host that died must not delay or change the failure
            res = ctx.remote.run(f"tail -n {LOG_TAIL_LINES} -- {shlex.quote(path)} 2>/dev/null",
                                 timeout=LOG_TAIL_TIMEOUT_S)
            lines = res.stdout.splitlines() if res.ok else []
        except (DsvError, OSError, EOFError) as exc:
            ctx.out(f"  {role}: {path} could not be read ({getattr(exc, 'message', exc)})")
            continue
        if not lines:
            ctx.out(f"  {role}: {path} is empty or unreadable")
            continue
        ctx.out(f"  last {len(lines)} lines of {path}:")
        for line in lines:
            for s in secrets:
                line = line.replace(s, "<redacted>")
            ctx.out(f"    | {line[:300]}")
    return ", ".join(paths)


def stability_window_s(ctx: Context) -> float:
    """The stability window the plan resolved (planner.context.stability_window); a release
    planned before plans carried it is resolved by the same function now."""
    from orchestrator.planner.context import stability_window

    assert ctx.profile is not None and ctx.deployment is not None
    if ctx.deployment.stability_window_s is not None:
        return ctx.deployment.stability_window_s
    return stability_window(ctx.profile, ctx.deployment.router_version)[0]


def reset_router(ctx: Context, step: Any) -> Outcome:
    """After a restore, before its smoke: the router on this host forgets what it learnt about
    this host's engines during the failure. sglang-router 0.3.2 opens a worker's circuit after
    10 failed requests and keeps it open 60 s (router_args.py ``cb_failure_threshold``,
    ``cb_timeout_duration_secs``), also for a worker that was never restarted (a PD pair fails
    on its prefill), so a restored release answered 503 "No available prefill workers (all
    circuits open or unhealthy)" through a router whose engines were healthy. Each engine still
    listed is removed and added back (a fresh worker, its circuit closed); one not listed is
    left to whoever took it out (a fleet's driver puts back the hosts it drained)."""
    from orchestrator.remote.router_api import RouterApi

    dep = ctx.deployment
    assert dep is not None
    if dep.router is None or not dep.roles:
        return Outcome(result="skipped", detail="no router fronts this host's engines here")
    if dep.router.unit in ctx.started:
        return Outcome(result="skipped", detail="the router itself started: its view is new")
    api = RouterApi(engine_http(ctx), dep.router.port, name=f"the router on '{ctx.host_name}'")
    reset = []
    for role in dep.roles:
        kind = role.disaggregation_mode or "regular"
        if api.find(role.url) is None:
            continue
        api.remove(role.url)
        api.add(role.url, worker_type=kind,
                bootstrap_port=role.bootstrap_port if kind == "prefill" else None)
        reset.append(role.name)
    if not reset:
        return Outcome(result="skipped", detail="none of this host's engines is in the router")
    return Outcome(detail=f"removed and re-added {', '.join(reset)} in the router: a circuit the "
                          "failure opened (10 failures, 60 s in sglang-router 0.3.2) no longer "
                          "keeps them out")


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
    "reset_router": reset_router,
    "smoke_generate": smoke_generate,
    "measure_pool": measure_pool,
    "qualify": qualify,
    "record_healthy": record_healthy,
    "record_rollback": record_rollback,
}


__all__ = ["ACTIONS", "Context", "Outcome", "StepFailed", "kernels_source"]

