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
from orchestrator.errors import RenderError
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
    @property
    def host(self) -> str: ...

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


def _predicted_bytes(plan: Plan) -> list[tuple[int, str, int]]:
    """(index, role, predicted bytes) of every GPU the plan puts a role on: the one computation of
    a GPU's predicted use, whichever Prometheus carries it (the host's own, or a fleet's router
    host's). Predicted use = what the planner puts on the GPU: CUDA context and NCCL before
    SGLang's baseline, the weights, the KV pools, the request table, and the headroom model's
    worst-moment need (activations, indexer logits, CUDA graphs) of its role."""
    need = {c.role: c.headroom_need_bytes for c in plan.capacity}
    return [(g.index, g.role, g.preload_bytes + g.weights_bytes + g.kv_bytes
             + g.req_to_token_bytes + need.get(g.role, 0)) for g in plan.gpus if g.role]


def plan_rules_file(plan: Plan, fleet: Sequence[Plan] = ()) -> tuple[str, str] | None:
    """``(path in the release, text)`` of the per-GPU memory prediction for the Prometheus of
    ``plan``'s host (:func:`prometheus.plan_rules`), or None when that Prometheus scrapes no GPU
    exporter or no plan sized a GPU it scrapes. Apply writes it beside ``plan.json``: the numbers
    are the plans', so a release rendered without a plan has none (its ``rule_files`` entry is a
    glob for that reason).

    Each GPU's row is :func:`_predicted_bytes` of its own host's plan, labelled with the GPU
    exporter target this Prometheus scrapes that host at (``instance``). A host scrapes its own
    exporter; a fleet's router host (:func:`prometheus.scrapes_fleet`) every engine host's, so
    there the rows come from ``fleet``, every host's plan (``FleetPlan.plans``; ignored on any
    other host). Given no fleet, the router host gets no rules rather than a part of them."""
    scrape = next((f.content for f in plan.files
                   if f.path == "monitoring/prometheus.yml" and f.content), None)
    if scrape is None:
        return None
    jobs = yaml.safe_load(scrape).get("scrape_configs", [])
    gpu = [t for j in jobs if j["job_name"].endswith("-gpu")
           for c in j["static_configs"] for t in c["targets"]]
    wide = prometheus.scrapes_fleet(plan.deployment)
    if not gpu or (wide and not fleet):
        return None
    # the exporter of a host is scraped at the address its engines are (prometheus.gpu_targets):
    # an engine's listen address, as the router reaches it
    exporter = {t.rsplit(":", 1)[0]: t for t in gpu}
    rows: list[tuple[str, int, str, int]] = []
    for p in fleet if wide else (plan,):
        listen = {r.name: r.listen for r in p.deployment.roles}
        for idx, role, n in _predicted_bytes(p):
            instance = exporter.get(listen[role])
            if instance is None:
                raise RenderError(
                    f"host '{p.host}': its {role} listens on {listen[role]}, where the "
                    f"Prometheus of host '{plan.host}' scrapes no GPU exporter (it scrapes "
                    f"{', '.join(gpu)})", fix="re-plan the whole fleet together: dsv4ctl plan "
                    "PROFILE (a plan of another fleet, or edited, was given)")
            rows.append((instance, idx, role, n))
    if not rows:
        return None
    text = prometheus.plan_rules(plan.deployment, rows)
    return f"monitoring/{prometheus.PLAN_RULES_FILE}", text
