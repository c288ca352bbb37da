"""``build_plan``: profile + host facts + catalog → Plan. Pure: no network, no clock.

This is where the pieces meet: the resolved deployment, the catalog's weight arithmetic, the SGLang
0.5.23 KV-pool model, the engine's rules for this version, the host's GPUs and disks, the rendered
release tree, and the comparison with the host's current release. Same inputs, byte-identical plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator import __version__
from orchestrator.catalog import Catalog, load_catalog
from orchestrator.deployment import Deployment
from orchestrator.errors import InputError, Problem
from orchestrator.facts import Facts, declared_facts
from orchestrator.planner import capacity, rules
from orchestrator.planner.checks import (
    apply_acknowledgements,
    disk_rows,
    engine_env_checks,
    host_key_checks,
    host_topology_checks,
    inline_host_checks,
    secrets_checks,
    ssh_user_checks,
)
from orchestrator.planner.context import (
    PlanContext,
    catalog_entries,
    decide_kernels,
    host_of,
    inventory_path_for,
    load_fleet,
    lookup_host,
    resolve_deployment,
)
from orchestrator.planner.exposure import exposure_checks
from orchestrator.planner.static import locate_checks, sort_checks, static_checks
from orchestrator.planner.transition import (
    release_from_facts,
    release_from_planned,
    running_drift,
    transition,
)
from orchestrator.planner_model import Action, Check, FleetPlan, Plan, PlannedFile, PlanTarget
from orchestrator.profile.inventory import Host
from orchestrator.profile.loader import read_file

# one host's resolution, owned by .context, imported from here by the commands that plan one host
__all__ = ["PlanContext", "build_plan", "catalog_entries", "host_of", "inventory_path_for",
           "load_context", "lookup_host", "resolve_deployment"]

_SavedT = TypeVar("_SavedT", bound=BaseModel)


def load_context(profile_path: Path | None, inventory_path: Path | None, *,
                 host_override: str | None = None) -> PlanContext:
    """One host's context: the profile's host, ``host_override``, or a fleet's first host (with
    the fleet's placement, so it resolves as that host's part of the fleet)."""
    fctx = load_fleet(profile_path, inventory_path, host_override=host_override)
    hosts = dict(fctx.all_hosts)
    name = host_override if host_override in hosts else fctx.hosts[0][0]
    return fctx.context(name, hosts[name])


def build_plan(ctx: PlanContext, facts: Facts | None = None, cat: Catalog | None = None, *,
               static: list[Check] | None = None, replace: Iterable[str] = ()) -> Plan:
    """Everything ``dsv4ctl plan`` shows, as one value. Facts default to the host's declaration.
    ``static``: the profile's static checks when the caller has them already (a fleet computes
    them once for all its hosts: they read no host field)."""
    from orchestrator.render import render_release  # jinja2; still light (no torch/fabric)

    cat = cat or load_catalog()
    facts = facts or declared_facts(ctx.host_name, ctx.host)
    engine, model = catalog_entries(cat, ctx.profile, str(ctx.profile_path), ctx.profile_text)
    dep = resolve_deployment(ctx, cat)

    # the static half is exactly what `dsv4ctl validate` reports; the rest needs the host
    if static is None:
        static = static_checks(cat, engine, model, dep, ctx.profile)
    checks: list[Check] = [*static]
    checks += host_topology_checks(dep, facts)
    role_caps, gpu_rows, cap_checks, disks = [], [], [], []
    if dep.roles:  # a fleet's router-only host needs no GPU and no checkpoint
        gpu_checks, gpu = capacity.host_gpu(cat, facts, dep)
        checks += gpu_checks
        dep = decide_kernels(cat, model, engine, dep, gpu.arch if gpu else None, facts)
        if gpu is not None and not any(c.severity == "error" for c in checks):
            role_caps, gpu_rows, cap_checks = capacity.plan_capacity(
                cat, engine, model, dep, ctx.profile, gpu, facts)
        checks += cap_checks
        if gpu is not None:
            checks += rules.gpu_engine_checks(cat, engine, model, dep, gpu, ctx.host, static)
        disks, disk_checks = disk_rows(facts, dep.model_path, cat.checkpoint_bytes(model),
                                       dep.model_variant)
        checks += disk_checks
    checks += host_key_checks(ctx.host_name, ctx.host)
    checks += ssh_user_checks(ctx.host_name, ctx.host)
    checks += inline_host_checks(ctx.host_name, ctx.host, isinstance(ctx.profile.host, Host))
    checks += secrets_checks(dep)
    checks += exposure_checks(dep)
    checks += engine_env_checks(dep, facts)
    checks = apply_acknowledgements(
        checks, [(a.id, a.reason) for a in ctx.profile.acknowledge])
    checks = sort_checks(locate_checks(checks, ctx.profile_text, str(ctx.profile_path)))

    from orchestrator.render import RenderError

    try:
        tree = render_release(ctx.profile, dep)
    except RenderError:
        # what render refuses, the static checks report with its location (static.env_checks):
        # a plan with that error has no files to show, not a second, unlocated error
        if not any(c.severity == "error" for c in static):
            raise
        files: list[PlannedFile] = []
        actions: list[Action] = []
    else:
        files = [PlannedFile(path=p, mode=f.mode, sha256=f.sha256, roles=list(f.roles),
                             content=f.content)
                 for p, f in sorted(tree.files.items())]
        actions = host_transition(files, facts, replace, dep)
    return Plan(
        tool_version=__version__,
        profile_name=ctx.profile.name,
        profile_path=str(ctx.profile_path) if ctx.profile_path else None,
        profile_sha256=hashlib.sha256(ctx.profile_text.encode()).hexdigest(),
        host=ctx.host_name,
        facts_source=facts.source,
        facts_fingerprint=facts.fingerprint(),
        current_release=facts.current_release,
        deployment=dep,
        capacity=role_caps,
        gpus=gpu_rows,
        disks=disks,
        checks=checks,
        files=files,
        actions=actions,
        target=plan_target(ctx, facts),
        secret_sources={name: (f"env {ref.env}" if ref.env else f"file {ref.file}")
                        for name, ref in sorted(ctx.profile.secrets.items())},
        replace=sorted(replace),
    )


def plan_target(ctx: PlanContext, facts: Facts) -> PlanTarget:
    """The machine this plan is for, with the host key the probe saw (a saved plan is bound to
    it: apply refuses another machine, naming both)."""
    conn = facts.connection
    return _target("profile" if isinstance(ctx.profile.host, Host) else "inventory", ctx.host,
                   conn.host_key if conn else None, conn.peer if conn else None)


def plan_target_of(plan: Plan, host: Host) -> PlanTarget:
    """The target ``host`` is now, for comparing with a saved plan's (no key: not probed)."""
    return _target(plan.target.source if plan.target else "inventory", host, None, None)


def _target(source: str, h: Host, key: str | None, peer: str | None) -> PlanTarget:
    return PlanTarget(
        source=source, user=h.user, address=h.address, port=h.port,  # type: ignore[arg-type]
        jump=f"{h.jump.user}@{h.jump.address}:{h.jump.port}" if h.jump else None,
        known_hosts=h.known_hosts, host_key=key, peer=peer)


def host_transition(files: list[PlannedFile], facts: Facts, replace: Iterable[str] = (),
                    dep: Deployment | None = None) -> list[Action]:
    """The plan's actions: the transition from the host's current release (as probed, with what
    was changed on the host outside dsv4ctl) to these files, given the units that run, the
    command lines they run (against ``dep``'s), and the roles ``--replace`` restarts. Declared
    facts know no current release, so the plan is relative to an empty host."""
    current = (release_from_facts(facts.current_files, facts.current_roles)
               if facts.current_release is not None else None)
    states = {u.name: u.active for u in facts.units}
    return transition(current, release_from_planned(files), states, outside=facts.drift,
                      running=running_drift(dep, facts.running), replace=replace)


def save_plan(plan: Plan | FleetPlan, path: Path) -> None:
    """Write a plan for `dsv4ctl apply PLAN.json` (file contents included; secrets never are).
    A fleet's plan is one file with every host's plan."""
    data = plan.model_dump(mode="json")
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    from orchestrator.localfs import write_atomic

    write_atomic(path, text.encode("utf-8"), 0o644)  # explicit: not the operator's umask


def _read_saved_plan(path: Path) -> Any:
    """The JSON of a saved plan file; a clear error when it is not JSON (one owner for both
    loaders)."""
    text = read_file(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(kind=str(path), problems=[Problem(
            "", f"not a saved plan: invalid JSON ({exc.msg})", file=str(path), line=exc.lineno,
            column=exc.colno, fix="create one with `dsv4ctl plan PROFILE -o plan.json`")]) from None


def _validate_saved(model: type[_SavedT], data: Any, path: Path, fix: str) -> _SavedT:
    """``model.model_validate(data)``, a schema mismatch reported by its field, not a traceback."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(kind=str(path), problems=[Problem(
            ".".join(str(x) for x in first["loc"]), f"not a saved plan: {first['msg']}",
            file=str(path), fix=fix)]) from None


def load_fleet_plan(path: Path) -> FleetPlan:
    """A fleet's saved plan (``dsv4ctl plan FLEET-PROFILE -o plan.json``)."""
    data = _read_saved_plan(path)
    if not isinstance(data, dict) or data.get("kind") != "fleet" or data.get("format") != \
            FleetPlan.model_fields["format"].default:
        raise InputError(kind=str(path), problems=[Problem(
            "kind", "not a saved fleet plan of this dsv4ctl version", file=str(path),
            fix="re-run `dsv4ctl plan FLEET-PROFILE -o plan.json` with this dsv4ctl")])
    return _validate_saved(FleetPlan, data, path,
                           "re-run `dsv4ctl plan FLEET-PROFILE -o plan.json` with this dsv4ctl")


def load_plan(path: Path) -> Plan:
    """One host's saved plan (``dsv4ctl plan PROFILE -o plan.json``), for ``dsv4ctl apply``."""
    data = _read_saved_plan(path)
    if isinstance(data, dict) and data.get("kind") == "fleet":
        raise InputError(kind=str(path), problems=[Problem(
            "kind", f"a fleet's plan ({', '.join(map(str, data.get('hosts') or []))}), not one "
            "host's", file=str(path), value="'fleet'",
            fix="apply the fleet from its profile, or save one host's plan with "
                "`dsv4ctl plan PROFILE --host NAME --live -o plan.json`")])
    if not isinstance(data, dict) or data.get("format") != Plan.model_fields["format"].default:
        raise InputError(kind=str(path), problems=[Problem(
            "format", "not a saved plan of this dsv4ctl version", file=str(path),
            value=repr(data.get("format")) if isinstance(data, dict) else None,
            fix="re-run `dsv4ctl plan PROFILE -o plan.json` with this dsv4ctl")])
    plan = _validate_saved(Plan, data, path, "create it with `dsv4ctl plan PROFILE --live -o plan.json`")
    if any(f.content is None for f in plan.files):
        raise InputError(kind=str(path), problems=[Problem(
            "files", "the plan holds no file contents (a `--format json` print, not a saved plan)",
            file=str(path), fix="save plans with `dsv4ctl plan PROFILE --live -o plan.json`")])
    return plan
