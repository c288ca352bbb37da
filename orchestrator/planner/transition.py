"""The transition model: what taking a host from its current release to a desired one does.

Owns the one decision that ``plan``, ``diff`` and ``apply``/``rollback`` all show or execute: the list
of actions (files added, changed, removed; units stopped, started, restarted), each with its reason
and the downtime it causes, computed by :func:`transition` from (current release, desired release,
the units that run). pyinfra's rule: the dry run is the apply code path. A reviewer approves the
list ``plan`` prints; ``apply`` recomputes it from the live host with this same function and refuses
to go on when it differs (the host moved), so what was approved is what runs. Summaries, exit codes
and JSON are counted from the list (:func:`orchestrator.planner_model.count_actions`), never from a
second computation.

A release is described by its manifest: ``{path: (sha256, roles)}`` where ``roles`` are the roles
that must restart when the file changes (:mod:`orchestrator.render` decides those). The unit file
``units/<unit>`` of a role carries that role, so the manifest alone says which unit runs which role.
Files that restart no role (``profile.yaml``, ``monitoring/prometheus.yml``) are still changes: a
release that differs only in them is a new release (issue 20 item 5: "No changes." with 5 to change).
A new kernels package changes ``kernels.json`` (:mod:`orchestrator.kernels_package`), read by every
engine role, so it restarts the engines like any change of their files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.deployment import Deployment
from orchestrator.planner_model import (
    ROLE_ORDER,
    UNIT_KINDS,
    Action,
    PlannedFile,
    roles_affected,
    roles_restarted,
)
from orchestrator.planner_model import role_key as _role_key

__all__ = ["ROLE_ORDER", "roles_affected", "roles_restarted"]  # their owner: planner_model

# Files that describe a release rather than configure a service: they differ between any two
# releases, so they are not actions of their own.
META_FILES = frozenset({"manifest.json", "plan.json", "record.json"})
# systemd ActiveStates of a unit whose process exists or is about to (stop it before changing it)
ALIVE = frozenset({"active", "activating", "reloading", "deactivating"})


@dataclass(frozen=True)
class ReleaseFile:
    sha256: str | None
    roles: tuple[str, ...] = ()


Release = Mapping[str, ReleaseFile]


def release_from_manifest(doc: Any) -> dict[str, ReleaseFile]:
    """A release as its ``manifest.json`` (parsed) describes it; meta files left out."""
    files = doc.get("files", {}) if isinstance(doc, dict) else {}
    return {str(p): ReleaseFile(v.get("sha256"), tuple(v.get("roles") or ()))
            for p, v in sorted(files.items()) if p not in META_FILES}


def release_from_planned(files: Iterable[PlannedFile]) -> dict[str, ReleaseFile]:
    """The desired release of a plan."""
    return {f.path: ReleaseFile(f.sha256, tuple(f.roles)) for f in files
            if f.path not in META_FILES}


def release_from_facts(hashes: Mapping[str, str], roles: Mapping[str, Iterable[str]]
                       ) -> dict[str, ReleaseFile]:
    """The host's current release as probed (:class:`orchestrator.facts.Facts`)."""
    return {p: ReleaseFile(h, tuple(roles.get(p, ()))) for p, h in sorted(hashes.items())
            if p not in META_FILES}


def units_of(release: Release) -> dict[str, str]:
    """role -> unit of a release, in start order (from its ``units/<unit>`` files)."""
    out: dict[str, str] = {}
    for path, f in release.items():
        if path.startswith("units/") and path.count("/") == 1 and len(f.roles) == 1:
            out[f.roles[0]] = path.removeprefix("units/")
    return {r: out[r] for r in sorted(out, key=_role_key)}


def _downtime(role: str) -> str:
    return "seconds" if role == "router" else "minutes"


OUTSIDE = "changed outside dsv4ctl"
# the drift probe's key for a ``current`` whose release directory is gone (remote/drift.py)
RELEASE_DIR = "."


RUNNING = f"running command line differs from the release ({OUTSIDE})"


def running_drift(dep: Deployment | None, running: Mapping[str, list[str]]) -> dict[str, str]:
    """unit -> how its engine's running command line (``Facts.running``: the drift probe's)
    differs from the one ``dep`` renders, for each engine role whose unit runs: the comparison
    ``status`` makes (``render.secrets.command_line_difference``). ``plan --live`` and apply's
    preflight both ask here. Against the target's command line: where it differs from the
    current release's, the role's files change too and it restarts for them anyway."""
    from orchestrator.render.secrets import command_line_difference

    out = {}
    for role in dep.roles if dep is not None else ():
        words = running.get(role.unit)
        how = command_line_difference(dep, role, words) if words is not None else None
        if how:
            out[role.unit] = how
    return dict(sorted(out.items()))


def transition(current: Release | None, desired: Release,
               states: Mapping[str, str] | None = None, *,
               outside: Mapping[str, str] | None = None,
               running: Mapping[str, str] | None = None,
               replace: Iterable[str] = ()) -> list[Action]:
    """The actions that take a host from ``current`` (None: no release) to ``desired``.

    ``states``: unit -> systemd ActiveState now (a unit systemd does not know is absent); None
    means unknown, taken as "every unit of the current release is active" (offline plans and
    ``diff``). An ``active`` unit runs. A unit that is alive but not active (``activating``: a
    crash loop's auto-restart, a slow start) must be stopped before its files change under it, so
    a changed one is restarted; an unchanged one is started like any unit that does not run.
    Files come first (by path), then units in the order apply handles them: stops (router
    first), restarts, starts (engines first).

    ``outside``: drift, path -> how it differs from ``current``'s manifest (modified, missing, an
    installed unit modified; :data:`RELEASE_DIR` when the release directory is gone): the host
    does not hold ``current``'s file there, so it is a change like any other, with the reason
    "changed outside dsv4ctl", and it restarts the roles that read it. ``replace``: roles to
    restart whatever changed (``--replace ROLE``), through the same actions. ``running``: unit ->
    how the engine it runs differs from the release's command line (:func:`running_drift`): a
    running unit whose files do not change is restarted for it, with the reason :data:`RUNNING`.
    """
    outside = dict(outside or {})
    running = dict(running or {})
    gone = RELEASE_DIR in outside
    current = current or {}
    if outside:  # what the host really holds there is not current's file
        current = {p: ReleaseFile(None, f.roles) if p in outside else f
                   for p, f in current.items()}
    files: list[Action] = []
    touched: dict[str, list[str]] = {}  # role -> changed paths that role reads
    drifted: set[str] = set()
    for path in sorted(set(current) | set(desired)):
        old, new = current.get(path), desired.get(path)
        if old is not None and new is not None and old.sha256 == new.sha256 \
                and old.sha256 is not None:
            continue
        kind = "create" if old is None else "remove" if new is None else "change"
        roles = sorted({*(old.roles if old else ()), *(new.roles if new else ())}, key=_role_key)
        for r in roles:
            touched.setdefault(r, []).append(path)
        reason = ("read by " + ", ".join(roles)) if roles else ""
        if path in outside or (gone and kind == "create"):
            how = outside.get(path) or "release directory missing"
            reason = f"{OUTSIDE} ({how})" + (f"; {reason}" if reason else "")
            drifted.add(path)
        files.append(Action(kind=kind, target=path, roles=roles, reason=reason))

    old_units, new_units = units_of(current), units_of(desired)
    if states is None:
        states = dict.fromkeys(old_units.values(), "active")
    live = {u for u, st in states.items() if st == "active"}
    alive = {u for u, st in states.items() if st in ALIVE}
    new_names = set(new_units.values())
    stops: list[Action] = []
    for role, unit in reversed(old_units.items()):
        if unit not in new_names:
            why = (f"role {role} is not in the new release" if role not in new_units
                   else f"{role} now runs as {new_units[role]}")
            stops.append(Action(kind="stop", target=unit, roles=[role], reason=why,
                                downtime=_downtime(role) if unit in live else "none"))
    restarts: list[Action] = []
    starts: list[Action] = []
    replace = set(replace)
    for role, unit in new_units.items():
        changed = touched.get(role, [])
        why = _changed(changed, drifted) if changed else ""
        if role in replace and unit in alive and not (unit in old_units.values() and changed) \
                and unit in old_units.values():
            restarts.append(Action(kind="restart", target=unit, roles=[role],
                                   reason="replaced on request (--replace)",
                                   downtime=_downtime(role) if unit in live else "none"))
        elif unit in old_units.values() and changed:
            if unit in alive:
                restarts.append(Action(
                    kind="restart", target=unit, roles=[role],
                    reason=why + ("" if unit in live else f"; {states[unit]} now"),
                    downtime=_downtime(role) if unit in live else "none"))
            else:
                starts.append(Action(kind="start", target=unit, roles=[role],
                                     reason=why + "; not running"))
        elif unit not in old_units.values():
            if unit in alive:  # left running by something else (an earlier failed attempt)
                restarts.append(Action(kind="restart", target=unit, roles=[role],
                                       reason=(f"{OUTSIDE} (the current release's directory "
                                               "is missing)" if gone else
                                               "runs outside the current release"),
                                       downtime=_downtime(role) if unit in live else "none"))
            else:
                starts.append(Action(kind="start", target=unit, roles=[role],
                                     reason="new role" if role not in old_units
                                     else f"replaces {old_units[role]}"))
        elif unit not in live:
            starts.append(Action(kind="start", target=unit, roles=[role], reason="not running"))
        elif unit in running:  # the files agree, the process does not: it was started otherwise
            restarts.append(Action(kind="restart", target=unit, roles=[role],
                                   reason=f"{RUNNING}: {running[unit]}",
                                   downtime=_downtime(role)))
    restarts.reverse()  # stopped router first, like the stops; started engines first (below)
    return files + stops + restarts + starts


def _changed(paths: list[str], drifted: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    if paths and all(p in drifted for p in paths):
        return f"{shown} {OUTSIDE}"
    return f"{shown} changed" + (f" ({OUTSIDE}: {', '.join(p for p in paths if p in drifted)})"
                                 if any(p in drifted for p in paths) else "")


def between(old: Iterable[PlannedFile], new: Iterable[PlannedFile]) -> list[Action]:
    """The transition from one planned release to another, every unit of the old one running
    (``dsv4ctl diff``: what applying NEW to a host that runs OLD does)."""
    return transition(release_from_planned(old), release_from_planned(new), None)


def unit_plan(actions: Iterable[Action]) -> tuple[list[str], list[str]]:
    """(units to stop, in stop order; units to start, in start order): what apply executes."""
    acts = list(actions)
    stop = [a.target for a in acts if a.kind in ("stop", "restart")]
    start = [a.target for a in reversed(acts) if a.kind == "restart"]
    start += [a.target for a in acts if a.kind == "start"]
    return stop, _start_order(start, acts)


def _start_order(units: list[str], acts: list[Action]) -> list[str]:
    role = {a.target: a.roles[0] if a.roles else "" for a in acts if a.kind in UNIT_KINDS}
    return sorted(dict.fromkeys(units), key=lambda u: _role_key(role.get(u, "")))


def outage(actions: Iterable[Action], current: Release | None) -> bool:
    """True when no engine of the current release keeps serving through the change."""
    engines = {u for r, u in units_of(current or {}).items() if r != "router"}
    down = {a.target for a in actions if a.kind in ("stop", "restart")}
    return bool(engines) and engines <= down
