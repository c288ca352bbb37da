"""Prometheus scrape config, recording and alerting rules, and their promtool unit tests.

Owns what Prometheus needs to watch one deployment: a scrape job per engine role (``/metrics`` on
the role's HTTP port; SGLang serves it there with ``--enable-metrics``) and one for the router's
separate metrics listener, every target labelled ``deployment`` and ``role``; the rules that turn
the operator's lessons into alerts (thresholds from ``profile.monitoring.alerts``); and a
``promtool test rules`` file with a firing and a quiet case for every alert, shipped with the
release so the operator can re-run it on the host.

Everything here is a pure function of (profile, deployment): no clock, stable key order.
Metric names come from :mod:`orchestrator.monitoring.metrics` (sources cited there).

About 550 lines: each alert sits beside its own firing and quiet promtool cases, so an alert
cannot be changed without the test that pins it being in view (the GPU alerts and the plan's
per-GPU rules included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from orchestrator.deployment import Deployment
from orchestrator.errors import RenderError
from orchestrator.exposure import classify_listen
from orchestrator.monitoring.metrics import ITL_MAX_BUCKET_S, MIB, TTFT_MAX_BUCKET_S
from orchestrator.profile.schema import Profile

RULES_FILE = "rules.yml"
RULE_TESTS_FILE = "rules_test.yml"
ENGINE_ROLES_RE = "engine|prefill|decode"
# Not in the profile schema (AlertThresholds has no field for it): the share of requests aborted
# over 5 minutes above which we alert. Clients that hang up also count as aborts in SGLang, so the
# bar is not zero.
ABORTED_RATIO_HIGH = 0.05
DOWN_FOR = "1m"
GPU_ROLE = "gpu"  # the `role` label of the GPU exporter's targets
PLAN_RULES_FILE = "plan.rules.yml"
PLAN_RULES_GLOB = "plan*.rules.yml"
PLANNED_FB = "dsv4:gpu_fb_planned_bytes"


def num(x: float) -> str:
    """A threshold as PromQL/YAML text: shortest stable form (0.9, 10, 0.25)."""
    return format(float(x), ".10g")


def yaml_text(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100,
                          allow_unicode=True)


# ---------------------------------------------------------------------------------------------
# scrape config


def role_names(dep: Deployment) -> tuple[str, ...]:
    """The engine roles this host's Prometheus watches: its own, or, on a fleet's router-only
    host, the fleet's (prefill and decode behind a PD router, else engine)."""
    if dep.roles:
        return tuple(r.name for r in dep.roles)
    assert dep.router is not None
    return ("prefill", "decode") if dep.router.pd else ("engine",)


def _hostport(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def scrapes_fleet(dep: Deployment) -> bool:
    """Whether this host's Prometheus scrapes the whole fleet: the host that runs a fleet's
    router does (so one Prometheus there sees every host: what canary analysis compares)."""
    return dep.router is not None and dep.fleet


def engine_targets(dep: Deployment) -> list[tuple[str, str]]:
    """(role, host:port) of every engine this host's Prometheus scrapes: on the host that
    :func:`scrapes_fleet`, the fleet's, at the addresses the router reaches the engines at; on
    any other host its own roles."""
    if scrapes_fleet(dep):
        r = dep.router
        return ([("prefill", _hostport(u)) for u, _ in r.prefill]
                + [("decode", _hostport(u)) for u in r.decode]
                + [("engine", _hostport(u)) for u in r.worker_urls])
    return [(r.name, f"{r.listen}:{r.port}") for r in dep.roles]


def gpu_targets(profile: Profile, dep: Deployment) -> list[str]:
    """host:port of the GPU exporter on every engine host scraped (none with gpu_exporter none)."""
    if profile.monitoring.gpu_exporter == "none":
        return []
    hosts = dict.fromkeys(t.rsplit(":", 1)[0] for _, t in engine_targets(dep))
    return [f"{h}:{profile.monitoring.gpu_exporter_port}" for h in hosts]


def _router_metrics_address(host: str) -> str:
    """Where the host's Prometheus reaches the router's metrics: the router serves them on its own
    listen address (render/argv.py ``--prometheus-host``), so on that address unless it is every
    interface (then loopback answers too)."""
    if classify_listen(host) == "all":
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def router_target(dep: Deployment) -> str:
    """The router's metrics target in the host's scrape config (``dep.router`` must be set)."""
    assert dep.router is not None
    return f"{_router_metrics_address(dep.router.host)}:{dep.router.prometheus_port}"


def scrape_config(profile: Profile, dep: Deployment) -> dict[str, Any]:
    """prometheus.yml for a Prometheus on the deployment's host: engines that listen on loopback
    only (``orchestrator.render.argv.ENGINE_HOST``) are scraped at 127.0.0.1:<port>, a fleet's at
    the host's service address."""
    interval = f"{profile.monitoring.scrape_interval_s}s"
    engine_targets_ = [
        {"targets": [target], "labels": {"deployment": dep.name, "role": role}}
        for role, target in engine_targets(dep)
    ]
    jobs: list[dict[str, Any]] = [
        {
            "job_name": f"dsv4-{dep.name}-engine",
            "metrics_path": "/metrics",
            "static_configs": engine_targets_,
        }
    ]
    if dep.router is not None:
        jobs.append(
            {
                "job_name": f"dsv4-{dep.name}-router",
                "metrics_path": "/metrics",
                "static_configs": [
                    {
                        "targets": [router_target(dep)],
                        "labels": {"deployment": dep.name, "role": "router"},
                    }
                ],
            }
        )
    gpus = gpu_targets(profile, dep)
    if gpus:
        jobs.append({
            "job_name": f"dsv4-{dep.name}-gpu",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": gpus,
                                "labels": {"deployment": dep.name, "role": GPU_ROLE}}],
        })
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        # Relative paths in rule_files resolve against this file's directory (Prometheus docs,
        # configuration.md "rule_files"), so the release directory can move as a whole. The
        # second entry is a glob on purpose: the plan's per-GPU prediction (PLAN_RULES_FILE) is
        # written by apply beside plan.json, and a release rendered without a plan has none.
        "rule_files": [RULES_FILE, *([PLAN_RULES_GLOB] if gpus else [])],
        "scrape_configs": jobs,
    }


# ---------------------------------------------------------------------------------------------
# rules


@dataclass(frozen=True)
class Case:
    """One promtool alert test: input series, when to evaluate, and whether the alert fires."""

    name: str
    series: tuple[tuple[str, str], ...]  # (series selector, values in promtool notation)
    eval_minutes: int
    fires: bool
    labels: tuple[tuple[str, str], ...] = ()  # alert labels beyond severity when it fires


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str | None
    severity: str
    summary: str  # may use {{ $labels.role }} (expanded by the tests' expectation below)
    description: str
    cases: tuple[Case, ...] = field(default_factory=tuple)

    def rule(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_:
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity}
        out["annotations"] = {"summary": self.summary, "description": self.description}
        return out


def _sel(metric: str, dep: Deployment, extra: str = "") -> str:
    inner = f'deployment="{dep.name}"' + (f",{extra}" if extra else "")
    return f"{metric}{{{inner}}}"


def recording_rules(dep: Deployment, gpu: bool = False) -> list[dict[str, Any]]:
    # per engine (`instance`): in a fleet one slow or full host must not hide in the fleet's mean
    # (an alert on the fleet-wide p95 never fired for one slow host of three, seen in
    # tests/promtool/test_prometheus_surface.py::test_fleet_surface)
    by = "by (deployment, role, instance)"
    byle = "by (deployment, role, instance, le)"

    def q(metric: str, quant: str) -> str:
        return (f"histogram_quantile({quant}, sum {byle} "
                f"(rate({_sel(metric + '_bucket', dep)}[5m])))")

    rules = [
        ("dsv4:kv_full_usage:max", f"max {by} ({_sel('sglang:full_token_usage', dep)})"),
        ("dsv4:kv_swa_usage:max", f"max {by} ({_sel('sglang:swa_token_usage', dep)})"),
        ("dsv4:queue_reqs:sum", f"sum {by} ({_sel('sglang:num_queue_reqs', dep)})"),
        ("dsv4:queue_reqs:deriv10m",
         f"sum {by} (deriv({_sel('sglang:num_queue_reqs', dep)}[10m]))"),
        ("dsv4:running_reqs:sum", f"sum {by} ({_sel('sglang:num_running_reqs', dep)})"),
        ("dsv4:generation_tokens:rate5m",
         f"sum {by} (rate({_sel('sglang:generation_tokens_total', dep)}[5m]))"),
        ("dsv4:requests:rate5m",
         f"sum {by} (rate({_sel('sglang:num_requests_total', dep)}[5m]))"),
        ("dsv4:aborted_requests:rate5m",
         f"sum {by} (rate({_sel('sglang:num_aborted_requests_total', dep)}[5m]))"),
        ("dsv4:ttft_seconds:p95", q("sglang:time_to_first_token_seconds", "0.95")),
        ("dsv4:itl_seconds:p95", q("sglang:inter_token_latency_seconds", "0.95")),
        ("dsv4:e2e_seconds:p95", q("sglang:e2e_request_latency_seconds", "0.95")),
    ]
    if gpu:
        rules.append(("dsv4:gpu_fb_used_bytes",
                      f"max by (deployment, instance, gpu) "
                      f"({_sel('DCGM_FI_DEV_FB_USED', dep)}) * {MIB}"))
    if dep.speculative_algorithm != "none":
        rules.append(("dsv4:spec_accept_length:max",
                      f"max {by} ({_sel('sglang:spec_accept_length', dep)})"))
    return [{"record": name, "expr": expr} for name, expr in rules]


def _engine_role(dep: Deployment) -> str:
    """The role whose series the test cases use: decode in PD (it generates), else engine."""
    names = role_names(dep)
    return "decode" if "decode" in names else names[0]


def alerts(profile: Profile, dep: Deployment) -> list[Alert]:
    th = profile.monitoring.alerts
    if th.ttft_p95_s >= TTFT_MAX_BUCKET_S or th.itl_p95_s >= ITL_MAX_BUCKET_S:
        raise RenderError(
            f"monitoring.alerts: ttft_p95_s={num(th.ttft_p95_s)} / itl_p95_s={num(th.itl_p95_s)} "
            "cannot fire: histogram_quantile() never exceeds SGLang 0.5.23's largest finite "
            f"bucket (TTFT {num(TTFT_MAX_BUCKET_S)} s, ITL {num(ITL_MAX_BUCKET_S)} s)",
            fix=f"set ttft_p95_s below {num(TTFT_MAX_BUCKET_S)} and itl_p95_s below "
            f"{num(ITL_MAX_BUCKET_S)}",
        )
    d = dep.name
    role = _engine_role(dep)
    base = f'deployment="{d}",role="{role}",tp_rank="0"'
    tok = f'deployment="{d}",role="{role}"'
    fm = th.for_minutes
    for_ = f"{fm}m"
    late = fm + 3  # evaluation time well after `for` has elapsed
    who = (("deployment", d), ("role", role))
    out: list[Alert] = []

    def hold(value: float) -> str:
        return f"{num(value)}x{late + 5}"

    # -- down --------------------------------------------------------------------------------
    first = role_names(dep)[0]
    out.append(Alert(
        "DSV4EngineDown",
        f'up{{deployment="{d}",role=~"{ENGINE_ROLES_RE}"}} == 0',
        DOWN_FOR, "critical",
        "SGLang engine {{ $labels.role }} of " + d + " is down",
        "Prometheus cannot scrape /metrics of this engine role for 1 minute: the process is "
        "stopped, crashed, or still loading without --enable-metrics.",
        (
            Case("fires", ((f'up{{deployment="{d}",role="{first}",job="j",instance="i"}}',
                            "0x10"),), 3, True,
                 (("deployment", d), ("instance", "i"), ("job", "j"), ("role", first))),
            Case("up", ((f'up{{deployment="{d}",role="{first}",job="j",instance="i"}}',
                         "1x10"),), 3, False),
        ),
    ))
    if dep.router is not None:
        out.append(Alert(
            "DSV4RouterDown",
            f'up{{deployment="{d}",role="router"}} == 0',
            DOWN_FOR, "critical",
            "sglang-router of " + d + " is down",
            "Prometheus cannot scrape the router's metrics listener for 1 minute; clients "
            "cannot reach the deployment.",
            (
                Case("fires", ((f'up{{deployment="{d}",role="router",job="j",instance="i"}}',
                                "0x10"),), 3, True,
                     (("deployment", d), ("instance", "i"), ("job", "j"), ("role", "router"))),
                Case("up", ((f'up{{deployment="{d}",role="router",job="j",instance="i"}}',
                             "1x10"),), 3, False),
            ),
        ))
        out.append(Alert(
            "DSV4RouterWorkerUnhealthy",
            f'smg_worker_health{{deployment="{d}"}} == 0',
            "2m", "critical",
            "sglang-router of " + d + " marks a worker unhealthy",
            "The router's health checks fail for a prefill or decode worker; requests are not "
            "routed to it. (Metric name from the 0.3.2 binary; label names not confirmed.)",
            (
                Case("fires", ((f'smg_worker_health{{deployment="{d}",role="router",'
                                f'worker="http://w"}}', "0x10"),), 5, True,
                     (("deployment", d), ("role", "router"), ("worker", "http://w"))),
                Case("healthy", ((f'smg_worker_health{{deployment="{d}",role="router",'
                                  f'worker="http://w"}}', "1x10"),), 5, False),
            ),
        ))

    # -- KV cache ----------------------------------------------------------------------------
    for metric, rec, name, limit, pool in (
        ("sglang:full_token_usage", "dsv4:kv_full_usage:max", "DSV4KVCacheFullPoolHigh",
         th.kv_usage_high, "full-attention"),
        ("sglang:swa_token_usage", "dsv4:kv_swa_usage:max", "DSV4KVCacheSWAPoolHigh",
         th.swa_usage_high, "sliding-window"),
    ):
        below = max(limit - 0.1, 0.0)
        out.append(Alert(
            name,
            f'{rec}{{deployment="{d}"}} > {num(limit)}',
            for_, "warning",
            f"KV cache {pool} pool of {{{{ $labels.role }}}} above {num(limit * 100)}%",
            f"The {pool} KV pool has been more than {num(limit * 100)}% used for {fm} minutes; "
            "new requests queue or get retracted. Lower concurrency or context, or give the "
            "pool more memory (mem_fraction_static).",
            (
                Case("fires", ((f"{metric}{{{base}}}", hold(min(limit + 0.02, 1.0))),),
                     late, True, who),
                Case("below", ((f"{metric}{{{base}}}", hold(below)),), late, False),
                Case("too-short", ((f"{metric}{{{base}}}", hold(min(limit + 0.02, 1.0))),),
                     max(fm - 1, 0), False),
            ),
        ))

    # -- queue -------------------------------------------------------------------------------
    qh = th.queue_high
    out.append(Alert(
        "DSV4QueueGrowing",
        f'dsv4:queue_reqs:sum{{deployment="{d}"}} > {qh} and on (deployment, role, instance) '
        f'dsv4:queue_reqs:deriv10m{{deployment="{d}"}} >= 0',
        for_, "warning",
        f"Request queue of {{{{ $labels.role }}}} above {qh} and not draining",
        f"More than {qh} requests have waited for {fm} minutes and the queue is not shrinking: "
        "offered load exceeds what the engine serves.",
        (
            Case("fires", ((f"sglang:num_queue_reqs{{{base}}}", f"{qh + 1}+1x{late + 5}"),),
                 late, True, who),
            Case("draining", ((f"sglang:num_queue_reqs{{{base}}}",
                               f"{qh + 2 * late + 20}-1x{late + 5}"),), late, False),
            Case("below", ((f"sglang:num_queue_reqs{{{base}}}", f"{max(qh - 1, 0)}x{late + 5}"),),
                 late, False),
        ),
    ))

    # -- latency -----------------------------------------------------------------------------
    for metric, rec, name, limit, what in (
        ("sglang:time_to_first_token_seconds", "dsv4:ttft_seconds:p95", "DSV4TTFTHigh",
         th.ttft_p95_s, "time to first token"),
        ("sglang:inter_token_latency_seconds", "dsv4:itl_seconds:p95", "DSV4ITLHigh",
         th.itl_p95_s, "inter-token latency"),
    ):
        lo, hi = num(limit / 2), num(limit * 4)
        extra = ',is_streaming="true"' if "first_token" in metric else ""

        def hist(fast: bool, metric: str = metric, extra: str = extra, lo: str = lo,
                 hi: str = hi) -> tuple[tuple[str, str], ...]:
            # 10 observations a minute, all in (0, limit/2] (fast) or in (limit/2, 4*limit].
            n = f"0+10x{late + 5}"
            return (
                (f'{metric}_bucket{{{tok}{extra},le="{lo}"}}', n if fast else f"0x{late + 5}"),
                (f'{metric}_bucket{{{tok}{extra},le="{hi}"}}', n),
                (f'{metric}_bucket{{{tok}{extra},le="+Inf"}}', n),
            )

        out.append(Alert(
            name,
            f'{rec}{{deployment="{d}"}} > {num(limit)}',
            for_, "warning",
            f"p95 {what} of {{{{ $labels.role }}}} above {num(limit)} s",
            f"The 95th percentile {what} over 5 minutes has exceeded the budget of {num(limit)} s "
            f"for {fm} minutes (monitoring.alerts in the profile).",
            (
                Case("fires", hist(False), late, True, (("deployment", d), ("role", role))),
                Case("fast", hist(True), late, False),
            ),
        ))

    # -- PD failures -------------------------------------------------------------------------
    if dep.pd:
        for metric, name, what, r in (
            ("sglang:num_bootstrap_failed_reqs_total", "DSV4PDBootstrapFailures", "bootstrap",
             "prefill"),
            ("sglang:num_transfer_failed_reqs_total", "DSV4PDTransferFailures", "KV transfer",
             "decode"),
        ):
            sel = f'deployment="{d}",role="{r}",tp_rank="0"'
            out.append(Alert(
                name,
                f"sum by (deployment, role) (increase({_sel(metric, dep)}[5m])) > 0",
                None, "warning",
                f"PD {what} failures on {{{{ $labels.role }}}}",
                f"Requests failed in the prefill/decode {what} step in the last 5 minutes "
                f"(transfer backend {dep.transfer_backend}); check both engines' logs.",
                (
                    Case("fires", ((f"{metric}{{{sel}}}", "0x5 1+0x10"),), 8, True,
                         (("deployment", d), ("role", r))),
                    Case("none", ((f"{metric}{{{sel}}}", "0x15"),), 8, False),
                ),
            ))

    # -- aborted requests --------------------------------------------------------------------
    out.append(Alert(
        "DSV4RequestsAborted",
        f'dsv4:aborted_requests:rate5m{{deployment="{d}"}} > on (deployment, role, instance) '
        f'({num(ABORTED_RATIO_HIGH)} * dsv4:requests:rate5m{{deployment="{d}"}})',
        for_, "warning",
        f"More than {num(ABORTED_RATIO_HIGH * 100)}% of requests to {{{{ $labels.role }}}} abort",
        "Requests are aborted (client disconnects, timeouts, out-of-memory retraction limits) "
        f"at more than {num(ABORTED_RATIO_HIGH * 100)}% of the request rate.",
        (
            Case("fires", ((f"sglang:num_requests_total{{{tok}}}", f"0+100x{late + 5}"),
                           (f"sglang:num_aborted_requests_total{{{tok}}}", f"0+20x{late + 5}")),
                 late, True, who),
            Case("few", ((f"sglang:num_requests_total{{{tok}}}", f"0+100x{late + 5}"),
                         (f"sglang:num_aborted_requests_total{{{tok}}}", f"0+1x{late + 5}")),
                 late, False),
        ),
    ))

    # -- speculative decoding ----------------------------------------------------------------
    if dep.speculative_algorithm != "none":
        lim = th.spec_accept_length_min
        out.append(Alert(
            "DSV4SpecAcceptanceCollapsed",
            f'dsv4:spec_accept_length:max{{deployment="{d}"}} < {num(lim)} and on '
            f'(deployment, role, instance) dsv4:generation_tokens:rate5m{{deployment="{d}"}} > 0',
            for_, "warning",
            f"Speculative acceptance length of {{{{ $labels.role }}}} below {num(lim)}",
            f"{dep.speculative_algorithm} drafts are mostly rejected while the engine generates: "
            "speculation costs more than it saves. Check the draft model and the sampling "
            "settings, or disable speculative decoding.",
            (
                Case("fires", ((f"sglang:spec_accept_length{{{base}}}", hold(lim / 2)),
                               (f"sglang:generation_tokens_total{{{tok}}}", f"0+50x{late + 5}")),
                     late, True, who),
                Case("idle", ((f"sglang:spec_accept_length{{{base}}}", hold(lim / 2)),
                              (f"sglang:generation_tokens_total{{{tok}}}", f"0x{late + 5}")),
                     late, False),
                Case("healthy", ((f"sglang:spec_accept_length{{{base}}}", hold(lim + 1)),
                                 (f"sglang:generation_tokens_total{{{tok}}}", f"0+50x{late + 5}")),
                     late, False),
            ),
        ))
    if gpu_targets(profile, dep):
        out += gpu_alerts(profile, dep, late)
    return out


def gpu_alerts(profile: Profile, dep: Deployment, late: int) -> list[Alert]:
    """XID errors and framebuffer above the plan's prediction (dcgm-exporter default counters;
    the prediction is the recording rule apply writes from the plan, :func:`plan_rules`)."""
    d = dep.name
    th = profile.monitoring.alerts
    fm = th.for_minutes
    gsel = f'deployment="{d}",instance="h:9400",gpu="0"'
    who = (("deployment", d), ("gpu", "0"), ("instance", "h:9400"))
    over = num(1 + th.gpu_memory_over_plan)
    plan_gib = 80
    return [
        Alert(
            "DSV4GPUXidError",
            f'max by (deployment, instance, gpu) (DCGM_FI_DEV_XID_ERRORS{{deployment="{d}"}}) > 0',
            None, "critical",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }} reported an XID error",
            "dcgm-exporter's DCGM_FI_DEV_XID_ERRORS holds the last XID the driver logged for this "
            "GPU: a hardware, driver or application fault (NVIDIA's XID catalog says which). "
            "Check `dmesg` on the host; the engine on this GPU may have failed with it.",
            (
                Case("fires", ((f"DCGM_FI_DEV_XID_ERRORS{{{gsel},job=\"j\"}}", "0 0 79x10"),), 4,
                     True, who),
                Case("none", ((f"DCGM_FI_DEV_XID_ERRORS{{{gsel},job=\"j\"}}", "0x10"),), 4, False),
            ),
        ),
        Alert(
            "DSV4GPUMemoryAbovePlan",
            f'dsv4:gpu_fb_used_bytes{{deployment="{d}"}} > on (deployment, instance, gpu) '
            f'group_left (role) ({over} * {PLANNED_FB}{{deployment="{d}"}})',
            f"{fm}m", "warning",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }} uses more memory than planned",
            f"Framebuffer in use has exceeded the plan's prediction for this GPU "
            f"({PLANNED_FB}) by more than {num(th.gpu_memory_over_plan * 100)}% for {fm} "
            "minutes: the planner's memory model is off for this host (re-run `dsv4ctl plan "
            "--live`), or something else allocates on the GPU.",
            (
                Case("fires", ((f"DCGM_FI_DEV_FB_USED{{{gsel}}}", f"{plan_gib * 1100}x{late + 5}"),
                               (f'{PLANNED_FB}{{{gsel},role="engine"}}',
                                f"{plan_gib * 1024 * MIB}x{late + 5}")),
                     late, True, (*who, ("role", "engine"))),
                Case("as-planned", ((f"DCGM_FI_DEV_FB_USED{{{gsel}}}",
                                     f"{plan_gib * 1000}x{late + 5}"),
                                    (f'{PLANNED_FB}{{{gsel},role="engine"}}',
                                     f"{plan_gib * 1024 * MIB}x{late + 5}")),
                     late, False),
            ),
        ),
    ]


def plan_rules(dep: Deployment, gpu_bytes: list[tuple[str, int, str, int]]) -> str:
    """``plan.rules.yml``: the plan's predicted framebuffer use of every GPU, as one recording
    rule per GPU (``dsv4:gpu_fb_planned_bytes{deployment, instance, gpu, role}``, ``instance``
    the GPU exporter's scrape target), so the board and DSV4GPUMemoryAbovePlan put the prediction
    beside dcgm-exporter's measurement. ``gpu_bytes`` is (instance, index, role, bytes): one
    exporter on a single host, every engine host's on a fleet's router host. Sorted, so the
    same plans give the same bytes."""
    rules = [
        {"record": PLANNED_FB, "expr": f"vector({int(n)})",
         "labels": {"deployment": dep.name, "instance": instance, "gpu": str(idx), "role": role}}
        for instance, idx, role, n in sorted(gpu_bytes)
    ]
    return yaml_text({"groups": [{"name": f"dsv4-{dep.name}-plan", "rules": rules}]})


def rules_document(profile: Profile, dep: Deployment) -> dict[str, Any]:
    return {
        "groups": [
            {
                "name": f"dsv4-{dep.name}",
                # One group: rules in a group run in order, so alerts see this cycle's recordings.
                "rules": recording_rules(dep, bool(gpu_targets(profile, dep)))
                + [a.rule() for a in alerts(profile, dep)],
            }
        ]
    }


def _expand(template: str, labels: dict[str, str]) -> str:
    out = template
    for k, v in labels.items():
        out = out.replace(f"{{{{ $labels.{k} }}}}", v)
    return out


def rule_tests_document(profile: Profile, dep: Deployment) -> dict[str, Any]:
    """promtool unit tests: one test per alert case, evaluated every minute."""
    tests: list[dict[str, Any]] = []
    for alert in alerts(profile, dep):
        for case in alert.cases:
            exp: list[dict[str, Any]] = []
            if case.fires:
                labels = dict(case.labels)
                exp.append({
                    "exp_labels": {**labels, "severity": alert.severity},
                    "exp_annotations": {"summary": _expand(alert.summary, labels),
                                        "description": alert.description},
                })
            tests.append({
                "name": f"{alert.name}/{case.name}",
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series],
                "alert_rule_test": [
                    {"eval_time": f"{case.eval_minutes}m", "alertname": alert.name,
                     "exp_alerts": exp}
                ],
            })
    return {"rule_files": [RULES_FILE], "evaluation_interval": "1m", "tests": tests}


def files(profile: Profile, dep: Deployment) -> dict[str, str]:
    return {
        "prometheus.yml": yaml_text(scrape_config(profile, dep)),
        RULES_FILE: yaml_text(rules_document(profile, dep)),
        RULE_TESTS_FILE: yaml_text(rule_tests_document(profile, dep)),
    }
