"""The Grafana dashboard of one deployment, generated from code.

Owns the panel list (which SGLang / router series to show for the deployment's roles: colocated
or prefill/decode, router, speculative decoding) and the layout. Panels are laid out on Grafana's
24-column grid row by row, so positions never overlap and ids are assigned in order (unique).

Importable as is: ``__inputs`` declares the Prometheus data source (the UI import asks for it) and
a ``datasource`` template variable lets provisioning pick one; every query uses
``{"type": "prometheus", "uid": "${datasource}"}``. Range selectors use Grafana's
``$__rate_interval``; :data:`GRAFANA_VARIABLES` lists every Grafana variable used so tests can
substitute them and run each expression through promtool.
Built through grafana-foundation-sdk (Grafana's own Apache-2.0 builders, generated from its
schema): the panel list above is ours, each panel, query, threshold and the grid layout are the
SDK's builders, and the JSON is its encoder's. Its import costs ~50 ms on the first board of a
`dsv4ctl plan` (measured with ``python -X importtime``; no torch, triton or fabric).
The board opens with the GPU row when a GPU exporter is scraped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from orchestrator.deployment import Deployment
from orchestrator.monitoring import prometheus
from orchestrator.monitoring.metrics import MIB
from orchestrator.monitoring.prometheus import num
from orchestrator.profile.schema import Profile

# Grafana variables that may appear in expressions, and a value promtool accepts for each.
GRAFANA_VARIABLES: dict[str, str] = {"$__rate_interval": "5m"}
DS = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24
SCHEMA_VERSION = 39


@dataclass
class Target:
    expr: str
    legend: str
    fmt: str = "time_series"


@dataclass
class Panel:
    title: str
    targets: list[Target]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | heatmap | stat
    width: int = 12
    height: int = 8
    description: str = ""
    thresholds: list[tuple[float, str]] = field(default_factory=list)  # (value, colour)
    max: float | None = None


@dataclass
class Row:
    title: str
    panels: list[Panel]


def _s(metric: str, dep: Deployment, extra: str = "") -> str:
    inner = f'deployment="{dep.name}"' + (f",{extra}" if extra else "")
    return f"{metric}{{{inner}}}"


def _quantiles(metric: str, dep: Deployment, extra: str = "") -> list[Target]:
    return [
        Target(
            f"histogram_quantile({q}, sum by (role, le) "
            f"(rate({_s(metric + '_bucket', dep, extra)}[$__rate_interval])))",
            f"{{{{role}}}} p{int(float(q) * 100)}",
        )
        for q in ("0.5", "0.95", "0.99")
    ]


def gpu_row(profile: Profile, dep: Deployment) -> Row:
    """dcgm-exporter's default counters per GPU (metrics.py cites them), and the framebuffer in
    use beside the plan's prediction for the GPU (``plan.rules.yml``, written by apply)."""
    per = "{{instance}} GPU {{gpu}}"
    by = "max by (instance, gpu)"
    planned = prometheus.PLANNED_FB
    return Row("GPUs (dcgm-exporter)", [
        Panel("GPU utilization", [Target(f"{by} ({_s('DCGM_FI_DEV_GPU_UTIL', dep)})", per)],
              unit="percent", width=8, max=100.0),
        Panel("Framebuffer used vs plan", [
            Target(f"{by} ({_s('DCGM_FI_DEV_FB_USED', dep)}) * {MIB}", f"{per} used"),
            Target(f"{by} ({_s(planned, dep)})", f"{per} planned"),
        ], unit="bytes", width=8,
            description="Measured framebuffer use (DCGM_FI_DEV_FB_USED, MiB) against the plan's "
            "per-GPU prediction (weights, KV pool, request table, CUDA context, headroom)."),
        Panel("Framebuffer drift from plan", [
            Target(f"{by} ({_s('dsv4:gpu_fb_used_bytes', dep)}) - on (instance, gpu) "
                   f"{by} ({_s(planned, dep)})", per),
        ], unit="bytes", width=8, thresholds=[(0.0, "orange")],
            description="Measured minus predicted; above 0 the GPU holds more than planned "
            f"(DSV4GPUMemoryAbovePlan fires past "
            f"{num(profile.monitoring.alerts.gpu_memory_over_plan * 100)}%)."),
        Panel("Power draw", [Target(f"{by} ({_s('DCGM_FI_DEV_POWER_USAGE', dep)})", per)],
              unit="watt", width=8),
        Panel("GPU temperature", [Target(f"{by} ({_s('DCGM_FI_DEV_GPU_TEMP', dep)})", per)],
              unit="celsius", width=8),
        Panel("XID errors (last XID per GPU, 0: none)", [
            Target(f"{by} ({_s('DCGM_FI_DEV_XID_ERRORS', dep)})", per)],
            width=8, thresholds=[(1.0, "red")]),
    ])


def rows(profile: Profile, dep: Deployment) -> list[Row]:
    th = profile.monitoring.alerts
    pd = dep.pd
    out: list[Row] = []
    if prometheus.gpu_targets(profile, dep):
        out.append(gpu_row(profile, dep))
    out.append(Row("Serving", [
        Panel("Running requests", [Target(f"sum by (role) ({_s('sglang:num_running_reqs', dep)})",
                                          "{{role}}")], width=8),
        Panel("Queued requests", [Target(f"sum by (role) ({_s('sglang:num_queue_reqs', dep)})",
                                         "{{role}}")], width=8,
              thresholds=[(float(th.queue_high), "red")]),
        Panel("Generation throughput", [
            Target(f"sum by (role) ({_s('sglang:gen_throughput', dep)})", "{{role}} (scheduler)"),
            Target(f"sum by (role) (rate({_s('sglang:generation_tokens_total', dep)}"
                   "[$__rate_interval]))", "{{role}} (output tokens)"),
        ], unit="tok/s", width=8),
        Panel("Requests and aborts", [
            Target(f"sum by (role) (rate({_s('sglang:num_requests_total', dep)}"
                   "[$__rate_interval]))", "{{role}} requests"),
            Target(f"sum by (role) (rate({_s('sglang:num_aborted_requests_total', dep)}"
                   "[$__rate_interval]))", "{{role}} aborted"),
        ], unit="reqps", width=12),
        Panel("Targets up", [Target(f'up{{deployment="{dep.name}"}}', "{{role}}")], width=12,
              max=1.0),
    ]))
    out.append(Row("KV cache", [
        Panel("KV token usage per pool", [
            Target(f"max by (role) ({_s('sglang:full_token_usage', dep)})", "{{role}} full"),
            Target(f"max by (role) ({_s('sglang:swa_token_usage', dep)})", "{{role}} swa"),
            Target(f"max by (role) ({_s('sglang:token_usage', dep)})", "{{role}} max of pools"),
        ], unit="percentunit", max=1.0,
            thresholds=[(th.kv_usage_high, "orange"), (th.swa_usage_high, "red")]),
        Panel("KV tokens used / capacity", [
            Target(f"sum by (role) ({_s('sglang:num_used_tokens', dep)})", "{{role}} full used"),
            Target(f"sum by (role) ({_s('sglang:max_total_num_tokens', dep)})",
                   "{{role}} full max"),
            Target(f"sum by (role) ({_s('sglang:swa_used_tokens', dep)})", "{{role}} swa used"),
            Target(f"sum by (role) ({_s('sglang:max_total_num_tokens_swa', dep)})",
                   "{{role}} swa max"),
        ]),
        Panel("Prefix cache hit rate", [
            Target(f"max by (role) ({_s('sglang:cache_hit_rate', dep)})", "{{role}} scheduler"),
            Target(f"sum by (role) (rate({_s('sglang:cached_tokens_total', dep)}"
                   "[$__rate_interval])) / sum by (role) "
                   f"(rate({_s('sglang:prompt_tokens_total', dep)}[$__rate_interval]))",
                   "{{role}} cached/prompt tokens"),
        ], unit="percentunit", max=1.0, width=24),
    ]))
    out.append(Row("Latency", [
        Panel("Time to first token", _quantiles("sglang:time_to_first_token_seconds", dep),
              unit="s", width=8, thresholds=[(th.ttft_p95_s, "red")]),
        Panel("Inter-token latency", _quantiles("sglang:inter_token_latency_seconds", dep),
              unit="s", width=8, thresholds=[(th.itl_p95_s, "red")]),
        Panel("End-to-end latency", _quantiles("sglang:e2e_request_latency_seconds", dep),
              unit="s", width=8),
        Panel("TTFT distribution", [
            Target(f"sum by (le) (increase({_s('sglang:time_to_first_token_seconds_bucket', dep)}"
                   "[$__rate_interval]))", "{{le}}", fmt="heatmap"),
        ], kind="heatmap", unit="s", width=12),
        Panel("ITL distribution", [
            Target(f"sum by (le) (increase({_s('sglang:inter_token_latency_seconds_bucket', dep)}"
                   "[$__rate_interval]))", "{{le}}", fmt="heatmap"),
        ], kind="heatmap", unit="s", width=12),
    ]))
    if dep.speculative_algorithm != "none":
        out.append(Row(f"Speculative decoding ({dep.speculative_algorithm})", [
            Panel("Acceptance length", [
                Target(f"max by (role) ({_s('sglang:spec_accept_length', dep)})", "{{role}}")
            ], thresholds=[(th.spec_accept_length_min, "red")]),
            Panel("Acceptance rate", [
                Target(f"max by (role) ({_s('sglang:spec_accept_rate', dep)})", "{{role}}")
            ], unit="percentunit", max=1.0),
        ]))
    if pd:
        out.append(Row(f"PD disaggregation ({dep.transfer_backend})", [
            Panel("PD queues", [
                Target(f"sum ({_s('sglang:num_prefill_bootstrap_queue_reqs', dep)})",
                       "prefill bootstrap"),
                Target(f"sum ({_s('sglang:num_prefill_inflight_queue_reqs', dep)})",
                       "prefill in flight"),
                Target(f"sum ({_s('sglang:num_decode_prealloc_queue_reqs', dep)})",
                       "decode prealloc"),
                Target(f"sum ({_s('sglang:num_decode_transfer_queue_reqs', dep)})",
                       "decode transfer"),
            ], width=8),
            Panel("KV transfer latency", [
                *_quantiles("sglang:kv_transfer_latency_ms", dep)[:2],
                *[Target(t.expr, t.legend.replace("{{role}}", "{{role}} bootstrap"))
                  for t in _quantiles("sglang:kv_transfer_bootstrap_ms", dep)[:2]],
            ], unit="ms", width=8),
            Panel("KV transfer speed", _quantiles("sglang:kv_transfer_speed_gb_s", dep)[:2],
                  unit="GBs", width=8),
            Panel("PD failures", [
                Target(f"sum by (role) (increase("
                       f"{_s('sglang:num_bootstrap_failed_reqs_total', dep)}[$__rate_interval]))",
                       "{{role}} bootstrap failed"),
                Target(f"sum by (role) (increase("
                       f"{_s('sglang:num_transfer_failed_reqs_total', dep)}[$__rate_interval]))",
                       "{{role}} transfer failed"),
            ], width=24),
        ]))
    if dep.router is not None:
        # Router label names are not confirmed for 0.3.2 (see metrics.py): aggregate without
        # them except `worker`, which only names the legend.
        out.append(Row("Router (sglang-router)", [
            Panel("Router requests", [
                Target(f"sum (rate({_s('smg_http_requests_total', dep)}[$__rate_interval]))",
                       "requests"),
                # 0.3.2 counts every response by status_code (seen on the live router in
                # tests/promtool/test_prometheus_surface.py); it has no error counter until the
                # first routing error, so errors show as the 4xx/5xx lines of this split
                Target(f"sum by (status_code) (rate({_s('smg_http_responses_total', dep)}"
                       "[$__rate_interval]))", "{{status_code}}"),
            ], unit="reqps", width=8),
            Panel("Router request duration", [
                Target(f"histogram_quantile({q}, sum by (le) "
                       f"(rate({_s('smg_http_request_duration_seconds_bucket', dep)}"
                       "[$__rate_interval])))", f"p{p}")
                for q, p in (("0.5", 50), ("0.95", 95), ("0.99", 99))
            ], unit="s", width=8),
            Panel("Worker health", [
                Target(_s("smg_worker_health", dep), "{{worker}}"),
                Target(_s("smg_worker_pool_size", dep), "pool size"),
            ], width=8),
            Panel("Active requests per worker", [
                Target(_s("smg_worker_requests_active", dep), "{{worker}}"),
            ], width=12),
            Panel("Circuit breaker state (0 closed, 1 open, 2 half-open)", [
                Target(_s("smg_worker_cb_state", dep), "{{worker}}"),
            ], width=12),
        ]))
    return out


def _ds() -> Any:
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    return DataSourceRef(type_val=DS["type"], uid=DS["uid"])


def _query(t: Target, i: int) -> Any:
    from grafana_foundation_sdk.builders import prometheus as q
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    return (q.Dataquery().datasource(_ds()).ref_id(chr(ord("A") + i)).expr(t.expr)
            .legend_format(t.legend).format(PromQueryFormat(t.fmt)).range())


def _panel(panel: Panel, pid: int) -> Any:
    """One panel through the SDK's builder for its kind (Grafana's own schema, generated)."""
    from grafana_foundation_sdk.builders import common, dashboard, heatmap, timeseries
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models import heatmap as hm

    steps = [dm.Threshold(value=None, color="green")]
    steps += [dm.Threshold(value=v, color=c) for v, c in panel.thresholds]
    b: Any = timeseries.Panel() if panel.kind == "timeseries" else heatmap.Panel()
    b = (b.id(pid).title(panel.title).description(panel.description).datasource(_ds())
         .span(panel.width).height(panel.height).unit(panel.unit)
         .thresholds(dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)))
    if panel.max is not None:
        b = b.min(0).max(panel.max)
    if panel.kind == "heatmap":
        b = (b.calculate(False).y_axis(heatmap.YAxisConfig().unit(panel.unit)).cell_gap(1)
             .show_tooltip()
             .color(heatmap.HeatmapColorOptions().scheme("Oranges")
                    .mode(hm.HeatmapColorMode.SCHEME)))
    else:
        b = (b.legend(common.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                      .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                      .sort(cm.SortOrder.NONE)))
        if panel.thresholds:
            b = b.thresholds_style(common.GraphThresholdsStyleConfig()
                                   .mode(cm.GraphTresholdsStyleMode.LINE))
    for i, t in enumerate(panel.targets):
        b = b.with_target(_query(t, i))
    return b


def _builder(row_list: list[Row]) -> Any:
    """The board's rows and panels on the SDK's Dashboard builder, which lays them out on
    Grafana's 24-column grid (left to right, a new line when one is full; a row header spans
    the width): positions never overlap, ids are given in order."""
    from grafana_foundation_sdk.builders import dashboard

    b = dashboard.Dashboard("")
    pid = 1
    for row in row_list:
        b = b.with_row(dashboard.Row(row.title).id(pid))
        pid += 1
        for p in row.panels:
            if p.width > WIDTH:
                raise ValueError(f"panel {p.title!r} wider than the grid")
            b = b.with_panel(_panel(p, pid))
            pid += 1
    return b


def _encode(model: Any) -> Any:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(JSONEncoder(sort_keys=False).encode(model))


def layout(row_list: list[Row]) -> list[dict[str, Any]]:
    """Panels in Grafana JSON: an expanded row header, then its panels."""
    return list(_encode(_builder(row_list).build())["panels"])


def dashboard(profile: Profile, dep: Deployment) -> dict[str, Any]:
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.models import dashboard as dm

    th = profile.monitoring.alerts
    b = (_builder(rows(profile, dep))
         .title(f"DeepSeek-V4 / SGLang — {dep.name}")
         .uid(f"dsv4-{dep.name}"[:40])
         .description(f"dsv4ctl deployment {dep.name}: {dep.model_variant} on SGLang "
                      f"{dep.engine_version}; alert budgets TTFT p95 {num(th.ttft_p95_s)} s, "
                      f"ITL p95 {num(th.itl_p95_s)} s")
         .tags(["dsv4ctl", "sglang", dep.name]).editable()
         .tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-3h", "now")
         .timezone("").version(1)
         .with_variable(gd.DatasourceVariable("datasource").label("Data source")
                        .type("prometheus")
                        .current(dm.VariableOption(text="${DS_PROMETHEUS}",
                                                   value="${DS_PROMETHEUS}"))))
    model = b.build()
    model.schema_version = SCHEMA_VERSION
    doc = _encode(model)
    # Grafana's import-time keys, outside the dashboard model: the UI import asks for the
    # data source declared here and substitutes ${DS_PROMETHEUS}
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus",
                      "description": "Prometheus that scrapes this deployment",
                      "type": "datasource", "pluginId": "prometheus",
                      "pluginName": "Prometheus"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
            {"type": "panel", "id": "heatmap", "name": "Heatmap", "version": ""},
        ],
        "id": None,
        **doc,
    }


def dashboard_json(profile: Profile, dep: Deployment) -> str:
    return json.dumps(dashboard(profile, dep), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def expressions(doc: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(panel id, title, expr) for every query in a dashboard document."""
    out = []
    for p in doc["panels"]:
        for t in p.get("targets", []):
            out.append((p["id"], p["title"], t["expr"]))
    return out
