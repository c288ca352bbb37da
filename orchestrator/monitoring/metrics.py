"""The metric names dsv4ctl's rules and dashboard may use, each with its type and source.

Owns one table so that every PromQL expression we ship refers to a name the pinned engine and
router really export (a typo would make an alert silently never fire). The tests check that each
selector in the rendered rules and dashboard resolves to a name in this table.

Sources:
- SGLang 0.5.23 (PyPI wheel, ``sglang/srt/observability/metrics_collector.py``): names below were
  read with ``grep -o 'name="sglang:[a-z_0-9]*"'`` on that file; the type is the prometheus_client
  class that declares it. Scheduler gauges carry ``model_name, engine_type, tp_rank, pp_rank,
  moe_ep_rank[, dp_rank]``; tokenizer metrics carry ``model_name, engine_type``; the TTFT and e2e
  histograms add ``is_streaming``. They exist only with ``--enable-metrics``.
- sglang-router 0.3.2 (PyPI wheel, Rust extension ``sglang_router_rs.abi3.so``): names found with
  a byte search for ``smg_[a-z_0-9]+`` in the binary. Their *labels* (``worker``, ``path``,
  ``status_code``) come from the successor project's reference
  (https://github.com/lightseekorg/smg, ``docs/reference/metrics.md``) and are NOT confirmed for
  0.3.2 by that source; the live router 0.3.2 in tests/promtool/test_prometheus_surface.py shows
  ``worker`` (smg_worker_*), ``method``/``path`` (smg_http_requests_total) and ``status_code``
  (smg_http_responses_total). ``smg_router_request_errors_total`` is in the binary but has no
  series until a routing error, so the board does not use it (marked ``labels_confirmed=False``).
- NVIDIA dcgm-exporter (``monitoring.gpu_exporter: dcgm``): the names, types and units are those
  of its default counter set, ``etc/default-counters.csv`` in https://github.com/NVIDIA/dcgm-exporter
  (GPU_UTIL "GPU utilization (in %)", FB_USED "Framebuffer memory used (in MiB)", POWER_USAGE
  "Power draw (in W)", GPU_TEMP "GPU temperature (in C)", XID_ERRORS "Value of the last XID error
  encountered", a gauge, 0 when none). Every series carries ``gpu`` (the device index) and
  ``UUID``; its default listener is ``:9400`` (NVIDIA's dcgm-exporter command reference: "The
  default listener is :9400").
- ``up`` is Prometheus's own per-target series (always present for a configured target).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "histogram"]

SGLANG_SOURCE = "sglang 0.5.23 srt/observability/metrics_collector.py"
ROUTER_SOURCE = "sglang-router 0.3.2 sglang_router_rs.abi3.so (strings); labels: smg docs"
DCGM_SOURCE = "NVIDIA dcgm-exporter etc/default-counters.csv"
DCGM_DEFAULT_PORT = 9400  # dcgm-exporter's default listener (NVIDIA command reference)
MIB = 2**20  # DCGM_FI_DEV_FB_USED is in MiB (default-counters.csv)


@dataclass(frozen=True)
class Metric:
    name: str
    type: MetricType
    source: str
    labels_confirmed: bool = True


def _m(name: str, typ: MetricType, *, router: bool = False) -> Metric:
    if router:
        return Metric(name, typ, ROUTER_SOURCE, labels_confirmed=False)
    return Metric(name, typ, SGLANG_SOURCE)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        # scheduler gauges (metrics_collector.py SchedulerMetricsCollector)
        _m("sglang:num_running_reqs", "gauge"),
        _m("sglang:num_queue_reqs", "gauge"),
        _m("sglang:gen_throughput", "gauge"),
        _m("sglang:cache_hit_rate", "gauge"),
        _m("sglang:token_usage", "gauge"),  # max over pools ("the bottleneck")
        _m("sglang:full_token_usage", "gauge"),  # full-attention KV pool
        _m("sglang:swa_token_usage", "gauge"),  # sliding-window KV pool
        _m("sglang:num_used_tokens", "gauge"),
        _m("sglang:swa_used_tokens", "gauge"),
        _m("sglang:max_total_num_tokens", "gauge"),
        _m("sglang:max_total_num_tokens_swa", "gauge"),
        _m("sglang:spec_accept_length", "gauge"),
        _m("sglang:spec_accept_rate", "gauge"),
        # PD disaggregation
        _m("sglang:num_prefill_bootstrap_queue_reqs", "gauge"),
        _m("sglang:num_prefill_inflight_queue_reqs", "gauge"),
        _m("sglang:num_decode_prealloc_queue_reqs", "gauge"),
        _m("sglang:num_decode_transfer_queue_reqs", "gauge"),
        _m("sglang:num_bootstrap_failed_reqs_total", "counter"),
        _m("sglang:num_transfer_failed_reqs_total", "counter"),
        _m("sglang:kv_transfer_latency_ms", "histogram"),
        _m("sglang:kv_transfer_speed_gb_s", "histogram"),
        _m("sglang:kv_transfer_bootstrap_ms", "histogram"),
        # tokenizer metrics (TokenizerMetricsCollector)
        _m("sglang:prompt_tokens_total", "counter"),
        _m("sglang:generation_tokens_total", "counter"),
        _m("sglang:cached_tokens_total", "counter"),
        _m("sglang:num_requests_total", "counter"),
        _m("sglang:num_aborted_requests_total", "counter"),
        _m("sglang:time_to_first_token_seconds", "histogram"),
        _m("sglang:inter_token_latency_seconds", "histogram"),
        _m("sglang:e2e_request_latency_seconds", "histogram"),
        # router (sglang-router 0.3.2, prefix smg_)
        _m("smg_http_requests_total", "counter", router=True),
        _m("smg_http_request_duration_seconds", "histogram", router=True),
        _m("smg_http_responses_total", "counter", router=True),
        _m("smg_router_request_errors_total", "counter", router=True),
        _m("smg_worker_pool_size", "gauge", router=True),
        _m("smg_worker_health", "gauge", router=True),
        _m("smg_worker_requests_active", "gauge", router=True),
        _m("smg_worker_cb_state", "gauge", router=True),
        # GPUs (NVIDIA dcgm-exporter default counters)
        Metric("DCGM_FI_DEV_GPU_UTIL", "gauge", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_FB_USED", "gauge", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_FB_FREE", "gauge", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_POWER_USAGE", "gauge", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_GPU_TEMP", "gauge", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_XID_ERRORS", "gauge", DCGM_SOURCE),
        # Prometheus itself
        Metric("up", "gauge", "Prometheus scrape health"),
    )
}

# Largest finite bucket of SGLang 0.5.23's default histograms (metrics_collector.py,
# TokenizerMetricsCollector.__init__). histogram_quantile() cannot return more than the largest
# finite bucket, so a p95 threshold at or above it could never fire.
TTFT_MAX_BUCKET_S = 400.0
ITL_MAX_BUCKET_S = 8.0


def series_names(metric: Metric) -> tuple[str, ...]:
    """The series names a metric exposes (histograms: _bucket, _sum, _count)."""
    if metric.type == "histogram":
        return (f"{metric.name}_bucket", f"{metric.name}_sum", f"{metric.name}_count")
    return (metric.name,)


KNOWN_SERIES: frozenset[str] = frozenset(s for m in METRICS.values() for s in series_names(m))
