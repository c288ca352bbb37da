"""Fleets (issue 23): one profile on many hosts behind one router, planned host by host.

Owns the fleet plan (which hosts a profile targets and where each part runs are
:mod:`.context`'s, re-exported here for the callers that plan fleets): every host planned by
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

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from orchestrator.catalog import Catalog, load_catalog
from orchestrator.errors import DsvError, ProfileError
from orchestrator.facts import Facts
from orchestrator.planner.build import build_plan
from orchestrator.planner.checks import check, drop_acks_used_on_other_hosts
from orchestrator.planner.context import (
    FleetContext,
    catalog_entries,
    fleet_context,
    fleet_hosts,
    load_fleet,
    placement_of,
    resolve_deployment,
    service_address,
)
from orchestrator.planner.rollout import fleet_downtime
from orchestrator.planner.static import locate_checks, sort_checks, static_checks
from orchestrator.planner_model import Check, FleetPlan, Plan
from orchestrator.profile.inventory import Host
from orchestrator.profile.schema import PDTopology, Profile

# the host resolution this module's callers import from here (owned by .context)
__all__ = ["FleetContext", "fleet_context", "fleet_hosts", "load_fleet", "placement_of",
           "plan_fleet", "plan_from_paths", "probe_fleet", "service_address", "transfer_checks"]


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


def analysis_check(profile: Profile) -> Check:
    """What the rollout's canary analysis will do between waves, or that it is off (and why)."""
    from orchestrator.monitoring import analysis

    a, url = profile.rollout.analysis, profile.monitoring.prometheus_url
    lines = analysis.describe(a, url)
    if analysis.enabled(a, url):
        return Check(id="rollout.analysis", severity="info",
                     title="canary analysis between waves", message=" ".join(
                         line.strip() for line in lines).removeprefix("canary analysis: "),
                     field="rollout.analysis")
    return Check(id="rollout.analysis-off", severity="warning" if a.checks else "info",
                 title="canary analysis is off",
                 message=lines[0].removeprefix("canary analysis: off: "),
                 fix=("set monitoring.prometheus_url to the Prometheus that scrapes the fleet "
                      "(the router host's monitoring/prometheus.yml)") if a.checks else None,
                 field="monitoring.prometheus_url" if a.checks else "rollout.analysis")


def plan_fleet(fctx: FleetContext, facts: Mapping[str, Facts] | None = None,
               cat: Catalog | None = None, *, replace_roles: Sequence[str] = ()) -> FleetPlan:
    """Every host planned with its own facts (declared unless ``facts`` has the host), in rollout
    order, and the fleet's own checks. One host that does not fit is an error of that host's plan;
    the others are planned all the same."""
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

        used = {c.id for p in plans for c in p.checks if c.acknowledged}
        plans = [p.model_copy(update={"checks": drop_acks_used_on_other_hosts(p.checks, used)})
                 for p in plans]

        on = fctx.placement.router_on
        router = next((p.deployment for p in plans if p.host == on), None)
        checks += router_flag_checks(router, fctx.profile) if router is not None else []
        checks += transfer_checks(fctx, plans)
        checks.append(analysis_check(fctx.profile))
    checks = sort_checks(locate_checks(checks, fctx.profile_text, str(fctx.profile_path)))
    engine_hosts = [n for n, _ in fctx.hosts]
    strategy = fctx.profile.rollout.strategy
    down = fleet_downtime(engine_hosts, {p.host: p.actions for p in plans},
                          {p.host: [r.name for r in p.deployment.roles] for p in plans},
                          strategy.canary, strategy.max_unavailable, strategy.drain_timeout_s)
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


def plan_from_paths(profile_path: Path | None, inventory_path: Path | None = None, *,
                    facts: Facts | None = None, host_override: str | None = None) -> Plan:
    """One host's plan: the profile's host, or ``host_override`` (in a fleet: that host's part of
    the fleet, planned with the fleet's placement). A fleet profile needs the host named:
    ``orchestrator.planner.fleet.plan_fleet`` plans them all."""
    fctx = load_fleet(profile_path, inventory_path, host_override=host_override)
    if host_override is None and fctx.is_fleet:
        raise ProfileError(
            f"profile {fctx.profile.name!r} targets a fleet ({', '.join(fctx.placement.hosts)}); "
            "one host's plan needs the host named",
            fix="name the host (--host NAME), or plan the whole fleet with `dsv4ctl plan`")
    name = host_override or fctx.hosts[0][0]
    fp = plan_fleet(fctx, {name: facts} if facts is not None else None)
    return fp.plan(name)  # catalog errors are DsvErrors already
