"""Monitoring shipped with every release: Prometheus scrape config, rules, rule tests, dashboard.

Owns :func:`release_files`, which the renderer calls to put the ``monitoring/`` part of a release
tree together. A pure function of the profile and its resolved deployment: the same inputs give
the same bytes (no clock, stable key order). Pieces: :mod:`.prometheus` (scrape config, rules,
promtool unit tests), :mod:`.dashboard` (Grafana JSON), :mod:`.metrics` (the metric names used,
with sources), :mod:`.selfmetrics` (dsv4ctl's own metrics, used by apply and status).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import yaml

from orchestrator.deployment import Deployment
from orchestrator.monitoring import dashboard, prometheus
from orchestrator.profile.schema import Profile


class Plan(Protocol):
    """What :func:`plan_rules_file` reads of a plan (:class:`orchestrator.planner_model.Plan`,
    a layer above this one: a protocol here, not an import up)."""

    @property
    def files(self) -> Sequence[Any]: ...
    @property
    def capacity(self) -> Sequence[Any]: ...
    @property
    def gpus(self) -> Sequence[Any]: ...
    @property
    def deployment(self) -> Deployment: ...

DASHBOARD_FILE = "grafana-dashboard.json"


def release_files(profile: Profile, deployment: Deployment) -> dict[str, str]:
    """Files for ``<release>/monitoring/``: path relative to that directory → text.

    ``prometheus.yml`` (scrape config; ``rule_files`` points at ``rules.yml`` next to it),
    ``rules.yml`` (recording + alerting rules), ``rules_test.yml`` (``promtool test rules``
    cases for every alert) and ``grafana-dashboard.json``. Empty when
    ``profile.monitoring.enabled`` is false. Raises :class:`orchestrator.errors.RenderError`
    when a threshold could never fire.
    """
    if not profile.monitoring.enabled or (not deployment.roles and deployment.router is None):
        return {}
    # a fleet's router host gets the fleet-wide set (every engine host, the router, the GPUs):
    # the one Prometheus that sees the whole fleet, which canary analysis compares hosts on
    out = prometheus.files(profile, deployment)
    out[DASHBOARD_FILE] = dashboard.dashboard_json(profile, deployment)
    return dict(sorted(out.items()))


def plan_rules_file(plan: Plan) -> tuple[str, str] | None:
    """``(path in the release, text)`` of the plan's per-GPU memory prediction for Prometheus
    (:func:`prometheus.plan_rules`), or None when the release scrapes no GPU exporter or the plan
    sized no GPU. Apply writes it beside ``plan.json``: the number is the plan's, so a release
    rendered without a plan has none (its ``rule_files`` entry is a glob for that reason).

    Predicted use of a GPU = what the planner puts on it: CUDA context and NCCL before SGLang's
    baseline, the weights, the KV pools, the request table, and the headroom model's worst-moment
    need (activations, indexer logits, CUDA graphs) of its role."""
    scrape = next((f.content for f in plan.files
                   if f.path == "monitoring/prometheus.yml" and f.content), None)
    if scrape is None:
        return None
    jobs = yaml.safe_load(scrape).get("scrape_configs", [])
    gpu = [t for j in jobs if j["job_name"].endswith("-gpu")
           for c in j["static_configs"] for t in c["targets"]]
    need = {c.role: c.headroom_need_bytes for c in plan.capacity}
    rows = [(g.index, g.role, g.preload_bytes + g.weights_bytes + g.kv_bytes
             + g.req_to_token_bytes + need.get(g.role, 0)) for g in plan.gpus if g.role]
    if len(gpu) != 1 or not rows:  # a fleet's router host scrapes many hosts and sizes no GPU
        return None
    text = prometheus.plan_rules(plan.deployment, rows, gpu[0])
    return f"monitoring/{prometheus.PLAN_RULES_FILE}", text
