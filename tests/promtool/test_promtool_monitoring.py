"""promtool over every shipped profile's monitoring output, hand-written rule tests, and the
dashboard's PromQL.

Checks, per shipped profile: `promtool check config` / `check rules` / `test rules` on the files a
release ships; every alert has a firing and a quiet case in the shipped rule tests, and those
cases bite (an alert that never fires, or always fires, makes `promtool test rules` fail); every
dashboard expression parses in promtool; every metric name used is one SGLang 0.5.23 or
sglang-router 0.3.2 exports (or one of our recording rules). A hand-written test file checks
thresholds taken from a custom profile, independently of the generated cases.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.monitoring import dashboard, release_files
from orchestrator.monitoring.metrics import KNOWN_SERIES
from orchestrator.monitoring.prometheus import PLANNED_FB
from orchestrator.monitoring.selfmetrics import ReleaseMetrics, status_text, textfile_for
from orchestrator.paths import data_dir
from orchestrator.profile.loader import load_text
from orchestrator.profile.schema import Profile
from tests.promtool.support import resolve_inline, resolved, shipped_profile_paths

HERE = Path(__file__).resolve().parent
PROFILES = shipped_profile_paths()
Promtool = Callable[..., Any]


def write_release(profile: Profile, dep: Any, where: Path) -> dict[str, str]:
    files = release_files(profile, dep)
    for rel, text in files.items():
        (where / rel).write_text(text, encoding="utf-8")
    return files


def ok(res: Any) -> str:
    return f"rc={res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"


@pytest.fixture(params=PROFILES, ids=[p.stem for p in PROFILES])
def shipped(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Profile, Any, Path]:
    profile, dep = resolved(request.param)
    write_release(profile, dep, tmp_path)
    return profile, dep, tmp_path


def test_promtool_accepts_shipped_monitoring(shipped: tuple[Profile, Any, Path],
                                             promtool: Promtool) -> None:
    _, _, d = shipped
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", "rules.yml"),
                 ("test", "rules", "rules_test.yml")):
        res = promtool(*args, cwd=d)
        assert res.returncode == 0, f"promtool {' '.join(args)} failed:\n{ok(res)}"
    assert "SUCCESS" in promtool("test", "rules", "rules_test.yml", cwd=d).stdout


def _alerts(rules_path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(rules_path.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_firing_and_quiet_cases(shipped: tuple[Profile, Any, Path]) -> None:
    _, dep, d = shipped
    tests = yaml.safe_load((d / "rules_test.yml").read_text())["tests"]
    names = {a["alert"] for a in _alerts(d / "rules.yml")}
    expected = {"DSV4EngineDown", "DSV4KVCacheFullPoolHigh", "DSV4KVCacheSWAPoolHigh",
                "DSV4QueueGrowing", "DSV4TTFTHigh", "DSV4ITLHigh", "DSV4RequestsAborted"}
    if dep.router is not None:
        expected |= {"DSV4RouterDown", "DSV4RouterWorkerUnhealthy"}
    if dep.pd:  # a fleet's PD host may have no router of its own (issue 23)
        expected |= {"DSV4PDBootstrapFailures", "DSV4PDTransferFailures"}
    if dep.speculative_algorithm != "none":
        expected.add("DSV4SpecAcceptanceCollapsed")
    expected |= {"DSV4GPUXidError", "DSV4GPUMemoryAbovePlan"}  # gpu_exporter: dcgm (default)
    assert names == expected
    for name in names:
        cases = [t["alert_rule_test"][0] for t in tests
                 if t["alert_rule_test"][0]["alertname"] == name]
        assert any(c["exp_alerts"] for c in cases), f"{name}: no firing case"
        assert any(not c["exp_alerts"] for c in cases), f"{name}: no quiet case"


def test_shipped_rule_tests_bite(shipped: tuple[Profile, Any, Path], promtool: Promtool) -> None:
    """Neutering the alerts (never fire / always fire) must fail each firing / quiet case."""
    _, _, d = shipped
    original = yaml.safe_load((d / "rules.yml").read_text())
    tests = yaml.safe_load((d / "rules_test.yml").read_text())["tests"]
    firing = {t["name"] for t in tests if t["alert_rule_test"][0]["exp_alerts"]}
    quiet = {t["name"] for t in tests} - firing
    for replacement, must_fail in (("vector(0) > 1", firing), ("vector(1)", quiet)):
        doc = copy.deepcopy(original)
        for g in doc["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    r["expr"] = replacement
                    r.pop("for", None)  # so the "too short" cases must notice too
        (d / "rules.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        res = promtool("test", "rules", "rules_test.yml", cwd=d)
        assert res.returncode != 0
        failed = set(re.findall(r"name: ([^,\n]+),", res.stdout + res.stderr))
        assert must_fail <= failed, (
            f"with every alert expr = {replacement!r} these cases still pass: "
            f"{sorted(must_fail - failed)}\n{ok(res)}")
    (d / "rules.yml").write_text(yaml.safe_dump(original, sort_keys=False))
    assert promtool("test", "rules", "rules_test.yml", cwd=d).returncode == 0


def _dashboard_rules(doc: dict[str, Any]) -> dict[str, Any]:
    rules = []
    for p in doc["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"]
            for var, value in dashboard.GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"panel {p['id']}: unknown Grafana variable in {expr}"
            rules.append({"record": f"panel_{p['id']}_{t['refId']}", "expr": expr})
    return {"groups": [{"name": "dashboard", "rules": rules}]}


def test_dashboard_promql_parses(shipped: tuple[Profile, Any, Path], promtool: Promtool) -> None:
    _, _, d = shipped
    doc = json.loads((d / "grafana-dashboard.json").read_text())
    rules = _dashboard_rules(doc)
    assert len(rules["groups"][0]["rules"]) >= 20
    (d / "dash_rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    res = promtool("check", "rules", "dash_rules.yml", cwd=d)
    assert res.returncode == 0, ok(res)


def test_promql_check_can_fail(tmp_path: Path, promtool: Promtool) -> None:
    """Control: the check above is not vacuous (promtool rejects a broken expression)."""
    bad = {"groups": [{"name": "g", "rules": [{"record": "x", "expr": 'sum(rate(a{b=}[5m]))'}]}]}
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(bad))
    assert promtool("check", "rules", "bad.yml", cwd=tmp_path).returncode != 0


SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


def test_only_real_metric_names(shipped: tuple[Profile, Any, Path]) -> None:
    _, _, d = shipped
    rules = yaml.safe_load((d / "rules.yml").read_text())["groups"][0]["rules"]
    recorded = {r["record"] for r in rules if "record" in r}
    exprs = [r["expr"] for r in rules]
    exprs += [e for _, _, e in dashboard.expressions(
        json.loads((d / "grafana-dashboard.json").read_text()))]
    used = {m for e in exprs for m in SELECTOR.findall(e)}
    recorded.add(PLANNED_FB)  # recorded by plan.rules.yml, which apply writes from the plan
    unknown = used - KNOWN_SERIES - recorded
    assert not unknown, f"metric names not exported by sglang 0.5.23 / router 0.3.2: {unknown}"


# --- hand-written rule tests against a profile with custom thresholds -------------------------

def qa_profile() -> tuple[Profile, Any]:
    base = data_dir("profiles") / "default.yaml"
    data = yaml.safe_load(base.read_text())
    data["name"] = "qa"
    data["speculative"] = {"algorithm": "eagle", "num_steps": 3, "num_draft_tokens": 4}
    data["monitoring"] = {"alerts": {"kv_usage_high": 0.8, "swa_usage_high": 0.9,
                                     "queue_high": 10, "ttft_p95_s": 2.0, "itl_p95_s": 0.1,
                                     "spec_accept_length_min": 2.0, "for_minutes": 2,
                                     "gpu_memory_over_plan": 0.2}}
    profile = load_text(Profile, yaml.safe_dump(data), "qa.yaml")
    return profile, resolve_inline(profile)


def _expand(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)


def test_handwritten_rule_tests_on_custom_thresholds(tmp_path: Path, promtool: Promtool) -> None:
    profile, dep = qa_profile()
    write_release(profile, dep, tmp_path)
    annotations = {a["alert"]: a["annotations"] for a in _alerts(tmp_path / "rules.yml")}
    doc = yaml.safe_load((HERE / "data" / "qa_rules_test.yml").read_text())
    covered = set()
    for t in doc["tests"]:
        for case in t["alert_rule_test"]:
            covered.add(case["alertname"])
            for exp in case["exp_alerts"]:
                tmpl = annotations[case["alertname"]]
                exp["exp_annotations"] = {k: _expand(v, exp["exp_labels"]) for k, v in tmpl.items()}
    missing = set(annotations) - covered
    assert covered == set(annotations), f"alerts without hand-written tests: {missing}"
    (tmp_path / "qa_test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = promtool("test", "rules", "qa_test.yml", cwd=tmp_path)
    assert res.returncode == 0, ok(res)
    # The same hand-written cases fail against the default thresholds (0.9, 0.95, 32, 10 s, ...).
    default_profile, default_dep = resolved(data_dir("profiles") / "default.yaml")
    other = tmp_path / "default"
    other.mkdir()
    write_release(default_profile, default_dep.model_copy(update={"name": "qa"}), other)
    (other / "qa_test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert promtool("test", "rules", "qa_test.yml", cwd=other).returncode != 0


# --- dsv4ctl's own metrics --------------------------------------------------------------------

def test_selfmetrics_pass_promtool_check_metrics(promtool: Promtool) -> None:
    recs = [
        ReleaseMetrics("default", "20261129-101500", "profiles/default.yaml", 1.8e9, 612.5,
                       "success", {"prefill": 301.0, "decode": 288.5}, active=True,
                       qualify_passed=True, qualify_figures={"load_output_tok_s": 512.3}),
        ReleaseMetrics("default", "20261129-120000", "profiles/default.yaml", 1.8e9 + 900, 95.0,
                       "rolled_back", {"prefill": 30.0}, rollbacks=1),
    ]
    for text in (textfile_for(recs), status_text(recs, {"default": {"router": True}})):
        res = promtool("check", "metrics", stdin=text)
        assert res.returncode == 0, ok(res)
