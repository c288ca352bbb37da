"""`dsv4ctl apply`, `rollback`, `history`, `status` and `unlock`: the commands that touch a host.

Thin adapters: apply and rollback find their run (:mod:`.fleet_cmd`: one host or many, narrowed
by ``--host``), run the one driver (:mod:`orchestrator.apply.fleet_ops`) and print its end;
history, status and unlock call :mod:`orchestrator.apply.history`, :mod:`~orchestrator.apply.status`
and :mod:`~orchestrator.apply.unlock`. Failures come back as results and are mapped to the
documented exit codes by raising the typed errors the CLI boundary (:func:`orchestrator.cli.main`)
knows. fabric is imported only inside the command bodies. Just past 400 lines: five commands
with their help texts and status's three output formats.
"""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import (
    accept_new_host_key_opt,
    command_line,
    confirm,
    require_terminal,
    resolve_host,
    say,
)
from orchestrator.cli.options import host_option, inventory_option, profile_option, verbose_option
from orchestrator.cli.output import chosen_format, echo, format_option, json_alias_option

_inventory_opt = inventory_option()
_RUN_JSON = ("json: the progress goes to stderr and stdout gets one document at the end: each "
             "host's status, release, what was done and not, how to recover, and the exit code.")
_host_opt = host_option()


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
@format_option(("text", "json"), help_text=_RUN_JSON)
def apply(source: Path | None, inventory: Path | None, host_name: str | None, yes: bool,
          fmt: str) -> int:
    """Roll a profile (or a saved plan) out to its host, with health checks and rollback.

    \b
    SOURCE (or -p FILE) is a profile (planned now, against the live host) or a plan saved with
    `dsv4ctl plan PROFILE --live -o plan.json` (refused if the host changed since, or if it was
    already applied). Steps (playbooks/apply.yaml): preflight (facts, stale check, host lock),
    upload release, kernels, stop changed roles, switch current, units, start, wait healthy,
    smoke generation, qualification, record. A failure after the switch restores the last
    healthy release by itself. An apply without changes restarts nothing.

    One host is a fleet of one: the same run as a fleet's (the fleet lock, then each host's
    lock, which the fleet of one takes in one command; one SSH connection per host, the
    probe's). A fleet (a profile whose hosts: names a group or a list) rolls out wave by wave
    behind its router, each engine host drained first and put back after. --host NAME narrows
    the run to that member, or to an inventory group of members; for a one-host profile it
    names the host to apply it to.
    """
    from orchestrator.apply.fleet_ops import apply_fleet
    from orchestrator.cli.fleet_cmd import confirm_apply, finish, planned_run, strategy_of
    from orchestrator.paths import default_profile

    run = planned_run(source or default_profile(), inventory, host_name)
    t = run.targets
    try:
        confirm_apply(run, yes)
    except BaseException:
        run.close()
        raise
    name = t.moved[0]
    if t.single:
        host = run.hosts[name]
        say(f"Applying {run.plans[name].profile_name} to {name} (scope {host.scope}, root "
            f"{host.install_root})")
    else:
        s = run.profile.rollout.strategy
        say(f"Rolling {t.profile_name} out to {', '.join(t.moved)} (canary {s.canary}, "
            f"max_unavailable {s.max_unavailable}, max_failures {s.max_failures})")
    result, ops, where = apply_fleet(t, run.hosts, run.plans, strategy_of(run.profile),
                                     out=say, command=command_line(), saved=run.saved,
                                     remotes=run.remotes, facts=run.facts)
    return finish(result, ops, where, what=f"rollout of {t.profile_name}", verb="Apply")


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
@format_option(("text", "json"), help_text=_RUN_JSON)
def rollback(release: str | None, profile_path: Path | None, inventory: Path | None,
             host_name: str | None, yes: bool, fmt: str) -> int:
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
    from orchestrator.apply.fleet_rollback import check_release, rollback_fleet
    from orchestrator.cli.fleet_cmd import finish, rollback_run, strategy_of

    targets, hosts, plans, profile = rollback_run(profile_path, inventory, host_name)
    check_release(targets, release)
    to = f"release {release}" if release else (
        "the last healthy release before current" if targets.single else
        "its previous healthy release")
    if targets.single:
        question = _show_rollback(targets.moved[0], hosts[targets.moved[0]], release, yes)
    else:
        question = (f"Roll {targets.profile_name}'s {targets.describe()} back to {to}, draining "
                    "each through the router?")
        say(f"Rolling {targets.profile_name} back on {targets.describe()} to {to}")
    if not yes:
        confirm("rollback", question)
    result, ops, where = rollback_fleet(targets, hosts, plans, strategy_of(profile), out=say,
                                        command=command_line(), release=release)
    return finish(result, ops, where, what=f"rollback of {targets.profile_name}",
                  verb="Rollback")


def _show_rollback(name: str, host: object, release: str | None, yes: bool) -> str:
    """Show, then ask: the transition a rollback of one host makes (read from the host as its
    preflight reads it), printed before the question; returns the question."""
    if not yes:
        require_terminal("rollback")  # refuse before connecting: nobody could answer
    from orchestrator.apply.preview import preview_rollback
    from orchestrator.planner.report import transition_lines
    from orchestrator.planner.transition import roles_restarted

    target, actions, full = preview_rollback(name, host, release)
    if isinstance(actions, str):  # unreadable target: the rollback refuses it, changing nothing
        echo(f"Rollback of host '{name}' to {target}: cannot be shown ({actions})")
        return f"Roll host '{name}' back to {target} (its preflight will refuse it)?"
    down = ("a full outage: no engine of the current release keeps serving until the restored "
            "engines are ready (minutes)" if full else None)
    echo(f"Rollback of host '{name}' to {target}:")
    echo("\n".join(transition_lines(actions, down)))
    restarts = roles_restarted(actions)
    return (f"Roll host '{name}' back to {target}"
            + (f"; restarts {', '.join(restarts)}" if restarts else "; restarts nothing") + "?")


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

    from orchestrator.apply.history import history as get_history
    from orchestrator.apply.history import pool_line, qualification_line

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
        say(f"no releases on host '{name}'")
        return 0
    for r in rows:
        mark = "*" if r.current else " "
        line = f"{mark} {r.id}  {r.status:<15} {r.reason}"
        if r.restarted:
            line += f"  restarted: {', '.join(r.restarted)}"
        say(line)
        if r.qualification is not None:
            say(f"      qualify {qualification_line(r.qualification)}")
        if r.failed_step and r.qualification is not None and r.failed_step.startswith("qualify:"):
            say("      failed at qualify (why: the qualify line above)")
        elif r.failed_step:
            say(f"      failed at {r.failed_step}")
        for m in r.pool:
            say(f"      {pool_line(m)}")
        for role, ops in r.kernel_paths.items():
            say(f"      kernel paths {role}: "
                + ", ".join(f"{op} {path}" for op, path in ops.items()))
        for k in r.kernels:
            say(f"      kernels {k['role']} (pid {k['pid']}, when verified healthy): "
                  f"{k['loaded']}")
        for e in r.events:
            say(f"      {e}")
    say("(* = current)")
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
    from orchestrator.apply.status import status as get_status

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
            "endpoints": [e.as_dict() for e in rep.endpoints]},
            indent=2))
        return code
    say(f"host {name}: current release {rep.current or 'none'}"
          + (f" ({rep.current_status})" if rep.current_status else ""))
    if rep.locked_by:
        say(f"  locked by {rep.locked_by}")
    pids = {u["role"]: u for u in rep.units}
    for role, ok, msg in rep.roles:
        u = pids.get(role)
        unit = (f" [{u['unit']} {u['active']} pid {u['pid']}, {u['restarts']} restarts"
                + (f"; kernels: {u['kernels']}" if u.get("kernels") else "") + "]"
                if u else "")
        say(f"  {'✓' if ok else '✗'} {role}: {msg}{unit}")
    for d in rep.file_drift:
        say(f"  drift (files): {d}")
    for d in rep.profile_drift:
        say(f"  drift (engine): {d}")
    for d in rep.pool_drift:
        say(f"  drift (pool): {d}")
    if not rep.file_drift and not rep.profile_drift and not rep.pool_drift and rep.current:
        say("  no drift")
    from orchestrator.planner.endpoints import endpoint_lines

    for line in endpoint_lines(rep.endpoints):  # where clients connect, last
        say(line)
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
    """Show who holds the host's lock and the fleet's; with --force, end the holders.

    A run takes the fleet lock (-p FLEET-PROFILE: on the router's host) and then each host's
    own lock; unlock shows both, the fleet lock first (--host NAME: that member's lock).
    Both are kernel-held and disappear with their holder's SSH session, so this is only for a
    holder that hangs (e.g. a half-open connection). Use it only when sure that run is dead.
    """
    from orchestrator.apply.unlock import unlock as do_unlock
    from orchestrator.cli.fleet_cmd import rollback_run
    from orchestrator.errors import ExitCode

    targets, hosts, _, _ = rollback_run(profile_path, inventory, host_name)
    free = do_unlock(targets, hosts, force=force, out=say)
    return 0 if free else int(ExitCode.LOCKED)


def register(group: click.Group) -> None:
    for cmd in (apply, rollback, history, status, unlock):
        group.add_command(cmd)
