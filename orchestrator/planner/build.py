"""``build_plan``: profile + host facts + catalog → Plan. Pure: no network, no clock.

This is where the pieces meet: the resolved deployment, the catalog's weight arithmetic, the SGLang
0.5.23 KV-pool model, the engine's rules for this version, the host's GPUs and disks, the rendered
release tree, and the comparison with the host's current release. Same inputs, byte-identical plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator import __version__, kernel_paths
from orchestrator.catalog import Catalog, EngineRules, ModelVariant, UnknownCatalogEntry, load_catalog
from orchestrator.deployment import Deployment, Placement, resolve
from orchestrator.errors import InputError, Problem, ProfileError
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
from orchestrator.planner.exposure import exposure_checks
from orchestrator.planner.static import locate_checks, sort_checks, static_checks
from orchestrator.planner.transition import release_from_facts, release_from_planned, transition
from orchestrator.planner_model import Action, Check, FleetPlan, Plan, PlannedFile, PlanTarget
from orchestrator.profile.inventory import Host, Inventory
from orchestrator.profile.loader import locate, read_file
from orchestrator.profile.schema import Profile

_SavedT = TypeVar("_SavedT", bound=BaseModel)


@dataclass(frozen=True)
class PlanContext:
    profile: Profile
    profile_path: Path | None
    profile_text: str
    host_name: str
    host: Host
    inventory_path: Path | None
    placement: Placement | None = None  # a fleet's (planner/fleet.py); None: the fleet of one


def inventory_path_for(profile_path: Path | None, explicit: Path | None) -> Path | None:
    """``--inventory``, else ``inventory.yaml`` beside the profile, else ``./inventory.yaml``."""
    if explicit is not None:
        return explicit
    candidates = [profile_path.parent / "inventory.yaml"] if profile_path is not None else []
    candidates.append(Path("inventory.yaml"))
    found = next((c for c in candidates if c.is_file()), None)
    if found is not None:
        _trusted_inventory(found)
    return found


def _trusted_inventory(path: Path) -> None:
    """A discovered inventory (not one named with --inventory) decides where dsv4ctl connects and
    what it runs there: refuse one another user can write or replace (issue 31: an
    ./inventory.yaml in a world-writable directory, owned by another user, was used silently)."""
    import os
    import stat as st_

    me = os.geteuid()
    for what, p in (("it", path), ("its directory", path.resolve().parent)):
        try:
            s = os.stat(p)
        except OSError:
            continue
        why = None
        if s.st_uid not in (0, me):
            why = f"{what} is owned by uid {s.st_uid}, not by you or root"
        elif s.st_mode & 0o022:
            why = (f"{what} is writable by group or others (mode "
                   f"{st_.S_IMODE(s.st_mode):04o})")
        if why:
            raise ProfileError(
                f"found {path} but will not use it: {why}, so another user could point dsv4ctl "
                "at any machine", fix=f"pass --inventory {path} if you trust it, or chmod go-w "
                "it and its directory (or move it somewhere only you can write)")


def host_of(profile: Profile, inventory: Inventory | None, inventory_path: Path | None,
            override: str | None = None) -> tuple[str, Host]:
    """The host entry a profile deploys to (inline, or by name in the inventory). A fleet profile
    (``hosts:``) names its first host here; :mod:`orchestrator.planner.fleet` plans them all."""
    if override is None and isinstance(profile.host, Host):
        return profile.name, profile.host
    if override is None and profile.host is None:
        from orchestrator.planner.fleet import fleet_hosts

        return fleet_hosts(profile, inventory, inventory_path)[0]
    return lookup_host(override if override is not None else str(profile.host), inventory,
                       inventory_path)


def lookup_host(name: str, inventory: Inventory | None, inventory_path: Path | None
                ) -> tuple[str, Host]:
    """The inventory's host ``name`` (every command that names a host finds it here)."""
    if inventory is None:
        raise ProfileError(
            f"host = {name!r} names an inventory host, but no inventory was found",
            fix="pass --inventory PATH (or set DSV4CTL_INVENTORY), put inventory.yaml beside the "
                "profile, or define the host inline under 'host:'")
    hosts = inventory.all_hosts()
    if name not in hosts:
        known = ", ".join(sorted(hosts))
        raise ProfileError(
            f"host = {name!r} is not in {inventory_path}; it declares: {known}",
            fix=f"use one of: {known}, or add '{name}' to the inventory")
    return name, hosts[name]


def load_context(profile_path: Path | None, inventory_path: Path | None, *,
                 host_override: str | None = None) -> PlanContext:
    """One host's context: the profile's host, ``host_override``, or a fleet's first host (with
    the fleet's placement, so it resolves as that host's part of the fleet)."""
    from orchestrator.planner.fleet import load_fleet

    fctx = load_fleet(profile_path, inventory_path, host_override=host_override)
    hosts = dict(fctx.all_hosts)
    name = host_override if host_override in hosts else fctx.hosts[0][0]
    return fctx.context(name, hosts[name])


def catalog_entries(cat: Catalog, profile: Profile, ctx_path: str, text: str = ""
                    ) -> tuple[EngineRules, ModelVariant]:
    """The profile's engine version and model variant in the catalog; unknown ids are located
    problems with a did-you-mean."""
    problems = []
    engine: EngineRules | None = None
    model: ModelVariant | None = None

    def at(field: str) -> dict[str, int | None]:
        pos = locate(text, field) if text else None
        return {"line": pos[0], "column": pos[1]} if pos else {}

    try:
        engine = cat.engine(profile.engine.name, profile.engine.version)
    except UnknownCatalogEntry as exc:
        problems.append(Problem(
            "engine.version", exc.message, value=f"'{profile.engine.version}'", file=ctx_path,
            fix=f"{exc.fix}; `dsv4ctl catalog engines` lists them", **at("engine.version")))
    try:
        model = cat.model(profile.model.variant)
    except UnknownCatalogEntry as exc:
        problems.append(Problem(
            "model.variant", exc.message, value=f"'{profile.model.variant}'", file=ctx_path,
            fix=f"{exc.fix}; `dsv4ctl catalog models` lists them", **at("model.variant")))
    if problems or engine is None or model is None:
        raise InputError(kind=ctx_path, problems=problems)
    return engine, model


def resolve_deployment(ctx: PlanContext, cat: Catalog | None = None) -> Deployment:
    """The profile resolved for the host, each role's kernel paths decided from the inventory's
    GPU model and no measurement (``build_plan`` decides again from the facts it plans with)."""
    cat = cat or load_catalog()
    engine, model = catalog_entries(cat, ctx.profile, str(ctx.profile_path), ctx.profile_text)
    config = cat.config_of(model)
    dep = resolve(ctx.profile, ctx.host_name, ctx.host,
                  default_index_topk=config.index_topk.value,
                  max_context_length=config.max_position_embeddings.value,
                  placement=ctx.placement)
    arch = None
    gpus = getattr(ctx.host, "gpus", None)  # validate's stand-in host declares none
    if gpus is not None:
        try:
            arch = cat.gpu(gpus.model).arch
        except UnknownCatalogEntry:  # reported by the plan's GPU checks
            arch = None
    return decide_kernels(cat, model, engine, dep, arch, None)


def decide_kernels(cat: Catalog, model: ModelVariant, engine: EngineRules, dep: Deployment,
                   arch: str | None, facts: Facts | None) -> Deployment:
    """Each role's kernel paths (orchestrator.kernel_paths, the one owner), from the host's
    probed GPUs and stored kernel measurement when ``facts`` has them."""
    used = {g for r in dep.roles for g in r.gpus}
    names: tuple[str, ...] = ()
    measured: list[Any] = []
    if facts is not None and facts.source == "probed":
        names = tuple(sorted({g.name for g in facts.gpus if g.index in used}))
        measured = list(facts.kernel_qualification)
    return kernel_paths.decide(engine, dep, arch, cat.config_of(model).num_attention_heads.value,
                               dict(dep.kernel_choices), measured, names)


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
        actions = host_transition(files, facts, replace)
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


def host_transition(files: list[PlannedFile], facts: Facts, replace: Iterable[str] = ()
                    ) -> list[Action]:
    """The plan's actions: the transition from the host's current release (as probed, with what
    was changed on the host outside dsv4ctl) to these files, given the units that run, and the
    roles ``--replace`` restarts. Declared facts know no current release, so the plan is
    relative to an empty host."""
    current = (release_from_facts(facts.current_files, facts.current_roles)
               if facts.current_release is not None else None)
    states = {u.name: u.active for u in facts.units}
    return transition(current, release_from_planned(files), states, outside=facts.drift,
                      replace=replace)


def plan_from_paths(profile_path: Path | None, inventory_path: Path | None = None, *,
                    facts: Facts | None = None, host_override: str | None = None) -> Plan:
    """One host's plan: the profile's host, or ``host_override`` (in a fleet: that host's part of
    the fleet, planned with the fleet's placement). A fleet profile needs the host named:
    ``orchestrator.planner.fleet.plan_fleet`` plans them all."""
    from orchestrator.planner.fleet import load_fleet, plan_fleet

    fctx = load_fleet(profile_path, inventory_path, host_override=host_override)
    if host_override is None and fctx.is_fleet:
        raise ProfileError(
            f"profile {fctx.profile.name!r} targets a fleet ({', '.join(fctx.placement.hosts)}); "
            "one host's plan needs the host named",
            fix="name the host (--host NAME), or plan the whole fleet with `dsv4ctl plan`")
    name = host_override or fctx.hosts[0][0]
    fp = plan_fleet(fctx, {name: facts} if facts is not None else None)
    return fp.plan(name)  # catalog errors are DsvErrors already


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
