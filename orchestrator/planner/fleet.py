"""Fleets (issue 23): one profile on many hosts behind one router, planned host by host.

Owns which hosts a profile targets (``host:`` is the fleet of one, ``hosts:`` a group or a list),
where each part runs (:class:`~orchestrator.deployment.Placement`: the roles per host, the router's
host, the address each host's engines are reached at), and the fleet plan: every host planned by
:func:`orchestrator.planner.build.build_plan` with its own facts, plus the checks only the fleet can
make (cross-host PD transfer against the declared link). The single host goes through the same
functions; its fleet plan holds one plan, which ``dsv4ctl plan`` prints exactly as before.

The API the rollout engine builds on: :func:`load_fleet` (profile + inventory -> FleetContext),
:func:`probe_fleet` (live facts of every host, in parallel, with the caller's probe function: this
module imports no SSH library), :func:`plan_fleet` (-> :class:`FleetPlan`, the per-host plans in
rollout order and the router's placement). Cost is O(hosts): each host is planned once, the
profile's static checks once for the whole fleet.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.catalog import Catalog, load_catalog
from orchestrator.deployment import LOOPBACK, Placement
from orchestrator.errors import DsvError, ProfileError
from orchestrator.facts import Facts
from orchestrator.planner.checks import check
from orchestrator.planner.rollout import fleet_downtime
from orchestrator.planner.static import locate_checks, sort_checks, static_checks
from orchestrator.planner_model import Check, FleetPlan, Plan
from orchestrator.profile.inventory import Host, Inventory
from orchestrator.profile.schema import ColocatedTopology, PDTopology, Profile


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

    def context(self, name: str, host: Host):  # -> PlanContext (import cycle kept lazy)
        from orchestrator.planner.build import PlanContext

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
    from orchestrator.planner.build import host_of, inventory_path_for
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


def _named(exc: DsvError, host: str) -> DsvError:
    """The same error, its message saying which host of the fleet it is about."""
    if not exc.message.startswith(f"host '{host}'"):
        exc.message = f"host '{host}': {exc.message}"
        exc.args = (exc.message,)
    return exc


def probe_fleet(fctx: FleetContext, gather: Callable[[str, Host], Facts], *,
                only: tuple[str, ...] = (), max_workers: int = 16) -> dict[str, Facts]:
    """Live facts of every host of the fleet (or of ``only``), probed in parallel (``gather`` is
    the remote layer's probe). A host that cannot be probed fails the call, named."""
    hosts = tuple(h for h in fctx.all_hosts if not only or h[0] in only)

    def one(item: tuple[str, Host]) -> tuple[str, Facts]:
        name, host = item
        try:
            return name, gather(name, host)
        except DsvError as exc:
            raise _named(exc, name) from None

    if len(hosts) == 1:
        return dict([one(hosts[0])])
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(hosts)))) as pool:
        return dict(pool.map(one, hosts))


def plan_fleet(fctx: FleetContext, facts: Mapping[str, Facts] | None = None,
               cat: Catalog | None = None, *, replace_roles: Sequence[str] = ()) -> FleetPlan:
    """Every host planned with its own facts (declared unless ``facts`` has the host), in rollout
    order, and the fleet's own checks. One host that does not fit is an error of that host's plan;
    the others are planned all the same."""
    from orchestrator.planner.build import build_plan, catalog_entries, resolve_deployment

    cat = cat or load_catalog()
    facts = facts or {}
    engine, model = catalog_entries(cat, fctx.profile, str(fctx.profile_path), fctx.profile_text)
    # static checks read no host field: once for the fleet, on the whole topology
    name0, host0 = fctx.hosts[0]
    whole = resolve_deployment(replace(fctx.context(name0, host0), placement=None), cat)
    static = static_checks(cat, engine, model, whole, fctx.profile)
    known = {r.name for r in whole.roles} | ({"router"} if whole.router is not None else set())
    unknown = sorted(set(replace_roles) - known)
    if unknown:
        raise ProfileError(f"--replace {unknown[0]}: profile {fctx.profile.name!r} has no such "
                           f"role (it has {', '.join(sorted(known))})",
                           fix="name a role of the profile: " + ", ".join(sorted(known)))
    plans: list[Plan] = []
    for name, host in fctx.all_hosts:
        try:
            plans.append(build_plan(fctx.context(name, host), facts.get(name), cat, static=static,
                                    replace=replace_roles))
        except DsvError as exc:
            if not fctx.is_fleet:
                raise
            raise _named(exc, name) from None
    checks: list[Check] = []
    if fctx.is_fleet:
        from orchestrator.planner.rules import router_flag_checks

        on = fctx.placement.router_on
        router = next((p.deployment for p in plans if p.host == on), None)
        checks += router_flag_checks(router, fctx.profile) if router is not None else []
        checks += transfer_checks(fctx, plans)
    checks = sort_checks(locate_checks(checks, fctx.profile_text, str(fctx.profile_path)))
    engine_hosts = [n for n, _ in fctx.hosts]
    strategy = fctx.profile.rollout.strategy
    down = fleet_downtime(engine_hosts, {p.host: p.actions for p in plans},
                          {p.host: [r.name for r in p.deployment.roles] for p in plans},
                          strategy.canary, strategy.max_unavailable)
    return FleetPlan(
        downtime=down.text if down else None,
        outage=down.outage if down else None,
        profile_name=fctx.profile.name,
        profile_path=str(fctx.profile_path) if fctx.profile_path else None,
        hosts=[n for n, _ in fctx.hosts],
        router_on=fctx.placement.router_on,
        router_only_host=fctx.router_host[0] if fctx.router_host else None,
        placement=fctx.placement,
        checks=checks,
        plans=plans,
    )


def transfer_checks(fctx: FleetContext, plans: list[Plan]) -> list[Check]:
    """Cross-host PD: the KV of a request's prompt crosses the network from a prefill on one host
    to a decode on another (the router pairs any prefill with any decode). Estimate its bytes from
    the pool formula (bytes per token of the prefill's pools, planner/kvpool.py) and the declared
    link speed, and warn when it would dominate the declared TTFT budget."""
    topo = fctx.profile.topology
    place = fctx.placement
    if not isinstance(topo, PDTopology):
        return []
    pairs = [(p, d) for p in place.hosts_of("prefill") for d in place.hosts_of("decode") if p != d]
    if not pairs:
        return []
    by_host = {p.host: p for p in plans}
    hosts = dict(fctx.all_hosts)
    prompt = fctx.profile.workload.context_tokens
    budget = fctx.profile.monitoring.alerts.ttft_p95_s
    out: list[Check] = []
    seen: set[tuple[str, str]] = set()
    for pre, dec in pairs:
        cap = next((c for c in by_host[pre].capacity if c.role == "prefill"), None)
        if cap is None or cap.bytes_per_token <= 0:
            continue  # the prefill host did not fit: its own errors say why
        links = [hosts[h].link_gbps for h in (pre, dec)]
        if any(v is None for v in links):
            key = ("unknown", "")
            if key not in seen:
                seen.add(key)
                out.append(check(
                    "fleet.pd-link-unknown", "warning", "cross-host PD link speed not declared",
                    f"prefill on {pre} hands each request's KV cache to decode on {dec} over the "
                    f"network ({topo.transfer_backend}), but the inventory declares no link_gbps "
                    f"for {' and '.join(h for h, v in zip((pre, dec), links, strict=True) if v is None)}; "
                    "the transfer time cannot be estimated",
                    "declare link_gbps (e.g. 25 for 25GbE) on each host in the inventory",
                    field="topology.transfer_backend", subject=f"{pre}->{dec}"))
            continue
        gbps = min(v for v in links if v is not None)
        # DeepSeek-V4's KV is MLA-style, the same on every attention-TP rank: each decode rank
        # pulls its own copy from one prefill rank ("For MLA models, we can retrieve KVCache from
        # only one prefill rank", sglang 0.5.23 srt/disaggregation/common/conn.py L1483-1489),
        # so a request moves one copy per attention-TP rank of the decode engine
        dec_cap = next((c for c in by_host[dec].capacity if c.role == "decode"), None)
        copies = (dec_cap.tp // dec_cap.attn_dp) if dec_cap is not None else 1
        nbytes = int(cap.bytes_per_token * prompt) * copies
        seconds = nbytes * 8 / (gbps * 1e9)
        key = (f"{gbps:g}", "")
        if key in seen:
            continue
        seen.add(key)
        numbers = {"kv_bytes_per_request": nbytes, "bytes_per_token": round(cap.bytes_per_token, 1),
                   "prompt_tokens": prompt, "decode_rank_copies": copies, "link_gbps": gbps,
                   "transfer_s": round(seconds, 3), "ttft_budget_s": budget,
                   "max_requests_per_s": round(1 / seconds, 2)}
        what = (f"a {prompt:,}-token prompt (workload.context_tokens) moves "
                f"{nbytes / 2**30:.2f} GiB of KV per request from prefill on {pre} to decode on "
                f"{dec} ({cap.bytes_per_token:,.0f} B/token per rank by the pool formula, one copy "
                f"for each of the decode engine's {copies} attention-TP ranks); at "
                f"{gbps:g} Gbit/s (link_gbps, line rate) that is {seconds:.2f} s, and the link "
                f"carries at most {1 / seconds:,.1f} such requests per second")
        if seconds > budget / 2:
            out.append(check(
                "fleet.pd-transfer-dominates-ttft", "warning",
                "cross-host KV transfer would dominate TTFT",
                f"{what}, more than half the TTFT budget of {budget:g} s "
                "(monitoring.alerts.ttft_p95_s)",
                "keep prefill and decode on one host (topology.prefill.hosts = "
                "topology.decode.hosts per host group), use a faster link or RDMA (mooncake), or "
                "declare shorter prompts", field="topology.transfer_backend",
                subject=f"{pre}->{dec}", **numbers))
        else:
            out.append(check(
                "fleet.pd-transfer", "info", "cross-host KV transfer estimate",
                f"{what}, within half the TTFT budget of {budget:g} s", None,
                field="topology.transfer_backend", subject=f"{pre}->{dec}", **numbers))
    return out
