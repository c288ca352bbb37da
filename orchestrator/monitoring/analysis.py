"""Canary analysis: the wave just moved against the hosts not yet moved, from the engines' metrics.

Owns ``rollout.analysis`` at run time and in the plan: the PromQL of each comparison (SGLang
0.5.23's own histograms and counters, :mod:`orchestrator.monitoring.metrics`), asking the fleet's
Prometheus (``monitoring.prometheus_url``, its HTTP API ``/api/v1/query``), and the verdict: per
comparison the wave's value, the baseline's, the limit, pass or fail and a sentence with both
numbers. Like Flagger's and Argo Rollouts' analysis, no evidence is not a pass: a wave that served
too few requests, a metric with no data, or a Prometheus that does not answer fails the analysis,
and the rollout rolls the wave back as it would after a failed health check.

Engines are told apart by the ``instance`` label the fleet's scrape config gives them (the
address the router reaches each engine at, :func:`engine_instances`). The only I/O is the
``query`` callable (default :func:`prometheus_query`), so the plan can describe the analysis and
tests can run it against a real Prometheus.

The rollout driver calls it between waves (:meth:`orchestrator.apply.fleet_ops.FleetOps.
verify_wave`); a failed verdict rolls the wave back (:func:`orchestrator.apply.rollout.run_rollout`).
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from orchestrator.deployment import Deployment
from orchestrator.profile.schema import Analysis, AnalysisCheck

Query = Callable[[str], "float | None"]

HISTOGRAMS = {
    "ttft_p95": ("sglang:time_to_first_token_seconds", "s", "time to first token p95"),
    "itl_p95": ("sglang:inter_token_latency_seconds", "s", "inter-token latency p95"),
    "e2e_p95": ("sglang:e2e_request_latency_seconds", "s", "end-to-end latency p95"),
}


class PrometheusUnavailable(Exception):
    """Prometheus did not answer a query (the analysis then fails, never passes)."""


@dataclass(frozen=True)
class Comparison:
    metric: str
    window_s: int
    wave: float | None
    baseline: float | None
    limit: float | None  # the largest value the wave may have
    passed: bool
    reason: str


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str  # the first failure, or what passed
    requests: float | None  # requests the wave served in the longest window
    comparisons: tuple[Comparison, ...]

    def to_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "reason": self.reason, "requests": self.requests,
                "comparisons": [asdict(c) for c in self.comparisons]}


def enabled(a: Analysis, prometheus_url: str | None) -> bool:
    """Whether the analysis runs: checks are set and a Prometheus is named to ask."""
    return bool(a.checks) and prometheus_url is not None


def wait_seconds(analysis: Analysis) -> float:
    """How long a moved wave serves before it is compared: ``wait_s``, else the longest window
    (so the window holds the new release's requests only)."""
    if analysis.wait_s is not None:
        return float(analysis.wait_s)
    return float(max((c.window_s for c in analysis.checks), default=0))


def engine_instances(dep: Deployment) -> list[str]:
    """The ``instance`` labels of a host's engines in the fleet's scrape config."""
    return [f"{r.listen}:{r.port}" for r in dep.roles]


def selector(deployment: str, instances: Sequence[str]) -> str:
    alt = "|".join(re.escape(i) for i in sorted(instances))
    return f'deployment="{deployment}",instance=~"{alt.replace(chr(92), chr(92) * 2)}"'


def expression(check: AnalysisCheck, sel: str) -> str:
    w = f"{check.window_s}s"
    if check.metric == "abort_ratio":
        return (f"sum(rate(sglang:num_aborted_requests_total{{{sel}}}[{w}])) / "
                f"sum(rate(sglang:num_requests_total{{{sel}}}[{w}]))")
    metric = HISTOGRAMS[check.metric][0]
    return f"histogram_quantile(0.95, sum by (le) (rate({metric}_bucket{{{sel}}}[{w}])))"


def requests_expression(sel: str, window_s: int) -> str:
    return f"sum(increase(sglang:num_requests_total{{{sel}}}[{window_s}s]))"


def _fmt(metric: str, v: float) -> str:
    if metric == "abort_ratio":
        return f"{v * 100:.3g}%"
    return f"{v:.3g} s"


def describe_check(c: AnalysisCheck) -> str:
    name = HISTOGRAMS[c.metric][2] if c.metric in HISTOGRAMS else "aborted / all requests"
    limits = []
    if c.max_increase is not None:
        limits.append(f"at most {c.max_increase * 100:g}% above the baseline's")
    if c.max is not None:
        limits.append(f"at most {_fmt(c.metric, c.max)}")
    return f"{c.metric} ({name}) over {c.window_s} s: {' and '.join(limits)}"


def describe(a: Analysis, prometheus_url: str | None) -> list[str]:
    """What the plan says about the analysis (one line each), or that it is off and why."""
    if not a.checks:
        return ["canary analysis: off: rollout.analysis sets no checks; waves gate on health "
                "and the smoke prompt only"]
    if prometheus_url is None:
        return ["canary analysis: off: monitoring.prometheus_url is not set, so the "
                f"{len(a.checks)} rollout.analysis check(s) will not run"]
    return [f"canary analysis: after each wave serves {wait_seconds(a):g} s, {prometheus_url} "
            f"compares it with the hosts not yet moved (at least {a.min_requests} requests):",
            *(f"  - {describe_check(c)}" for c in a.checks)]


def _compare(c: AnalysisCheck, wave: float | None, base: float | None,
             have_baseline: bool) -> Comparison:
    if wave is None:
        return Comparison(c.metric, c.window_s, None, base, None, False,
                          f"{c.metric}: no data for the wave in the last {c.window_s} s")
    limits: list[float] = []
    if c.max is not None:
        limits.append(c.max)
    note = ""
    if c.max_increase is not None:
        if base is not None:
            limits.append(base * (1 + c.max_increase))
        elif have_baseline:
            # the hosts not yet moved served nothing in the window (a first rollout: they run no
            # release yet): said in the verdict, and only absolute limits apply
            note = (f" (the baseline served nothing in the last {c.window_s} s: not compared "
                    "with it)")
        else:
            note = " (no host left unmoved: no baseline to compare with)"
    limit = min(limits) if limits else None
    if limit is not None and wave > limit:
        if base is not None and c.max_increase is not None:
            ratio = f"{wave / base:.2f}x" if base > 0 else "above"
            why = (f"{c.metric} of the wave {_fmt(c.metric, wave)} is {ratio} the baseline's "
                   f"{_fmt(c.metric, base)} (allowed: +{c.max_increase * 100:g}%, at most "
                   f"{_fmt(c.metric, limit)})")
        else:
            why = (f"{c.metric} of the wave {_fmt(c.metric, wave)} is above "
                   f"{_fmt(c.metric, limit)}")
        return Comparison(c.metric, c.window_s, wave, base, limit, False, why)
    base_txt = f", baseline {_fmt(c.metric, base)}" if base is not None else ""
    lim_txt = f" (limit {_fmt(c.metric, limit)})" if limit is not None else ""
    return Comparison(c.metric, c.window_s, wave, base, limit, True,
                      f"{c.metric}: wave {_fmt(c.metric, wave)}{base_txt}{lim_txt}{note}")


def evaluate(analysis: Analysis, deployment: str, wave: Sequence[str], baseline: Sequence[str],
             query: Query) -> Verdict:
    """Compare the engines ``wave`` (instance labels) with ``baseline`` now."""
    sel_w = selector(deployment, wave)
    sel_b = selector(deployment, baseline) if baseline else None
    window = max(c.window_s for c in analysis.checks)
    try:
        served = query(requests_expression(sel_w, window))
        if served is None or served < analysis.min_requests:
            n = "no" if served is None else f"{served:.0f}"
            return Verdict(False, f"the wave served {n} requests in the last {window} s, fewer "
                           f"than rollout.analysis.min_requests={analysis.min_requests}: no "
                           "evidence it serves well", served, ())
        out = []
        for c in analysis.checks:
            w = query(expression(c, sel_w))
            b = query(expression(c, sel_b)) if sel_b is not None else None
            out.append(_compare(c, w, b, sel_b is not None))
    except PrometheusUnavailable as exc:
        return Verdict(False, f"analysis could not run: {exc}", None, ())
    failed = [c for c in out if not c.passed]
    if failed:
        return Verdict(False, "; ".join(c.reason for c in failed), served, tuple(out))
    return Verdict(True, f"{len(out)} comparison(s) passed: " + "; ".join(c.reason for c in out),
                   served, tuple(out))


def prometheus_query(url: str, timeout_s: float = 10.0) -> Query:
    """An instant query against ``url`` (``monitoring.prometheus_url``): the first sample's value,
    None for an empty result or NaN; :class:`PrometheusUnavailable` when it does not answer."""
    base = url.rstrip("/")

    def query(expr: str) -> float | None:
        full = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(full, timeout=timeout_s) as r:  # the schema allows http(s) only
                body = json.load(r)
        except urllib.error.HTTPError as exc:  # 400/422: Prometheus refused the expression
            raise PrometheusUnavailable(f"Prometheus at {base} refused {expr!r}: HTTP "
                                        f"{exc.code} {exc.read()[:300]!r}") from None
        except (OSError, ValueError) as exc:
            raise PrometheusUnavailable(
                f"Prometheus at {base} (monitoring.prometheus_url) did not answer: {exc}") from None
        if body.get("status") != "success":
            raise PrometheusUnavailable(f"Prometheus at {base} refused {expr!r}: "
                                        f"{body.get('error', body)}")
        result = body["data"]["result"]
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) or math.isinf(value) else value

    return query


def run(a: Analysis, prometheus_url: str | None, deployment: str, wave: Sequence[str],
        baseline: Sequence[str], *, sleep: Callable[[float], None] = time.sleep,
        query: Query | None = None) -> Verdict | None:
    """The analysis of one moved wave: wait, then compare. None when the analysis is off."""
    if not enabled(a, prometheus_url):
        return None
    assert prometheus_url is not None
    sleep(wait_seconds(a))
    q = query or prometheus_query(prometheus_url)
    return evaluate(a, deployment, wave, baseline, q)
