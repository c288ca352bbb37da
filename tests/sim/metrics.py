"""Prometheus text exposition for the engine simulator, with SGLang 0.5.23's metric names.

Owns the live counters/gauges/histograms the simulator updates per request and their
rendering in the text format 0.0.4, so dashboards, alert rules and probes can be tested
against the same names and labels the real server exports. Names, label sets and histogram
buckets are taken from sglang 0.5.23 `srt/observability/metrics_collector.py` (scheduler
labels `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank[, dp_rank]`; TTFT and e2e
histograms add `is_streaming`). Counters are exposed with the `_total` suffix the way
prometheus_client does. Stdlib only.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = [*TTFT_BUCKETS, 600, 1200, 1800, 2400]
# PD KV transfer histograms (metrics_collector.py SchedulerMetricsCollector, scheduler labels)
KV_TRANSFER_BUCKETS = {
    "sglang:kv_transfer_speed_gb_s": [0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400],
    "sglang:kv_transfer_latency_ms": [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000],
    "sglang:kv_transfer_bootstrap_ms": [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500],
    "sglang:kv_transfer_alloc_ms": [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500],
    "sglang:kv_transfer_total_mb": [1, 5, 10, 50, 100, 500, 1000, 5000, 10000],
}
# what one simulated transfer observes (a 64 MB KV at 20 GB/s)
KV_TRANSFER_SAMPLE = {"sglang:kv_transfer_speed_gb_s": 20.0, "sglang:kv_transfer_latency_ms": 12.0,
                      "sglang:kv_transfer_bootstrap_ms": 2.0, "sglang:kv_transfer_alloc_ms": 1.0,
                      "sglang:kv_transfer_total_mb": 64.0}
ITL_BUCKETS = [
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
    0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0,
]


def _fmt_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in labels.items()
    )
    return "{" + inner + "}"


def _num(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v))


class Histogram:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = list(buckets)
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.total += v
        self.n += 1

    def lines(self, name: str, labels: dict[str, str]) -> list[str]:
        out, cum = [], 0
        for b, c in zip([*self.buckets, float("inf")], self.counts, strict=True):
            cum += c
            out.append(f"{name}_bucket{_fmt_labels({**labels, 'le': _num(b)})} {cum}")
        out.append(f"{name}_sum{_fmt_labels(labels)} {_num(self.total)}")
        out.append(f"{name}_count{_fmt_labels(labels)} {self.n}")
        return out


class EngineMetrics:
    """Live state of one simulated engine, rendered on demand."""

    def __init__(self, *, model_name: str, engine_type: str, attn_dp_size: int,
                 max_total_tokens: int, speculative: bool, start_time: float) -> None:
        self.lock = threading.Lock()
        self.model_name = model_name
        self.engine_type = engine_type
        self.dp_ranks = list(range(attn_dp_size)) if attn_dp_size > 1 else [None]
        self.max_total_tokens = max_total_tokens
        self.speculative = speculative
        self.start_time = start_time
        self.running = 0
        self.queued = 0
        self.active_tokens = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.aborted_total = 0
        self.http_total = 0
        self.http_active = 0
        self.recent: deque[tuple[float, int]] = deque()
        self.ttft = {s: Histogram(TTFT_BUCKETS) for s in ("true", "false")}
        self.e2e = {s: Histogram(E2E_BUCKETS) for s in ("true", "false")}
        self.itl = Histogram(ITL_BUCKETS)
        self.queue_time = Histogram(TTFT_BUCKETS)
        self.kv_transfer = ({n: Histogram(b) for n, b in KV_TRANSFER_BUCKETS.items()}
                            if engine_type in ("prefill", "decode") else {})
        self.cache_hit_rate = 0.0
        self.spec_accept_length = 3.2
        self.overrides: dict[str, float] = {}

    def note_kv_transfer(self) -> None:
        """One request's KV transfer (PD roles only; caller holds the lock)."""
        for name, h in self.kv_transfer.items():
            h.observe(KV_TRANSFER_SAMPLE[name])

    def note_tokens(self, n: int) -> None:
        with self.lock:
            self.generation_tokens_total += n
            self.recent.append((time.monotonic(), n))

    def _gen_throughput(self) -> float:
        now = time.monotonic()
        while self.recent and self.recent[0][0] < now - 5.0:
            self.recent.popleft()
        return sum(n for _, n in self.recent) / 5.0

    def render(self) -> str:
        with self.lock:
            return self._render()

    def _render(self) -> str:
        out: list[str] = []
        base = {"model_name": self.model_name, "engine_type": self.engine_type,
                "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        ranks = [base if r is None else {**base, "dp_rank": str(r)} for r in self.dp_ranks]
        nr = len(self.dp_ranks)
        usage = min(1.0, self.active_tokens / max(1, self.max_total_tokens))
        gauges: dict[str, float] = {
            "sglang:num_running_reqs": self.running / nr,
            "sglang:num_queue_reqs": self.queued / nr,
            "sglang:num_used_tokens": self.active_tokens / nr,
            "sglang:token_usage": usage,
            "sglang:full_token_usage": usage,
            "sglang:swa_token_usage": usage,
            "sglang:swa_used_tokens": self.active_tokens / nr,
            "sglang:max_total_num_tokens": self.max_total_tokens,
            "sglang:max_total_num_tokens_swa": self.max_total_tokens // 10,
            "sglang:gen_throughput": self._gen_throughput() / nr,
            "sglang:cache_hit_rate": self.cache_hit_rate,
            "sglang:utilization": 1.0 if self.running else 0.0,
            "sglang:is_cuda_graph": 1.0,
            "sglang:num_retracted_reqs": 0.0,
            "sglang:kv_cache_memory_usage_gb": 40.0,
            "sglang:weight_memory_usage_gb": 20.0,
        }
        if self.speculative:
            gauges["sglang:spec_accept_length"] = self.spec_accept_length
            gauges["sglang:spec_accept_rate"] = min(1.0, self.spec_accept_length / 4.0)
        if self.engine_type == "prefill":
            gauges["sglang:num_prefill_bootstrap_queue_reqs"] = 0.0
            gauges["sglang:num_prefill_inflight_queue_reqs"] = self.running / nr
        if self.engine_type == "decode":
            gauges["sglang:num_decode_prealloc_queue_reqs"] = 0.0
            gauges["sglang:num_decode_transfer_queue_reqs"] = 0.0
        gauges.update(self.overrides)
        for name in sorted(gauges):
            out.append(f"# HELP {name} Simulated {name}.")
            out.append(f"# TYPE {name} gauge")
            for lab in ranks:
                out.append(f"{name}{_fmt_labels(lab)} {_num(gauges[name])}")
        counters = {
            "sglang:prompt_tokens_total": self.prompt_tokens_total,
            "sglang:generation_tokens_total": self.generation_tokens_total,
            "sglang:cached_tokens_total": 0,
            "sglang:num_requests_total": self.requests_total,
            "sglang:num_aborted_requests_total": self.aborted_total,
        }
        if self.engine_type in ("prefill", "decode"):
            counters["sglang:num_bootstrap_failed_reqs_total"] = 0
            counters["sglang:num_transfer_failed_reqs_total"] = 0
        tok = {"model_name": self.model_name, "engine_type": self.engine_type}
        for name in sorted(counters):
            out.append(f"# HELP {name} Simulated {name}.")
            out.append(f"# TYPE {name} counter")
            out.append(f"{name}{_fmt_labels(tok)} {_num(counters[name])}")
        out.append("# HELP sglang:http_requests_total HTTP requests received.")
        out.append("# TYPE sglang:http_requests_total counter")
        out.append(f"sglang:http_requests_total{_fmt_labels(tok)} {_num(self.http_total)}")
        out.append("# HELP sglang:http_requests_active HTTP requests in flight.")
        out.append("# TYPE sglang:http_requests_active gauge")
        out.append(f"sglang:http_requests_active{_fmt_labels(tok)} {_num(self.http_active)}")
        out.append("# HELP sglang:startup_time_seconds Simulated startup time.")
        out.append("# TYPE sglang:startup_time_seconds gauge")
        out.append(f"sglang:startup_time_seconds{_fmt_labels(tok)} 1.0")
        for name, hists in (("sglang:time_to_first_token_seconds", self.ttft),
                            ("sglang:e2e_request_latency_seconds", self.e2e)):
            out.append(f"# HELP {name} Simulated {name}.")
            out.append(f"# TYPE {name} histogram")
            for s, h in hists.items():
                out.extend(h.lines(name, {**tok, "is_streaming": s}))
        for name, h in (("sglang:inter_token_latency_seconds", self.itl),
                        ("sglang:queue_time_seconds", self.queue_time)):
            out.append(f"# HELP {name} Simulated {name}.")
            out.append(f"# TYPE {name} histogram")
            out.extend(h.lines(name, tok))
        for name, h in sorted(self.kv_transfer.items()):
            out.append(f"# HELP {name} Simulated {name}.")
            out.append(f"# TYPE {name} histogram")
            for lab in ranks:
                out.extend(h.lines(name, lab))
        return "\n".join(out) + "\n"


def router_metrics(*, requests: dict[str, int], workers: list[dict[str, Any]]) -> str:
    """`smg_` metrics of the router double (names as in sglang-router 0.3.2's binary)."""
    out = ["# HELP smg_http_requests_total HTTP requests by route.",
           "# TYPE smg_http_requests_total counter"]
    for route in sorted(requests):
        out.append(f"smg_http_requests_total{_fmt_labels({'route': route})} {requests[route]}")
    out += ["# HELP smg_worker_pool_size Workers per type.", "# TYPE smg_worker_pool_size gauge"]
    for wtype in ("prefill", "decode"):
        n = sum(1 for w in workers if w["worker_type"] == wtype)
        out.append(f"smg_worker_pool_size{_fmt_labels({'worker_type': wtype})} {n}")
    out += ["# HELP smg_worker_cb_state Circuit breaker state (0 closed, 1 open).",
            "# TYPE smg_worker_cb_state gauge"]
    for w in workers:
        out.append(f"smg_worker_cb_state{_fmt_labels({'worker': w['url']})} "
                   f"{0 if w['is_healthy'] else 1}")
    out += ["# HELP smg_worker_health Worker health (1 healthy).",
            "# TYPE smg_worker_health gauge"]
    for w in workers:
        out.append(f"smg_worker_health{_fmt_labels({'worker': w['url'], 'worker_type': w['worker_type']})} "
                   f"{1 if w['is_healthy'] else 0}")
    return "\n".join(out) + "\n"
