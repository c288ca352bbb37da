"""The fleet side of `dsv4ctl apply`, `rollback`, `status` and `history` (issue 23): a profile
whose ``hosts:`` names a group is applied, rolled back and shown as a fleet.

Thin adapters over :mod:`orchestrator.apply.fleet_ops` (rollout, status, history) and
:mod:`orchestrator.apply.fleet_rollback`: find the fleet, call the library, print its outcome and
map it to the documented exit codes. The commands themselves are in :mod:`.apply_cmd`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.cli.apply_cmd import _command_line, _confirm, _echo, _is_plan_file
from orchestrator.cli.output import chosen_format, echo
from orchestrator.errors import DsvError


def strategy_of(profile: Any) -> Any:
    """``rollout.strategy`` of the profile as the rollout engine's Strategy."""
    from orchestrator.apply.rollout import Strategy

    s = profile.rollout.strategy
    return Strategy(canary=s.canary, max_unavailable=s.max_unavailable,
                    max_failures=s.max_failures, pause_s=s.pause_s,
                    drain_timeout_s=s.drain_timeout_s)


def fleet_source(path: Path, inventory: Path | None, host_name: str | None
                  ) -> tuple[Any, dict[str, Any], Any, bool] | None:
    """(fleet plan, hosts, profile, saved) when ``path`` is a fleet's profile (applied as a
    fleet unless ``--host`` names one host) or a saved fleet plan; None for one host."""
    import json

    if _is_plan_file(path):
        try:
            kind = json.loads(path.read_text(encoding="utf-8")).get("kind")
        except (OSError, ValueError, AttributeError):
            return None  # load_plan reports what is wrong with it
        if kind != "fleet":
            return None
        from orchestrator.apply.context import profile_from_plan
        from orchestrator.planner.build import inventory_path_for, load_fleet_plan
        from orchestrator.profile import load_inventory

        fleet = load_fleet_plan(path)
        inv_path = inventory_path_for(None, inventory)
        if inv_path is None:
            raise DsvError("a saved fleet plan needs the inventory of its hosts",
                           fix="pass --inventory PATH (or set DSV4CTL_INVENTORY)")
        every = load_inventory(inv_path).all_hosts()
        names = list(fleet.hosts) + ([fleet.router_only_host] if fleet.router_only_host else [])
        missing = [n for n in names if n not in every]
        if missing:
            raise DsvError(f"the fleet plan names host(s) {', '.join(missing)} that the inventory "
                           "does not declare", fix="apply it with the inventory it was made with")
        return fleet, {n: every[n] for n in names}, profile_from_plan(fleet.plans[0]), True
    from orchestrator.planner.fleet import load_fleet, plan_fleet, probe_fleet

    fctx = load_fleet(path, inventory, host_override=host_name)
    if not fctx.is_fleet or fctx.focus:
        return None
    from orchestrator.planner.fleet_report import render_fleet_text
    from orchestrator.remote import gather_facts

    names = [n for n, _ in fctx.all_hosts]
    _echo(f"Probing {len(names)} hosts in parallel ({', '.join(names)})...")
    paths, env = [fctx.profile.model.path], fctx.profile.engine.env
    facts = probe_fleet(fctx, lambda name, host: gather_facts(name, host, model_paths=paths,
                                                              engine_env=env))
    fleet = plan_fleet(fctx, facts)
    echo(render_fleet_text(fleet), nl=False)  # what is about to happen, as `plan` shows it
    return fleet, dict(fctx.all_hosts), fctx.profile, False


def apply_fleet(fleet: Any, hosts: dict[str, Any], profile: Any, saved: bool, *,
                 yes: bool) -> int:
    """A fleet's rolling/canary apply (issue 23): orchestrator.apply.rollout over every host."""
    from orchestrator.apply.fleet_ops import apply_fleet as roll_out

    if fleet.errors:
        raise DsvError(f"the fleet plan has errors ({', '.join(fleet.failed_hosts) or 'fleet'}); "
                       "nothing was applied", fix="`dsv4ctl plan` shows each host's checks")
    s = profile.rollout.strategy
    strategy = strategy_of(profile)
    every = list(fleet.hosts) + ([fleet.router_only_host] if fleet.router_only_host else [])
    if fleet.has_changes and not yes:
        _confirm("apply", f"Roll {fleet.profile_name} out to {len(every)} hosts (canary "
                          f"{s.canary}, then {s.max_unavailable} at a time)?")
    _echo(f"Rolling {fleet.profile_name} out to {', '.join(every)} (canary {s.canary}, "
          f"max_unavailable {s.max_unavailable}, max_failures {s.max_failures})")
    result, where = roll_out(fleet, hosts, strategy, out=_echo, command=_command_line(),
                                saved=saved)
    moved = _finish(result, where, f"rollout of {fleet.profile_name}",
                    "hosts not reached still serve their previous release")
    _echo(f"Rollout complete: {moved} host(s) moved, "
          f"{sum(o.state == 'unchanged' for o in result.outcomes.values())} unchanged.")
    return 0


def _finish(result: Any, where: str, what: str, not_reached: str) -> int:
    """Print a fleet run's outcomes and where its journal is; raise the stop (its exit code) or
    return how many hosts moved."""
    from orchestrator.apply.rollout import RolloutStopped

    _echo("")
    _outcomes(result)
    _echo(f"The fleet's journal is {where}.")
    if result.exit_code:
        raise RolloutStopped(f"{what} stopped: {result.reason}", exit_code=result.exit_code,
                             fix=f"see each host's journal (dsv4ctl history --host NAME); "
                                 f"{not_reached}")
    return sum(o.state == "moved" for o in result.outcomes.values())


def rollback_fleet(fleet: Any, hosts: dict[str, Any], profile: Any, *, only: str | None,
                   release: str | None, yes: bool) -> int:
    """`rollback -p FLEET-PROFILE [--host NAME] [RELEASE]`: the fleet (or one host) back to its
    previous release, wave by wave behind the router (orchestrator.apply.fleet_rollback)."""
    from orchestrator.apply.fleet_rollback import rollback_fleet as roll_back

    names = list(fleet.hosts) + ([fleet.router_only_host] if fleet.router_only_host else [])
    which = f"host '{only}'" if only else f"{len(names)} hosts ({', '.join(names)})"
    target = f"release {release}" if release else "its previous healthy release"
    if not yes:
        _confirm("rollback", f"Roll {fleet.profile_name}'s {which} back to {target}, draining "
                             "each through the router?")
    _echo(f"Rolling {fleet.profile_name} back on {which} to {target}")
    result, where = roll_back(fleet, hosts, strategy_of(profile), out=_echo,
                              command=_command_line(), only=only, release=release)
    moved = _finish(result, where, f"rollback of {fleet.profile_name}",
                    "hosts not reached still serve the release they served")
    _echo(f"Rollback complete: {moved} host(s) back on their previous release.")
    return 0


def _outcomes(result: Any) -> None:
    for o in result.outcomes.values():
        drained = "" if o.drained is None else (", drained" if o.drained else ", drain timed out")
        _echo(f"  {o.host:<16} wave {o.wave + 1}: {o.state}{drained}"
              + (f" - {o.message}" if o.message else ""))


def fleet_status(fleet: Any, hosts: dict[str, Any], fmt: str) -> int:
    """`status --profile FLEET`: per host its release, health and router membership, and where
    the last rollout stopped. Exit 0 only when every host is healthy and in the router."""
    import json

    from orchestrator.apply import status as get_status
    from orchestrator.apply.fleet_ops import fleet_status as read_status

    st = read_status(fleet, hosts, status=get_status, command=_command_line())
    ok = st["router_answers"] and all(
        r["healthy"] and r["in_router"] is not False for r in st["hosts"])
    if fmt == "json":
        echo(json.dumps(st, indent=2), raw=True)
        return 0 if ok else 1
    _echo(f"fleet {st['profile']}: router on {st['router_on']}"
          + ("" if st["router_answers"] else " (does not answer its worker API)"))
    for r in st["hosts"]:
        member = {True: "in router", False: "NOT in router", None: ""}[r["in_router"]]
        health = "healthy" if r["healthy"] else "NOT healthy"
        current = (r["current"] or "no release") + (
            f" ({r['current_status']})" if r["current_status"] not in (None, "healthy") else "")
        _echo(f"  {r['host']:<16} {r['role']:<7} {current:<34} {health:<12} {member}"
              + (f"  (locked by {r['locked_by']})" if r.get("locked_by") else "")
              + (f"  ({r['error']})" if r["error"] else ""))
    if st.get("in_progress"):
        _echo(f"a rollout or rollback is running now (fleet lock held by {st['in_progress']})")
    if st["last_rollout"]:
        _rollout_lines(st["last_rollout"], "last ")
    return 0 if ok else 1


def fleet_history(fleet: Any, hosts: dict[str, Any], fmt: str) -> int:
    """`history --profile FLEET`: every rollout and fleet rollback, oldest first: which hosts
    moved (to which release), which were rolled back, cancelled or not reached, where it
    stopped."""
    import json

    from orchestrator.apply.fleet_ops import fleet_history as read_history

    rollouts = read_history(fleet, hosts, command=_command_line())
    if chosen_format(fmt) == "json":
        echo(json.dumps(rollouts, indent=2), raw=True)
        return 0
    if not rollouts:
        _echo(f"no rollouts of {fleet.profile_name} recorded")
        return 0
    for r in rollouts:
        _rollout_lines(r, "")
    return 0


def _rollout_lines(r: dict[str, Any], prefix: str) -> None:
    """One fleet journal (a rollout or a fleet rollback): where it stopped, then each host."""
    if r.get("kind") == "unreadable":  # a journal that is not dsv4ctl's (host data, checked)
        _echo(f"{prefix}unreadable journal: {r.get('reason')}")
        return
    stop = r.get("stopped_after_wave")
    where = ("completed" if stop is None else "stopped before the first switch"
             if stop < 0 else f"stopped after wave {stop + 1}")
    _echo(f"{prefix}{r.get('kind', 'rollout')} {r.get('started')}  exit {r.get('exit_code')}  "
          f"{where}" + (f": {r.get('reason')}" if stop is not None else ""))
    releases = r.get("releases") or {}
    prepared = r.get("prepared_not_switched") or {}
    for o in r.get("outcomes", []):
        h = o["host"]
        extra = (f" -> {releases[h]}" if releases.get(h) and o["state"] == "moved" else
                 f" ({prepared[h]} prepared, never switched to)" if prepared.get(h) else "")
        _echo(f"    {h:<16} wave {o['wave'] + 1}: {o['state']}{extra}")
