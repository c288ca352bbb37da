"""`diff` and `plan` say what a change really costs: knobs only dsv4ctl reads restart nothing,
and a fleet's downtime follows its rollout strategy.

The symptoms: changing `health.startup_timeout_s` (a knob the engine never sees) restarted every
engine; a fleet rolling update was predicted as "a full outage" while the real run served 3,001
requests with 0 failures (tests/integration/test_fleet_rollout.py checks the prediction against
the load loop).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from tests.validate.helpers import INVENTORY, PROFILES

DSV4CTL_ONLY = [  # (field, new value): read by dsv4ctl (apply, health, rollout, monitoring)
    ("health.startup_timeout_s", 900), ("health.poll_interval_s", 2.0),
    ("health.stability_window_s", 60), ("health.smoke_max_tokens", 8),
    ("health.smoke_prompt", "Say ok"), ("rollout.keep_releases", 7),
    ("rollout.rollback_on_failure", False), ("rollout.rollback_timeout_s", 600),
    ("rollout.strategy.canary", 0), ("rollout.strategy.max_unavailable", 2),
    ("rollout.strategy.drain_timeout_s", 30), ("monitoring.scrape_interval_s", 30),
    ("monitoring.alerts.kv_usage_high", 0.8), ("monitoring.alerts.for_minutes", 10),
]


def _set(d: dict, dotted: str, value: object) -> dict:
    node = d
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return d


def _diff(tmp_path: Path, capsys: pytest.CaptureFixture[str], base: str,
          changes: list[tuple[str, object]]) -> dict:
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    old = yaml.safe_load((PROFILES / base).read_text())
    new = yaml.safe_load((PROFILES / base).read_text())
    for field, value in changes:
        _set(new, field, value)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(old, sort_keys=False))
    b.write_text(yaml.safe_dump(new, sort_keys=False))
    assert main(["diff", str(a), str(b), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("base", ["default.yaml", "fleet-3x.yaml"])
@pytest.mark.parametrize("field,value", DSV4CTL_ONLY, ids=[f for f, _ in DSV4CTL_ONLY])
def test_a_knob_only_dsv4ctl_reads_restarts_nothing(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    base: str, field: str, value: object) -> None:
    d = _diff(tmp_path, capsys, base, [(field, value)])
    assert [f["path"] for f in d["fields"]] == [field]
    assert d["summary"]["restarts"] == []
    assert not [a for a in d["actions"] if a["kind"] in ("stop", "restart", "start")]


def test_a_fleet_rolling_update_is_no_outage(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = _diff(tmp_path, capsys, "fleet-3x.yaml", [("topology.engine.cuda_graph_max_bs", 32)])
    assert d["summary"]["restarts"] == ["engine"]
    assert d["summary"]["outage"] is False
    assert d["summary"]["downtime"].startswith("no outage: the rollout drains 1 host at a time")


def test_a_fleet_updated_all_at_once_is_an_outage(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    d = _diff(tmp_path, capsys, "fleet-3x.yaml", [
        ("topology.engine.cuda_graph_max_bs", 32), ("rollout.strategy.canary", 0),
        ("rollout.strategy.max_unavailable", 3)])
    assert d["summary"]["outage"] is True
    assert d["summary"]["downtime"].startswith("a full outage of role engine during wave 1")


def test_the_fleet_plan_states_its_downtime(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(PROFILES / "fleet-3x.yaml"), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["downtime"].startswith("no outage")  # a first deploy stops nothing


def test_the_one_rule_of_waves() -> None:
    from orchestrator.apply.rollout import Strategy, waves
    from orchestrator.planner.rollout import waves as plan_waves

    hosts = ["a", "b", "c", "d", "e"]
    for canary, step in ((1, 1), (0, 2), (2, 3), (1, 10)):
        s = Strategy(canary=canary, max_unavailable=step)
        assert waves(hosts, s) == plan_waves(hosts, canary, step)
    assert plan_waves(hosts, 1, 2) == [["a"], ["b", "c"], ["d", "e"]]


def test_no_drain_says_running_requests_fail(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = _diff(tmp_path, capsys, "fleet-3x.yaml", [("topology.engine.cuda_graph_max_bs", 32),
                                                  ("rollout.strategy.drain_timeout_s", 0)])
    assert d["summary"]["outage"] is False
    assert "drain_timeout_s 0: requests still running on a host" in d["summary"]["downtime"]
