"""Monitoring shipped with every release: Prometheus scrape config, rules, rule tests, dashboard.

Owns :func:`release_files`, which the renderer calls to put the ``monitoring/`` part of a release
tree together. A pure function of the profile and its resolved deployment: the same inputs give
the same bytes (no clock, stable key order). Pieces: :mod:`.prometheus` (scrape config, rules,
promtool unit tests), :mod:`.dashboard` (Grafana JSON), :mod:`.metrics` (the metric names used,
with sources), :mod:`.selfmetrics` (dsv4ctl's own metrics, used by apply and status).
"""

from __future__ import annotations

from orchestrator.deployment import Deployment
from orchestrator.monitoring import dashboard, prometheus
from orchestrator.profile.schema import Profile

DASHBOARD_FILE = "grafana-dashboard.json"


def release_files(profile: Profile, deployment: Deployment) -> dict[str, str]:
    """Files for ``<release>/monitoring/``: path relative to that directory → text.

    ``prometheus.yml`` (scrape config; ``rule_files`` points at ``rules.yml`` next to it),
    ``rules.yml`` (recording + alerting rules), ``rules_test.yml`` (``promtool test rules``
    cases for every alert) and ``grafana-dashboard.json``. Empty when
    ``profile.monitoring.enabled`` is false. Raises :class:`orchestrator.errors.RenderError`
    when a threshold could never fire.
    """
    if not profile.monitoring.enabled or not deployment.roles:
        # a fleet's router-only host (issue 23) runs no engine: nothing of this set applies to it
        return {}
    out = prometheus.files(profile, deployment)
    out[DASHBOARD_FILE] = dashboard.dashboard_json(profile, deployment)
    return dict(sorted(out.items()))
