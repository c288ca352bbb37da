"""`dsv4ctl apply`, `rollback`, `history`, `status` and `unlock`: the commands that touch a host.

Thin adapters over :mod:`orchestrator.apply`: find the host (inventory), call the library, print the
result. Failures come back as results and are mapped to the documented exit codes by raising the
typed errors the CLI boundary (:func:`orchestrator.cli.main`) knows. fabric is imported only inside
the command bodies.

Just past 400 lines: the five host commands share host resolution, confirmation and result printing;
the fleet commands already live in :mod:`.fleet_cmd`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.options import host_option, inventory_option, profile_option, verbose_option
from orchestrator.cli.output import chosen_format, echo, format_option, json_alias_option
from orchestrator.errors import DsvError, ExitCode

_inventory_opt = inventory_option()
_host_opt = host_option()


def accept_new_host_key_opt(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--accept-new-host-key``: the explicit opt-in to trust a host seen for the first time
    (OpenSSH's accept-new). Without it an unknown host key is refused (issue 19)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, accept_new_host_key: bool, **kwargs: Any) -> Any:
        if not accept_new_host_key:
            return fn(*args, **kwargs)
        import logging

        from orchestrator.remote.connection import accept_new_host_keys, log

        echo("--accept-new-host-key: a host key never seen before will be accepted and "
             "recorded (a changed key is still refused)", err=True)
        # each key accepted is said on stderr, whatever else configures logging
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        log.addHandler(handler)
        try:
            with accept_new_host_keys():
                return fn(*args, **kwargs)
        finally:
            log.removeHandler(handler)

    return click.option(
        "--accept-new-host-key", is_flag=True,
        help="Accept the SSH key of a host seen for the first time, log it and record it in the "
             "host's known_hosts (else ~/.ssh/known_hosts), like OpenSSH's accept-new. Default: "
             "unknown keys are refused; a changed key is always refused.")(wrapper)


def _echo(line: str) -> None:
    echo(line)
    sys.stdout.flush()


def _command_line() -> str:
    return "dsv4ctl " + " ".join(sys.argv[1:]) if sys.argv else "dsv4ctl"


def resolve_host(profile_path: Path | None, inventory: Path | None, host_name: str | None
                 ) -> tuple[str, Any]:
    """(host name, Host) from --host / the profile's host (default: the bundled profile's), found
    the way `plan` finds it (orchestrator.planner.build: the inventory beside the profile, then
    ./inventory.yaml)."""
    from orchestrator.planner.build import inventory_path_for, load_context, lookup_host
    from orchestrator.profile import load_inventory

    if host_name is None:  # the profile's host; no profile: the bundled one's, as `apply` does
        from orchestrator.paths import default_profile

        ctx = load_context(profile_path or default_profile(), inventory)
        return ctx.host_name, ctx.host
    inv_path = inventory_path_for(profile_path, inventory)
    return lookup_host(host_name, load_inventory(inv_path) if inv_path else None, inv_path)


def _is_plan_file(path: Path) -> bool:
    if path.suffix == ".json":
        return True
    try:
        with path.open("rb") as fh:
            return fh.read(64).lstrip().startswith(b"{")
    except OSError:
        return False


def _confirm(what: str, question: str) -> None:
    """Ask before changing a host; with nobody at a terminal to ask, refuse (Terraform's rule for
    apply without -auto-approve): a script or a pipe must say --yes on purpose."""
    if not sys.stdin.isatty():
        raise DsvError(f"{what} needs confirmation and stdin is not a terminal; nothing was changed",
                       fix=f"run it from a terminal to answer the prompt, or pass --yes "
                           f"(`dsv4ctl {what} ... --yes`) in scripts")
    if not click.confirm(question, default=False):
        raise DsvError(f"{what} cancelled at the prompt; nothing was changed",
                       fix="answer y, or pass --yes in scripts")


def _confirm_apply(plan: Any, name: str, yes: bool, *, secrets_rotate: bool = False) -> None:
    """Ask before changing a host. ``secrets_rotate``: a secret's value differs from the host's
    active one, which no plan can show (values never enter it): every running role restarts."""
    if (plan.actions or secrets_rotate) and not yes:
        restarts = f"; restarts {', '.join(plan.restarts)} (model reload)" if plan.restarts else ""
        if secrets_rotate:
            echo("Secrets: a value differs from the one the host's running roles read (values "
                 "not shown); every running role restarts at the switch (model reload).")
            restarts += "; restarts every running role for the changed secrets"
        _confirm("apply", f"Apply {plan.profile_name} to host '{name}'{restarts}?")


def _print_result(res: Any, what: str = "Apply") -> None:
    from orchestrator.apply.executor import raise_for

    if res.status in ("healthy", "no-changes"):
        _echo(res.message)
        return
    _echo("")
    _echo(f"{what} {res.status.upper()}: {res.message}")
    if res.done:
        _echo("Done:")
        for d in res.done:
            _echo(f"  ✓ {d}")
    if res.not_done:
        _echo("Not done:")
        for d in res.not_done:
            _echo(f"  ✗ {d}")
    if res.release:
        _echo(f"The journal is in releases/{res.release}/record.json on the host.")
    if res.recovery:
        _echo(f"To recover: {res.recovery}")
    raise_for(res)


@click.command()
@click.argument("source", required=False, type=click.Path(dir_okay=False, path_type=Path))
@profile_option(operand="source")
@_inventory_opt
@_host_opt
@click.option("-y", "--yes", is_flag=True,
              help="Do not ask for confirmation. Without it, apply asks at a terminal and refuses "
                   "when stdin is not one.")
@accept_new_host_key_opt
@verbose_option()
def apply(source: Path | None, inventory: Path | None, host_name: str | None, yes: bool) -> int:
    """Roll a profile (or a saved plan) out to its host, with health checks and rollback.

    \b
    SOURCE (or -p FILE) is a profile (planned now, against the live host) or a plan saved with
    `dsv4ctl plan PROFILE --live -o plan.json` (refused if the host changed since, or if it was
    already applied). Steps (playbooks/apply.yaml): preflight (facts, stale check, host lock),
    upload release, kernels, stop changed roles, switch current, units, start, wait healthy,
    smoke generation, qualification, record. A failure after the switch restores the last
    healthy release by itself. An apply without changes restarts nothing.
    """
    from orchestrator.apply import apply_plan
    from orchestrator.paths import default_profile

    path = source or default_profile()
    from orchestrator.cli.fleet_cmd import apply_fleet, fleet_source

    fleet = fleet_source(path, inventory, host_name)
    if fleet is not None:
        return apply_fleet(*fleet, yes=yes)
    remote = None  # the probe's connection, reused by the apply (closed by apply_plan)
    if _is_plan_file(path):
        from orchestrator.planner.build import load_plan

        plan = load_plan(path)
        name, host = resolve_host(None, inventory, host_name or plan.host)
        saved = True
    else:
        from orchestrator.apply import probe_for_apply
        from orchestrator.planner.build import load_context, plan_from_paths

        ctx = load_context(path, inventory, host_override=host_name)
        name, host = ctx.host_name, ctx.host
        _echo(f"Probing host '{name}' ({host.address})...")
        remote, facts = probe_for_apply(name, host, ctx.profile.model.path,
                                           engine_env=ctx.profile.engine.env)
        saved = False
        try:
            plan = plan_from_paths(path, inventory, facts=facts, host_override=host_name)
            from orchestrator.planner.report import render_text

            echo(render_text(plan), nl=False)  # what is about to happen, as `plan` shows it
            if plan.errors:
                raise DsvError("the plan has errors; nothing was applied",
                               fix="fix the profile; `dsv4ctl plan` shows the checks")
            rotate = False
            if not yes:
                from orchestrator.apply import secrets_would_restart

                rotate = secrets_would_restart(plan, host, remote)
            _confirm_apply(plan, name, yes, secrets_rotate=rotate)
        except BaseException:
            remote.close()
            raise
    if remote is None:
        _confirm_apply(plan, name, yes)
    _echo(f"Applying {plan.profile_name} to {name} (scope {host.scope}, root {host.install_root})")
    res = apply_plan(plan, name, host, out=_echo, command=_command_line(), saved=saved,
                     remote=remote)
    _print_result(res)
    return 0


@click.command()
@click.argument("release", required=False)
@profile_option()
@_inventory_opt
@_host_opt
@accept_new_host_key_opt
@click.option("-y", "--yes", is_flag=True,
              help="Do not ask for confirmation. Without it, rollback asks at a terminal and "
                   "refuses when stdin is not one.")
@verbose_option()
def rollback(release: str | None, profile_path: Path | None, inventory: Path | None,
             host_name: str | None, yes: bool) -> int:
    """Make RELEASE current again (default: the last healthy release before current); on a
    fleet, every host wave by wave.

    Restarts only the roles whose files differ, waits until healthy (rollout.rollback_timeout_s)
    and journals the steps in the target release's record.

    A fleet (-p FLEET-PROFILE, a profile whose hosts: names a group): every host goes back to
    its own previous healthy release in the waves of the profile's rollout.strategy (canary
    first), each drained through the router before its rollback and put back after it. It stops
    before any host moves if one has no previous release, and after a failed host like a
    rollout. With --host NAME: that host only (drained the same way), to RELEASE when given.
    The fleet's journal records it (`dsv4ctl history -p FLEET-PROFILE`).

    Exit codes: 0 rolled back; 1 refused (unknown host, no previous release; nothing changed);
    3 a host's rollback failed and it serves what it served before; 4 that failed too.
    """
    from orchestrator.apply import rollback as do_rollback

    if profile_path is not None:
        from orchestrator.planner.fleet import load_fleet, plan_fleet

        fctx = load_fleet(profile_path, inventory)
        if fctx.is_fleet:
            from orchestrator.cli.fleet_cmd import rollback_fleet

            return rollback_fleet(plan_fleet(fctx), dict(fctx.all_hosts), fctx.profile,
                                  only=host_name, release=release, yes=yes)
    name, host = resolve_host(profile_path, inventory, host_name)
    if not yes:
        target = f"release {release}" if release else "the last healthy release before current"
        _confirm("rollback", f"Roll host '{name}' back to {target} (restarts the roles that differ)?")
    res = do_rollback(name, host, release, out=_echo, command=_command_line())
    if res.status == "healthy":
        _echo(res.message)
        return 0
    _print_result(res, "Rollback")
    return int(ExitCode.ROLLBACK_FAILED)


@click.command()
@profile_option()
@_inventory_opt
@_host_opt
@format_option(("text", "json"))
@json_alias_option()
@accept_new_host_key_opt
@verbose_option()
def history(profile_path: Path | None, inventory: Path | None, host_name: str | None,
            fmt: str) -> int:
    """List the host's releases, oldest first: status, what restarted, qualification figures
    (recall, tok/s, TTFT), each role's kernel path per op and the kernels its engines loaded
    when verified healthy, rollbacks.

    With -p FLEET-PROFILE and no --host: every rollout and fleet rollback of the fleet, oldest
    first: which hosts moved (to which release), were rolled back, prepared but never switched,
    or not reached, and where it stopped. --host NAME: that member's own releases.
    """
    import dataclasses
    import json

    from orchestrator.apply import history as get_history
    from orchestrator.apply import pool_line, qualification_line

    if profile_path is not None and host_name is None:
        from orchestrator.planner.fleet import load_fleet, plan_fleet

        fctx = load_fleet(profile_path, inventory)
        if fctx.is_fleet:
            from orchestrator.cli.fleet_cmd import fleet_history

            return fleet_history(plan_fleet(fctx), dict(fctx.all_hosts), fmt)
    name, host = resolve_host(profile_path, inventory, host_name)
    rows = get_history(name, host)
    if chosen_format(fmt) == "json":
        echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2), raw=True)
        return 0
    if not rows:
        _echo(f"no releases on host '{name}'")
        return 0
    for r in rows:
        mark = "*" if r.current else " "
        line = f"{mark} {r.id}  {r.status:<15} {r.reason}"
        if r.restarted:
            line += f"  restarted: {', '.join(r.restarted)}"
        _echo(line)
        if r.qualification is not None:
            _echo(f"      qualify {qualification_line(r.qualification)}")
        if r.failed_step and r.qualification is not None and r.failed_step.startswith("qualify:"):
            _echo("      failed at qualify (why: the qualify line above)")
        elif r.failed_step:
            _echo(f"      failed at {r.failed_step}")
        for m in r.pool:
            _echo(f"      {pool_line(m)}")
        for role, ops in r.kernel_paths.items():
            _echo(f"      kernel paths {role}: "
                  + ", ".join(f"{op} {path}" for op, path in ops.items()))
        for k in r.kernels:
            _echo(f"      kernels {k['role']} (pid {k['pid']}, when verified healthy): "
                  f"{k['loaded']}")
        for e in r.events:
            _echo(f"      {e}")
    _echo("(* = current)")
    return 0


@click.command()
@profile_option()
@_inventory_opt
@_host_opt
@format_option(("text", "json", "prometheus"),
               help_text="prometheus: dsv4ctl's own metrics (the node-exporter textfile's, plus "
                         "dsv4ctl_role_healthy per role right now).")
@accept_new_host_key_opt
@verbose_option()
def status(profile_path: Path | None, inventory: Path | None, host_name: str | None,
           fmt: str) -> int:
    """Current release, each role's health, and drift (files vs manifest, profile vs engine).

    Exit 0 when every role is healthy and nothing drifted, 1 otherwise (in every format).

    With -p FLEET-PROFILE and no --host: per host its current release, health, lock holder and
    whether the router lists its engines healthy; a rollout running now; the last rollout or
    fleet rollback and where it stopped. Exit 0 only when every host is healthy and in the
    router. --host NAME: that member alone, as one host.
    """
    from orchestrator.apply import status as get_status

    if profile_path is not None and host_name is None:
        from orchestrator.planner.fleet import load_fleet, plan_fleet

        fctx = load_fleet(profile_path, inventory)
        if fctx.is_fleet:
            from orchestrator.cli.fleet_cmd import fleet_status

            return fleet_status(plan_fleet(fctx), dict(fctx.all_hosts), fmt)
    name, host = resolve_host(profile_path, inventory, host_name)
    rep = get_status(name, host)
    code = 0 if (rep.healthy and not rep.file_drift and not rep.profile_drift
                  and not rep.pool_drift) else 1
    if fmt == "prometheus":
        from orchestrator.monitoring.selfmetrics import status_text

        echo(status_text(rep.metrics, rep.roles_healthy()), nl=False, raw=True)
        return code
    if fmt == "json":
        import json

        echo(raw=True, message=json.dumps({
            "host": rep.host, "deployment": rep.deployment, "current": rep.current,
            "current_status": rep.current_status, "locked_by": rep.locked_by,
            "healthy": rep.healthy,
            "roles": [{"role": r, "ok": ok, "message": m} for r, ok, m in rep.roles],
            "units": rep.units,
            "file_drift": rep.file_drift, "profile_drift": rep.profile_drift,
            "pool_drift": rep.pool_drift,
            "endpoints": [{"name": e.name, "url": e.url, "exposure": e.exposure, "key": e.key,
                           "client_facing": e.client_facing} for e in rep.endpoints]},
            indent=2))
        return code
    _echo(f"host {name}: current release {rep.current or 'none'}"
          + (f" ({rep.current_status})" if rep.current_status else ""))
    if rep.locked_by:
        _echo(f"  locked by {rep.locked_by}")
    pids = {u["role"]: u for u in rep.units}
    for role, ok, msg in rep.roles:
        u = pids.get(role)
        unit = (f" [{u['unit']} {u['active']} pid {u['pid']}, {u['restarts']} restarts"
                + (f"; kernels: {u['kernels']}" if u.get("kernels") else "") + "]"
                if u else "")
        _echo(f"  {'✓' if ok else '✗'} {role}: {msg}{unit}")
    for d in rep.file_drift:
        _echo(f"  drift (files): {d}")
    for d in rep.profile_drift:
        _echo(f"  drift (engine): {d}")
    for d in rep.pool_drift:
        _echo(f"  drift (pool): {d}")
    if not rep.file_drift and not rep.profile_drift and not rep.pool_drift and rep.current:
        _echo("  no drift")
    if rep.endpoints:  # where clients connect, last
        _echo("Endpoints:")
        for e in rep.endpoints:
            _echo(f"  {e.line()}")
    return code


@click.command()
@profile_option()
@_inventory_opt
@_host_opt
@click.option("--force", is_flag=True, help="End the holder's lock process (after showing it).")
@accept_new_host_key_opt
@verbose_option()
def unlock(profile_path: Path | None, inventory: Path | None, host_name: str | None,
           force: bool) -> int:
    """Show who holds the host lock; with --force, end the holder and free it.

    The lock is kernel-held and disappears with its holder's SSH session, so this is only for a
    holder that hangs (e.g. a half-open connection). Use it only when sure that run is dead.
    """
    from orchestrator.apply import unlock as do_unlock

    name, host = resolve_host(profile_path, inventory, host_name)
    free = do_unlock(name, host, force=force, out=_echo)
    return 0 if free else int(ExitCode.LOCKED)


def register(group: click.Group) -> None:
    for cmd in (apply, rollback, history, status, unlock):
        group.add_command(cmd)
