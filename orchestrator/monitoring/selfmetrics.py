"""dsv4ctl's own metrics: what the last apply or rollback did, in Prometheus text format.

Owns the translation of release records into metrics for two consumers: the node exporter's
textfile collector on the host (apply writes :func:`textfile_for`'s text atomically into
``monitoring.textfile_dir`` after every apply and rollback) and ``dsv4ctl status --format
prometheus`` (:func:`status_text`, which adds the live health of each role).

Input is :class:`ReleaseMetrics`, a small record the apply engine fills from its release record;
keeping it separate means this module does not depend on the release journal's layout. Output is
built with ``prometheus_client`` metric families in a private registry and rendered with
``generate_latest`` (the same encoder ``write_to_textfile`` uses). Deterministic: families and
samples are emitted in a fixed order, no ``_created`` timestamps.

Metrics (labels in braces), per deployment, from the most recent record:
  dsv4ctl_release_info{deployment,release,profile,result}        1
  dsv4ctl_active_release_info{deployment,release,profile}        1 (the release `current` points at)
  dsv4ctl_last_apply_timestamp_seconds{deployment}               when it finished (unix time)
  dsv4ctl_last_apply_duration_seconds{deployment}
  dsv4ctl_last_apply_success{deployment}                         1 success, 0 otherwise
  dsv4ctl_last_apply_result{deployment,result}                   1 for the result, 0 for the others
  dsv4ctl_last_health_check_duration_seconds{deployment,role}
  dsv4ctl_last_qualify_passed{deployment}                        only when qualification ran
  dsv4ctl_last_qualify_figure{deployment,figure}                 numeric qualification figures
  dsv4ctl_kv_pool_tokens{deployment,role,kind}                   KV pool per rank: kind=predicted
                                                                 (the plan) or measured (the
                                                                 engine), from the newest record
                                                                 that measured one (issue 22)
and over all records given (the history dsv4ctl keeps; pruning old records can lower these,
which Prometheus treats as a counter reset):
  dsv4ctl_applies_total{deployment,result}
  dsv4ctl_rollbacks_total{deployment}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.errors import DsvError

Result = Literal["success", "failed", "rolled_back", "rollback_failed"]
RESULTS: tuple[Result, ...] = ("success", "failed", "rolled_back", "rollback_failed")


@dataclass(frozen=True)
class ReleaseMetrics:
    """What one apply (or rollback) did, as far as metrics are concerned.

    deployment: the profile's ``name``. release_id: the release directory name. profile: the
    profile's name or path as the operator knows it. finished_at: unix seconds when the operation
    ended. apply_duration_s: wall time of the whole operation. health_check_durations_s: role name
    (``engine``, ``prefill``, ``decode``, ``router``) → seconds until it was healthy (or until the
    check gave up). result: see :data:`RESULTS`. rollbacks: rollbacks this operation performed
    (1 for an apply that rolled back or an explicit ``dsv4ctl rollback``, else 0). active: whether
    ``current`` points at this release now. qualify_passed / qualify_figures: the qualification
    outcome, when one ran (non-numeric figures are left out of the metrics).
    """

    deployment: str
    release_id: str
    profile: str
    finished_at: float
    apply_duration_s: float
    result: Result
    health_check_durations_s: Mapping[str, float] = field(default_factory=dict)
    rollbacks: int = 0
    active: bool = False
    qualify_passed: bool | None = None
    qualify_figures: Mapping[str, float | int | str] = field(default_factory=dict)
    #: role -> (predicted, measured) KV pool tokens per rank, from the measure step
    pool_tokens: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if self.result not in RESULTS:
            problems.append(f"result={self.result!r} is not one of {', '.join(RESULTS)}")
        for name, value in (("finished_at", self.finished_at),
                            ("apply_duration_s", self.apply_duration_s),
                            *((f"health_check_durations_s[{k}]", v)
                              for k, v in self.health_check_durations_s.items())):
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                problems.append(f"{name}={value!r} must be a finite number >= 0")
        if self.rollbacks < 0:
            problems.append(f"rollbacks={self.rollbacks} must be >= 0")
        for name, value in (("deployment", self.deployment), ("release_id", self.release_id)):
            if not value:
                problems.append(f"{name} must not be empty")
        if problems:
            raise DsvError(
                f"release record of {self.deployment or '?'}/{self.release_id or '?'} cannot be "
                f"exported as metrics: {'; '.join(problems)}",
                fix="this is a dsv4ctl bug in the caller that built the record; report it",
            )


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self._families)


def _families(records: Sequence[ReleaseMetrics]) -> list[Metric]:
    by_dep: dict[str, list[ReleaseMetrics]] = {}
    for r in records:
        by_dep.setdefault(r.deployment, []).append(r)
    deps = sorted(by_dep)

    info = GaugeMetricFamily("dsv4ctl_release_info", "The most recent release of a deployment.",
                             labels=["deployment", "release", "profile", "result"])
    active = GaugeMetricFamily("dsv4ctl_active_release_info",
                               "The release the deployment's current link points at.",
                               labels=["deployment", "release", "profile"])
    ts = GaugeMetricFamily("dsv4ctl_last_apply_timestamp_seconds",
                           "When the most recent apply or rollback finished (unix time).",
                           labels=["deployment"])
    dur = GaugeMetricFamily("dsv4ctl_last_apply_duration_seconds",
                            "Wall time of the most recent apply or rollback.",
                            labels=["deployment"])
    ok = GaugeMetricFamily("dsv4ctl_last_apply_success",
                           "1 when the most recent apply succeeded.", labels=["deployment"])
    res = GaugeMetricFamily("dsv4ctl_last_apply_result",
                            "Result of the most recent apply (one-hot).",
                            labels=["deployment", "result"])
    health = GaugeMetricFamily("dsv4ctl_last_health_check_duration_seconds",
                               "Seconds each role took to pass its health check in the most "
                               "recent apply.", labels=["deployment", "role"])
    qpass = GaugeMetricFamily("dsv4ctl_last_qualify_passed",
                              "1 when the most recent qualification passed.", labels=["deployment"])
    qfig = GaugeMetricFamily("dsv4ctl_last_qualify_figure",
                             "Numeric figures measured by the most recent qualification.",
                             labels=["deployment", "figure"])
    applies = CounterMetricFamily("dsv4ctl_applies", "Applies in the kept history, by result.",
                                  labels=["deployment", "result"])
    rollbacks = CounterMetricFamily("dsv4ctl_rollbacks", "Rollbacks in the kept history.",
                                    labels=["deployment"])
    pool = GaugeMetricFamily("dsv4ctl_kv_pool_tokens",
                             "KV pool tokens per rank: the plan's prediction and the engine's "
                             "report after its start (newest measured release).",
                             labels=["deployment", "role", "kind"])

    for dep in deps:
        recs = sorted(by_dep[dep], key=lambda r: (r.finished_at, r.release_id))
        last = recs[-1]
        info.add_metric([dep, last.release_id, last.profile, last.result], 1)
        for r in recs:
            if r.active:
                active.add_metric([dep, r.release_id, r.profile], 1)
        ts.add_metric([dep], last.finished_at)
        dur.add_metric([dep], last.apply_duration_s)
        ok.add_metric([dep], 1 if last.result == "success" else 0)
        for result in RESULTS:
            res.add_metric([dep, result], 1 if last.result == result else 0)
        for role in sorted(last.health_check_durations_s):
            health.add_metric([dep, role], last.health_check_durations_s[role])
        if last.qualify_passed is not None:
            qpass.add_metric([dep], 1 if last.qualify_passed else 0)
        for fig in sorted(last.qualify_figures):
            value = last.qualify_figures[fig]
            if isinstance(value, bool):
                value = int(value)
            if isinstance(value, int | float) and math.isfinite(value):
                qfig.add_metric([dep, fig], float(value))
        for result in RESULTS:
            applies.add_metric([dep, result], sum(1 for r in recs if r.result == result))
        rollbacks.add_metric([dep], sum(r.rollbacks for r in recs))
        measured = [r for r in recs if r.pool_tokens]
        if measured:
            newest = measured[-1].pool_tokens
            for role in sorted(newest):
                pool.add_metric([dep, role, "predicted"], newest[role][0])
                pool.add_metric([dep, role, "measured"], newest[role][1])
    return [info, active, ts, dur, ok, res, health, qpass, qfig, applies, rollbacks, pool]


def _render(families: list[Metric]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode("utf-8")


def textfile_for(records: Sequence[ReleaseMetrics]) -> str:
    """Node-exporter textfile text for ``records`` (any order, any deployments).

    The caller writes it atomically (temp file in the same directory + ``os.replace``) to
    ``<textfile_dir>/dsv4ctl-<deployment>.prom``; the collector only reads ``*.prom`` files.
    """
    return _render(_families(records))


def status_text(records: Sequence[ReleaseMetrics],
                roles_healthy: Mapping[str, Mapping[str, bool]] | None = None) -> str:
    """``dsv4ctl status --format prometheus``: the textfile metrics plus live health per role.

    ``roles_healthy``: deployment → role → whether its health endpoint answered OK just now.
    """
    families = _families(records)
    up = GaugeMetricFamily("dsv4ctl_role_healthy",
                           "1 when the role's health endpoint answered OK during `dsv4ctl status`.",
                           labels=["deployment", "role"])
    for dep in sorted(roles_healthy or {}):
        roles = (roles_healthy or {})[dep]
        for role in sorted(roles):
            up.add_metric([dep, role], 1 if roles[role] else 0)
    return _render([*families, up])
