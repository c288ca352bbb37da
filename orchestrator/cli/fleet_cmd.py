"""The CLI side of the driver: what `dsv4ctl apply`, `rollback` and `unlock` run on, one host or
many, and how a run's end is printed.

Finds the run's targets once (:func:`orchestrator.planner.targets.resolve_targets`: the hosts,
the router, what ``--host`` selects) from a profile or a saved plan, probes the hosts the run
needs (keeping each probe's connection for the run: one SSH connection per host), shows the plan,
asks once (naming every host a secrets rotation restarts), then prints the outcome: the fleet of
one as the single host always printed it (its own result, its exit code), a fleet as its hosts'
outcomes, its journal and where clients connect (the router, then every engine host's engines).
The commands themselves are in :mod:`.apply_cmd`; shared helpers in :mod:`.common`. Past ~400
lines (~430): one flow from targets to the printed end, read top to bottom; the seam, if it grows,
is the printing of a run's end (one host or a fleet, text or JSON) into its own module.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.cli.common import command_line, confirm, is_plan_file, print_result, say
from orchestrator.cli.output import chosen_format, echo
from orchestrator.errors import DsvError
from orchestrator.planner.targets import Targets


def strategy_of(profile: Any) -> Any:
    """``rollout.strategy`` of the profile as the rollout engine's Strategy (the defaults for a
    host named without a profile: one host, one wave)."""
    from orchestrator.apply.rollout import Strategy

    if profile is None:
        return Strategy()
    s = profile.rollout.strategy
    return Strategy(canary=s.canary, max_unavailable=s.max_unavailable,
                    max_failures=s.max_failures, pause_s=s.pause_s,
                    drain_timeout_s=s.drain_timeout_s)


def _groups(inv_path: Path | None) -> dict[str, list[str]]:
    """The inventory's groups and their members, for ``--host GROUP``."""
    if inv_path is None:
        return {}
    from orchestrator.profile import load_inventory

    return {g: list(grp.members) for g, grp in load_inventory(inv_path).groups.items()}


@dataclass
class Run:
    """What one apply runs on: the targets, their hosts and plans, the profile (its strategy)
    and the connections the probe left open (the driver's from here on)."""

    targets: Targets
    hosts: dict[str, Any]
    plans: dict[str, Any]
    profile: Any
    saved: bool
    fleet: Any = None  # the FleetPlan shown (the moved hosts' plans)
    remotes: dict[str, Any] = field(default_factory=dict)
    # each probed host's facts, read over its connection in ``remotes`` for this very run
    # (a profile's run; a saved plan's are probed again under the lock)
    facts: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Close the probe's connections when the run does not start (an error, a "no")."""
        for r in self.remotes.values():
            with contextlib.suppress(Exception):  # best effort: the error shown is the cause
                r.close()
        self.remotes.clear()


def _saved_run(path: Path, inventory: Path | None, selector: str | None) -> Run:
    """A saved plan: one host's (its own host, or --host) or a fleet's (narrowed by --host)."""
    import json

    from orchestrator.apply.context import profile_from_plan
    from orchestrator.planner.build import inventory_path_for, load_fleet_plan, load_plan

    try:
        kind = json.loads(path.read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None  # load_plan reports what is wrong with it
    if kind != "fleet":
        from orchestrator.cli.common import resolve_host
        from orchestrator.planner.targets import one_host

        plan = load_plan(path)
        name, host = resolve_host(None, inventory, selector or plan.host)
        return Run(one_host(name, plan.profile_name), {name: host}, {name: plan},
                   profile_from_plan(plan), True)
    from orchestrator.apply.fleet_ops import targets_of
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
    targets = targets_of(fleet, selector=selector, groups=_groups(inv_path))
    return Run(targets, {n: every[n] for n in names}, {p.host: p for p in fleet.plans},
               profile_from_plan(fleet.plans[0]), True, fleet=fleet)


def profile_targets(path: Path, inventory: Path | None, selector: str | None
                    ) -> tuple[Any, Targets]:
    """(FleetContext, targets) of a profile and ``--host``, decided with no connection: a fleet's
    members (narrowed by --host), or a one-host profile on the host --host names (a group: the
    profile on it). The one rule of which deployment an apply acts on; the suite's check that
    a printed command acts on its run's deployment asks it too (tests/printed_commands.py)."""
    from orchestrator.planner.fleet import load_fleet
    from orchestrator.planner.targets import one_host, resolve_targets

    fctx = load_fleet(path, inventory)
    if fctx.profile.hosts is None and selector is not None:
        fctx = load_fleet(path, inventory, host_override=selector)
        selector = None
    if fctx.is_fleet:
        names = [n for n, _ in fctx.hosts]
        own = fctx.router_host[0] if fctx.router_host else None
        return fctx, resolve_targets(fctx.profile.name, names, fctx.placement.router_on, own,
                                     selector=selector, groups=_groups(fctx.inventory_path))
    return fctx, one_host(fctx.hosts[0][0], fctx.profile.name,
                          router=fctx.placement.router_on is not None)


def source_targets(source: Path, inventory: Path | None, selector: str | None) -> Targets:
    """The targets of `dsv4ctl apply SOURCE [--host NAME]` with no connection: a saved plan's
    (:func:`_saved_run`) or a profile's (:func:`profile_targets`)."""
    if is_plan_file(source):
        return _saved_run(source, inventory, selector).targets
    return profile_targets(source, inventory, selector)[1]


def planned_run(path: Path, inventory: Path | None, selector: str | None) -> Run:
    """The run of `dsv4ctl apply SOURCE [--host NAME]`: a saved plan as saved, or the profile
    planned now against the live hosts the run touches (each probed over the connection the
    run then uses), the plan shown as `plan` shows it."""
    from orchestrator.planner.fleet import plan_fleet, probe_fleet

    if is_plan_file(path):
        return _saved_run(path, inventory, selector)
    fctx, targets = profile_targets(path, inventory, selector)
    hosts = dict(fctx.all_hosts)
    # the hosts this run reaches: the moved ones, the router's (to drain through it) and the
    # fleet lock's; each probe's connection is kept for the run
    need = list(dict.fromkeys([*targets.moved, *([targets.router_on] if targets.drain and
                                                 targets.router_on else []), targets.lock_on]))
    if targets.single:
        say(f"Probing host '{need[0]}' ({hosts[need[0]].address})...")
    else:
        say(f"Probing {len(need)} hosts in parallel ({', '.join(need)})...")
    from orchestrator.apply import probe_for_apply

    remotes: dict[str, Any] = {}
    guard = threading.Lock()
    model, env = fctx.profile.model.path, fctx.profile.engine.env

    def gather(name: str, host: Any) -> Any:
        remote, facts = probe_for_apply(name, host, model, engine_env=env)
        with guard:
            remotes[name] = remote
        return facts

    run = Run(targets, hosts, {}, fctx.profile, False, remotes=remotes)
    try:
        facts = probe_fleet(fctx, gather, only=tuple(need))
        run.facts = dict(facts)
        fleet = plan_fleet(fctx, facts)
        run.plans = {p.host: p for p in fleet.plans}
        shown = fleet if not targets.selected else fleet.model_copy(
            update={"plans": [p for p in fleet.plans if p.host in targets.moved]})
        run.fleet = shown
        from orchestrator.planner.fleet_report import render_fleet_text

        echo(render_fleet_text(shown), nl=False)  # what is about to happen, as `plan` shows it
        if targets.selected:
            say(f"--host {selector}: this run moves {', '.join(targets.moved)} only")
        return run
    except BaseException:
        run.close()
        raise


def confirm_apply(run: Run, yes: bool) -> None:
    """Refuse a plan with errors; ask once before changing a host: when the plan has changes,
    and when a secret's value differs from the one a host's running roles read, which no plan
    can show (values never enter it) — that restarts every running role there, so the question
    names each such host."""
    moved = [run.plans[h] for h in run.targets.moved]
    if run.saved:  # show, then ask: a saved plan's transition before the question
        from orchestrator.planner.report import transition_lines

        for p in moved:
            echo((f"host {p.host}: " if not run.targets.single else "")
                 + "\n".join(transition_lines(p.actions)))
    errors = [c for p in moved for c in p.errors]
    if run.fleet is not None and not run.targets.single:
        errors += [c for c in run.fleet.checks if c.severity == "error" and not c.acknowledged]
    # a saved plan of one host with errors is refused by its preflight, as it always was
    if errors and not (run.saved and run.targets.single):
        failed = [p.host for p in moved if p.errors]
        raise DsvError("the plan has errors" + (f" ({', '.join(failed)})" if failed and not
                                                run.targets.single else "")
                       + "; nothing was applied",
                       fix="fix the profile; `dsv4ctl plan` shows the checks")
    if yes:
        return
    from orchestrator.apply import secrets_would_restart

    rotate = [p.host for p in moved if p.host in run.remotes and
              secrets_would_restart(p, run.hosts[p.host], run.remotes[p.host])]
    changes = any(p.actions for p in moved)
    if not changes and not rotate:
        return
    restarts = sorted({r for p in moved for r in p.restarts})
    if run.targets.single:
        what = f"Apply {moved[0].profile_name} to host '{moved[0].host}'"
        tail = f"; restarts {', '.join(restarts)} (model reload)" if restarts else ""
        if rotate:
            echo("Secrets: a value differs from the one the host's running roles read (values "
                 "not shown); every running role restarts at the switch (model reload).")
            tail += "; restarts every running role for the changed secrets"
        confirm("apply", what + tail + "?")
        return
    s = run.profile.rollout.strategy
    tail = ""
    if rotate:
        echo(f"Secrets: a value differs from the one the running roles read on "
             f"{', '.join(rotate)} (values not shown); every running role there restarts at its "
             "switch (model reload).")
        tail = f"; restarts every running role on {', '.join(rotate)} for the changed secrets"
    confirm("apply", f"Roll {run.targets.profile_name} out to {run.targets.describe()} (canary "
                     f"{s.canary}, then {s.max_unavailable} at a time){tail}?")


def _json_document(result: Any, ops: Any, where: str | None, verb: str) -> int:
    """``apply/rollback --format json``: one document on stdout at the end (the progress went to
    stderr): each host's outcome, result, what was done and not and how to recover, and the
    exit code the run returns (the same as the text run's)."""
    import json

    from orchestrator.apply.executor import raise_for
    from orchestrator.cli.output import echo
    from orchestrator.cli.rerun import complete

    hosts: dict[str, Any] = {}
    code = 0
    for h in ops.targets.moved:
        res, err = ops.results.get(h), result.errors.get(h)
        entry: dict[str, Any] = {}
        if res is not None:
            entry = {"status": res.status, "release": res.release, "message": res.message,
                     "done": list(res.done), "not_done": list(res.not_done),
                     "recovery": complete(res.recovery) if res.recovery else None,
                     "rolled_back_to": res.rolled_back_to}
            try:
                raise_for(res)
            except DsvError as exc:
                code = max(code, int(exc.exit_code))
        elif err is not None:
            entry = {"status": "refused", "message": getattr(err, "message", str(err)),
                     "fix": complete(err.fix) if getattr(err, "fix", None) else None}
            code = max(code, int(getattr(err, "exit_code", 1)))
        o = getattr(result, "outcomes", {}).get(h)
        if o is not None:
            entry.update(wave=o.wave + 1, state=o.state, drained=o.drained)
        hosts[h] = entry
    if not ops.targets.single and result.exit_code:
        code = int(result.exit_code)
    # where clients connect, as the text run ends with (none when the run did not end healthy)
    eps = [e.as_dict() for e in _end_endpoints(result, ops)] if code == 0 else []
    echo(json.dumps({"ok": code == 0, "command": verb.lower(), "exit_code": code,
                     "reason": result.reason, "journal": where, "hosts": hosts,
                     "endpoints": eps}, indent=2, sort_keys=True), raw=True)
    return code


def _end_endpoints(result: Any, ops: Any) -> list[Any]:
    """The endpoints a run ends with: the fleet of one, its host's result's; a fleet, the
    router's and every engine host's (:func:`orchestrator.apply.fleet_view.run_endpoints`)."""
    if ops.targets.single:
        res = ops.results.get(ops.targets.moved[0])
        return list(res.endpoints) if res is not None else []
    from orchestrator.apply.fleet_view import run_endpoints

    return run_endpoints(ops)


def finish(result: Any, ops: Any, where: str | None, *, what: str, verb: str) -> int:
    """Print a run's end. The fleet of one: its host's own result, as the single host always
    printed it (its exit code, its fix). A fleet: each host's outcome, where the journal is, and
    the stop (its exit code)."""
    from orchestrator.apply.rollout import RolloutStopped
    from orchestrator.cli.output import FORMAT

    t = ops.targets
    if FORMAT.get() == "json":
        return _json_document(result, ops, where, verb)
    if t.single:
        host = t.moved[0]
        if host in result.errors and host not in ops.results:
            raise result.errors[host]  # refused before its move began (lock, stale, no release)
        res = ops.results.get(host)
        if res is None:  # the rollout engine stopped it without a result of its own
            raise result.errors.get(host) or DsvError(result.reason or "the run stopped")
        if verb == "Rollback" and res.status == "healthy":
            say(res.message)
            return 0
        print_result(res, verb)
        return 0
    say("")
    for o in result.outcomes.values():
        drained = "" if o.drained is None else (", drained" if o.drained else ", drain timed out")
        say(f"  {o.host:<16} wave {o.wave + 1}: {o.state}{drained}"
            + (f" - {o.message}" if o.message else ""))
    out_of_router = [o.host for o in result.outcomes.values() if o.drained is not None
                     and o.state in ("rollback_failed", "failed")]
    if out_of_router:
        # honestly out: the one command that puts them back (a rollback resumes, an apply
        # re-plans what they serve) once the cause is fixed
        say(f"Out of the router: {', '.join(out_of_router)}; once fixed, this puts "
            f"{'it' if len(out_of_router) == 1 else 'them'} back: {command_line()}")
    if where is not None:
        say(f"The fleet's journal is {where}.")
    if result.exit_code:
        kept = ("hosts not reached still serve their previous release" if verb == "Apply" else
                "hosts not reached still serve the release they served")
        # the journals that say why: the hosts that failed or were rolled back (else every
        # host the run moved), each a command on its own, not a placeholder host NAME
        stopped = [o.host for o in result.failed] or list(t.moved)
        journals = ", ".join(f"`dsv4ctl history --host {shlex.quote(h)}`" for h in stopped)
        raise RolloutStopped(f"{what} stopped: {result.reason}", exit_code=result.exit_code,
                             fix=f"see the host's journal{'s' if len(stopped) > 1 else ''} "
                                 f"({journals}); {kept}")
    moved = sum(o.state == "moved" for o in result.outcomes.values())
    if verb == "Apply":
        say(f"Rollout complete: {moved} host(s) moved, "
            f"{sum(o.state == 'unchanged' for o in result.outcomes.values())} unchanged.")
    else:
        say(f"Rollback complete: {moved} host(s) back on their previous release.")
    from orchestrator.planner.endpoints import endpoint_lines

    for line in endpoint_lines(_end_endpoints(result, ops)):  # where clients connect, last
        say(line)
    return 0


def rollback_run(profile_path: Path | None, inventory: Path | None, selector: str | None
                 ) -> tuple[Targets, dict[str, Any], dict[str, Any], Any]:
    """(targets, hosts, plans, profile) of `dsv4ctl rollback`: a fleet's profile (narrowed by
    --host), one host's profile, or a host named alone (no fleet known: its host lock only)."""
    from orchestrator.cli.common import resolve_host
    from orchestrator.planner.targets import one_host

    if profile_path is not None:
        from orchestrator.apply.fleet_ops import targets_of
        from orchestrator.planner.fleet import load_fleet, plan_fleet

        fctx = load_fleet(profile_path, inventory)
        if fctx.is_fleet:
            fleet = plan_fleet(fctx)
            targets = targets_of(fleet, selector=selector, groups=_groups(fctx.inventory_path))
            return targets, dict(fctx.all_hosts), {p.host: p for p in fleet.plans}, fctx.profile
        name, host = resolve_host(profile_path, inventory, selector)
        return one_host(name, fctx.profile.name), {name: host}, {}, fctx.profile
    name, host = resolve_host(None, inventory, selector)
    return one_host(name), {name: host}, {}, None


def fleet_status(fleet: Any, hosts: Mapping[str, Any], fmt: str) -> int:
    """`status --profile FLEET`: per host its release, health and router membership, and where
    the last rollout stopped. Exit 0 only when every host is healthy and in the router."""
    import json

    from orchestrator.apply.fleet_view import fleet_status as read_status
    from orchestrator.apply.status import status as get_status
    from orchestrator.planner.endpoints import endpoint_lines

    st = read_status(fleet, dict(hosts), status=get_status, command=command_line())
    ok = st["router_answers"] and all(
        r["healthy"] and r["in_router"] is not False for r in st["hosts"])
    if fmt == "json":
        echo(json.dumps({**st, "endpoints": [e.as_dict() for e in st["endpoints"]]}, indent=2),
             raw=True)
        return 0 if ok else 1
    say(f"fleet {st['profile']}: router on {st['router_on']}"
        + ("" if st["router_answers"] else " (does not answer its worker API)"))
    for r in st["hosts"]:
        member = {True: "in router", False: "NOT in router", None: ""}[r["in_router"]]
        health = "healthy" if r["healthy"] else "NOT healthy"
        current = (r["current"] or "no release") + (
            f" ({r['current_status']})" if r["current_status"] not in (None, "healthy") else "")
        say(f"  {r['host']:<16} {r['role']:<7} {current:<34} {health:<12} {member}"
            + (f"  (locked by {r['locked_by']})" if r.get("locked_by") else "")
            + (f"  ({r['error']})" if r["error"] else ""))
    if st.get("in_progress"):
        say(f"a rollout or rollback is running now (fleet lock held by {st['in_progress']})")
    if st["last_rollout"]:
        _rollout_lines(st["last_rollout"], "last ")
    for line in endpoint_lines(st["endpoints"]):  # where clients connect, last
        say(line)
    return 0 if ok else 1


def fleet_history(fleet: Any, hosts: Mapping[str, Any], fmt: str) -> int:
    """`history --profile FLEET`: every rollout and fleet rollback, oldest first: which hosts
    moved (to which release), which were rolled back, cancelled or not reached, where it
    stopped."""
    import json

    from orchestrator.apply.fleet_view import fleet_history as read_history

    rollouts = read_history(fleet, dict(hosts), command=command_line())
    if chosen_format(fmt) == "json":
        echo(json.dumps(rollouts, indent=2), raw=True)
        return 0
    if not rollouts:
        say(f"no rollouts of {fleet.profile_name} recorded")
        return 0
    for r in rollouts:
        _rollout_lines(r, "")
    return 0


def _rollout_lines(r: dict[str, Any], prefix: str) -> None:
    """One fleet journal (a rollout or a fleet rollback): where it stopped, then each host."""
    if r.get("kind") == "unreadable":  # a journal that is not dsv4ctl's (host data, checked)
        say(f"{prefix}unreadable journal: {r.get('reason')}")
        return
    stop = r.get("stopped_after_wave")
    where = ("did not finish (the run was interrupted; a rollback re-run resumes it)"
             if r.get("state") == "running" else "completed" if stop is None else
             "stopped before the first switch" if stop < 0 else f"stopped after wave {stop + 1}")
    say(f"{prefix}{r.get('kind', 'rollout')} {r.get('started')}  exit {r.get('exit_code')}  "
        f"{where}" + (f": {r.get('reason')}" if stop is not None else ""))
    releases = r.get("releases") or {}
    prepared = r.get("prepared_not_switched") or {}
    for o in r.get("outcomes", []):
        h = o["host"]
        extra = (f" -> {releases[h]}" if releases.get(h) and o["state"] == "moved" else
                 f" ({prepared[h]} prepared, never switched to)" if prepared.get(h) else "")
        say(f"    {h:<16} wave {o['wave'] + 1}: {o['state']}{extra}")
    for a in r.get("analysis") or []:
        say(f"    canary analysis of {', '.join(a['hosts'])}: "
            f"{'passed' if a['passed'] else 'FAILED'}: {a['reason']}")
