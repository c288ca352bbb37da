"""Which hosts a profile targets and what each host's part of it resolves to, before any plan.

Owns the profile's hosts (``host:`` is the fleet of one, ``hosts:`` a group or a list, ``--host``
an override), the inventory lookup every command that names a host goes through, where each part
of a fleet runs (:class:`~orchestrator.deployment.Placement`: the roles per host, the router's
host, the address each host's engines are reached at), one host's :class:`PlanContext`, the
catalog entries a profile names, and the deployment a context resolves to. Split from
:mod:`.build` (the plan) and :mod:`.fleet` (the fleet's plan) so that both, and
:mod:`.static`, build on it without importing each other.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import kernel_paths
from orchestrator.catalog import Catalog, EngineRules, ModelVariant, UnknownCatalogEntry, load_catalog
from orchestrator.deployment import LOOPBACK, Deployment, Placement, resolve
from orchestrator.errors import InputError, Problem, ProfileError
from orchestrator.facts import Facts
from orchestrator.profile.inventory import Host, Inventory
from orchestrator.profile.loader import locate
from orchestrator.profile.schema import ColocatedTopology, PDTopology, Profile


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


@dataclass(frozen=True)
class FleetContext:
    """A profile and the hosts it targets, resolved against the inventory."""

    profile: Profile
    profile_path: Path | None
    profile_text: str
    inventory_path: Path | None
    hosts: tuple[tuple[str, Host], ...]  # the engine hosts, in rollout order
    router_host: tuple[str, Host] | None  # a host of the router's own (not an engine host)
    placement: Placement
    focus: tuple[str, ...] = ()  # the hosts `--host NAME` named (what `plan --live` probes)

    @property
    def all_hosts(self) -> tuple[tuple[str, Host], ...]:
        """Every host the fleet touches: the engine hosts, then the router's own host."""
        return self.hosts + ((self.router_host,) if self.router_host else ())

    def context(self, name: str, host: Host) -> PlanContext:
        return PlanContext(self.profile, self.profile_path, self.profile_text, name, host,
                           self.inventory_path, self.placement if self.is_fleet else None)

    @property
    def is_fleet(self) -> bool:
        """More than the fleet of one (several hosts, or a router on a host of its own)."""
        return len(self.hosts) > 1 or self.router_host is not None


def _no_inventory(what: str) -> ProfileError:
    return ProfileError(
        f"hosts = {what} names inventory hosts, but no inventory was found",
        fix="pass --inventory PATH (or set DSV4CTL_INVENTORY) or put inventory.yaml beside the "
            "profile")


def fleet_hosts(profile: Profile, inventory: Inventory | None, inventory_path: Path | None,
                target: str | list[str] | None = None) -> list[tuple[str, Host]]:
    """The hosts ``hosts:`` (or ``target``) names, in its order: a group's members, or a list of
    host names (top-level or group members)."""
    target = target if target is not None else profile.hosts
    assert target is not None
    if inventory is None:
        raise _no_inventory(repr(target))
    every = inventory.all_hosts()
    if isinstance(target, str):
        if target in inventory.groups:
            return list(inventory.groups[target].members.items())
        if target in every:
            return [(target, every[target])]
        known = ", ".join(sorted(inventory.groups)) or "(none)"
        raise ProfileError(
            f"hosts = {target!r} is neither a group nor a host of {inventory_path}; its groups: "
            f"{known}", fix=f"use a group name ({known}) or a list of host names, or add group "
                            f"'{target}' under 'groups:' in the inventory")
    missing = [h for h in target if h not in every]
    if missing:
        known = ", ".join(sorted(every))
        raise ProfileError(
            f"hosts lists {', '.join(repr(m) for m in missing)}, not in {inventory_path}; it "
            f"declares: {known}", fix=f"use hosts the inventory declares ({known}) or add them")
    return [(h, every[h]) for h in target]


def service_address(name: str, host: Host) -> str:
    """The address another host reaches this host's engines at: ``service_address``, else the
    SSH address when it is an IP literal."""
    if host.service_address is not None:
        return host.service_address
    try:
        ipaddress.ip_address(host.address)
    except ValueError:
        raise ProfileError(
            f"host '{name}': address = {host.address!r} is a name, and the engines of a fleet "
            "must listen on an IP address the other hosts reach",
            fix=f"set service_address: <its IP on the hosts' private network> for '{name}' in "
                "the inventory") from None
    return host.address


def placement_of(profile: Profile, hosts: list[tuple[str, Host]],
                 inventory: Inventory | None) -> tuple[Placement, tuple[str, Host] | None]:
    """Which host runs which role and the router; a router on a host outside the fleet comes
    back as the second value."""
    names = [n for n, _ in hosts]
    topo = profile.topology
    roles: list[tuple[str, tuple[str, ...]]] = []
    for role, spec in profile.roles().items():
        on = spec.hosts if spec.hosts is not None else names
        stray = [h for h in on if h not in names]
        if stray:
            raise ProfileError(
                f"topology.{role}.hosts = {list(on)}: {', '.join(stray)} not in the fleet "
                f"({', '.join(names)})", fix=f"name hosts of the fleet, or add {stray[0]} to hosts:")
        roles.append((role, tuple(h for h in names if h in on)))
    if isinstance(topo, PDTopology):
        for role, on in roles:
            if not on:
                raise ProfileError(f"topology.{role}.hosts: no fleet host runs the {role} role",
                                   fix=f"name at least one fleet host under topology.{role}.hosts")
    router_conf = topo.router
    single = len(hosts) == 1
    wants_router = isinstance(topo, PDTopology) or not single or router_conf is not None
    router_on: str | None = None
    own: tuple[str, Host] | None = None
    if wants_router:
        router_on = (router_conf.runs_on if router_conf is not None and router_conf.runs_on else names[0])
        if router_on not in names:
            every = inventory.all_hosts() if inventory is not None else {}
            if router_on not in every:
                raise ProfileError(
                    f"topology.router.runs_on = {router_on!r} is not an inventory host",
                    fix=f"name a fleet host ({', '.join(names)}) or an inventory host of the "
                        "router's own")
            own = (router_on, every[router_on])
    if single and own is None and isinstance(topo, ColocatedTopology) and router_conf is None:
        router_on = None
    cross = single and own is None
    addresses = tuple((n, LOOPBACK if cross else service_address(n, h)) for n, h in hosts)
    if own is not None:
        addresses += ((own[0], service_address(*own)),)
    return Placement(hosts=tuple(names), addresses=addresses, roles=tuple(roles),
                     router_on=router_on), own


def load_fleet(profile_path: Path | None, inventory_path: Path | None, *,
               host_override: str | None = None) -> FleetContext:
    """The profile, its inventory and the hosts it targets. ``host_override`` (``--host NAME``):
    a host of the profile's fleet keeps the fleet (that host is the one probed live); a group
    plans every member; any other inventory host plans the profile there as the fleet of one."""
    from orchestrator.paths import default_profile
    from orchestrator.profile.loader import load_text, read_file

    path = profile_path or default_profile()
    text = read_file(path)
    return fleet_context(load_text(Profile, text, str(path)), text, path, inventory_path,
                         host_override=host_override)


def fleet_context(profile: Profile, text: str, path: Path | None, inventory_path: Path | None,
                  *, host_override: str | None = None) -> FleetContext:
    """:func:`load_fleet` for a profile already loaded (render and diff load from git too)."""
    from orchestrator.profile.loader import load_inventory

    inv_path = inventory_path_for(path, inventory_path)
    needs = host_override is not None or not isinstance(profile.host, Host)
    inventory = load_inventory(inv_path) if (inv_path is not None and needs) else None
    if profile.hosts is not None:
        hosts = fleet_hosts(profile, inventory, inv_path)
    else:
        hosts = [host_of(profile, inventory, inv_path)] if host_override is None else []
    focus: tuple[str, ...] = ()
    if host_override is not None:
        if inventory is not None and host_override in inventory.groups:
            hosts = fleet_hosts(profile, inventory, inv_path, host_override)
            focus = tuple(n for n, _ in hosts)
        elif host_override in [n for n, _ in hosts]:
            focus = (host_override,)
        else:
            hosts = [host_of(profile, inventory, inv_path, host_override)]
            focus = (host_override,)
    placement, own = placement_of(profile, hosts, inventory)
    return FleetContext(profile, path, text, inv_path, tuple(hosts), own, placement, focus)


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
    """The profile resolved for the host, every default filled (the stability window too), each
    role's kernel paths decided from the inventory's GPU model and no measurement
    (``build_plan`` decides again from the facts it plans with)."""
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
    window, default = stability_window(ctx.profile, dep.router_version, cat)
    dep = dep.model_copy(update={"stability_window_s": window,
                                 "stability_window_default": default})
    return decide_kernels(cat, model, engine, dep, arch, None)


def stability_window(profile: Profile, router_version: str, cat: Catalog | None = None
                     ) -> tuple[float, bool]:
    """(seconds, whether it is the default): ``health.stability_window_s``, or the router's own
    time to drop a dead worker, its health-check interval x failure threshold from the catalog
    (sglang-router 0.3.2: 60 s x 3 = 180 s, research/sglang.md §3)."""
    from orchestrator.health import default_stability_window_s

    if profile.health.stability_window_s is not None:
        return float(profile.health.stability_window_s), False
    rules = (cat or load_catalog()).router("sglang-router", router_version)
    return default_stability_window_s(rules.defaults), True


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
