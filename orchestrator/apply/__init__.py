"""One host's move, apply or rollback: the library the driver (:mod:`.fleet_ops`) runs per host.

An apply is :func:`prepare_apply` then its :class:`PreparedApply`'s switch (or cancel); a rollback
is :func:`rollback`. Each works over the connection the driver gives it (one per host, the
probe's when there was one: the driver opens and closes them), through the steps of
``playbooks/*.yaml`` (:mod:`.executor`, :mod:`.steps`), and returns a result; nothing here prints
or exits. ``status``, ``history`` and ``unlock`` live in :mod:`.status`, :mod:`.history` and
:mod:`.unlock`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import DsvError
from orchestrator.planner_model import Plan
from orchestrator.profile.inventory import Host
from orchestrator.release.record import chosen_rollback_target

Out = Callable[[str], None]


def probe_for_apply(host_name: str, host: Host, model_path: str,
                    engine_env: str | None = None) -> tuple[Any, Any]:
    """(open connection, facts) for ``dsv4ctl apply PROFILE``: the probe's connection is kept for
    the run that follows (one SSH connection per host: issue 20 #10). Hand it to the driver,
    which closes it; close it yourself if you do not apply."""
    from orchestrator.remote.connection import connect
    from orchestrator.remote.probes import collect_facts

    remote = connect(host_name, host)
    try:
        return remote, collect_facts(remote, host_name, host, model_paths=[model_path],
                                     engine_env=engine_env)
    except BaseException:
        remote.close()
        raise


@dataclass
class PreparedApply:
    """An apply whose release is on its host (uploaded, verified, kernels unpacked into
    ``releases/<id>/kernels/``) under the held host lock, nothing serving changed yet: the
    state between a fleet's parallel prepare phase and the host's wave (issue 23). Finish it
    with exactly one of :meth:`switch` or :meth:`cancel`; the connection stays the driver's."""

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
            _publish_metrics(self.ctx.remote, self.ctx.host, self.profile, self.out)

    def cancel(self, why: str) -> Any:
        try:
            return self.runner.cancel(self.ctx, why)
        finally:
            _publish_metrics(self.ctx.remote, self.ctx.host, self.profile, self.out)


def checked_profile(plan: Plan, host_name: str, host: Host, *, saved: bool) -> Any:
    """The checks of a host's plan that need no connection, run by the driver before it reaches
    any host: the plan is this host's, for its install root and scope, and a saved plan
    re-derives from its own profile (:func:`check_rederived`). Returns the plan's profile."""
    from orchestrator.apply.context import profile_from_plan

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
    return profile


def prepare_apply(plan: Plan, host_name: str, host: Host, *, profile: Any, out: Out,
                  command: str, saved: bool, remote: Any, fleet: tuple[Plan, ...] = (),
                  fleet_lock: str | None = None, probed: Any = None) -> Any:
    """The prepare phase of one host's apply (:meth:`.executor.Runner.prepare`) over ``remote``
    (the driver's connection to the host), ``profile`` as :func:`checked_profile` gave it: a
    :class:`PreparedApply`, or the apply's Result when it ended there (no changes, or a prepare
    step failed with nothing serving changed). ``saved``: the plan came from a file, so it is
    checked for staleness against freshly probed facts (a plan made seconds ago in-process is
    not). ``fleet``: every host's plan of the fleet (the router host's Prometheus rules carry
    every engine host's GPUs, :func:`orchestrator.monitoring.plan_rules_file`). ``fleet_lock``:
    the fleet lock the host lock is taken inside of (the fleet of one's). ``probed``: the facts
    this run's probe read over ``remote`` (a profile's apply), which preflight uses for what it
    would otherwise read a second time (:func:`.preflight.preflight`)."""
    from orchestrator.apply.context import Context
    from orchestrator.apply.executor import Runner

    runner = Runner(out)
    done = True
    try:
        ctx = Context(remote=remote, host_name=host_name, host=host, out=out,
                      now=runner.now, command=command, fleet_lock=fleet_lock)
        ctx.plan, ctx.saved_plan, ctx.fleet_plans = plan, saved, fleet
        ctx.probed = None if saved else probed
        ctx.deployment, ctx.profile = plan.deployment, profile
        res = runner.prepare(ctx)
        if res is not None:
            return res
        done = False
        return PreparedApply(runner, ctx, profile, out)
    finally:
        if done:
            _publish_metrics(remote, host, profile, out)


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


def rollback(host_name: str, host: Host, target: str | None, *, out: Out, command: str,
             remote: Any, fleet_lock: str | None = None) -> Any:
    """One host back to ``target`` (None: the last healthy release before current) over
    ``remote``, the driver's connection (:class:`.fleet_rollback.RollbackOps`); ``fleet_lock``
    as for :func:`prepare_apply`."""
    from orchestrator.apply.context import Context
    from orchestrator.apply.executor import Runner

    ctx: Any = None
    try:
        ctx = Context(remote=remote, host_name=host_name, host=host, out=out,
                      now=Runner(out).now, command=command, fleet_lock=fleet_lock)
        records = ctx.store.read_records()
        current = ctx.store.current()
        target = chosen_rollback_target(records, current, target, host_name)
        return Runner(out).rollback(ctx, target)
    finally:
        _publish_metrics(remote, host, _rollback_profile(ctx), out)


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


