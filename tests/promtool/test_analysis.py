"""Canary analysis (orchestrator.monitoring.analysis) against a real Prometheus, and in the plan.

A fleet of three simulated engines behind the real sglang-router 0.3.2, scraped by the real
Prometheus with the router host's rendered config: an engine whose time to first token is 3x the
others' fails the comparison, and the verdict names both numbers; two engines alike pass; a wave
with too few requests and a Prometheus that does not answer fail (no evidence is not a pass).
What the plan will say: what the analysis does, or that it is off and why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator.monitoring import analysis, release_files
from orchestrator.monitoring.prometheus import router_target
from orchestrator.paths import data_dir
from orchestrator.planner.build import resolve_deployment
from orchestrator.planner.fleet import fleet_context, plan_fleet
from orchestrator.profile.loader import load_text
from orchestrator.profile.schema import Analysis, Profile
from tests.promtool.live import Prometheus
from tests.promtool.support import Load, Sims, free_port
from tests.promtool.test_prometheus_surface import write_monitoring

INVENTORY = data_dir("profiles") / "inventory.yaml"
BASE_TTFT_S = 0.3
CHECKS = [{"metric": "ttft_p95", "max_increase": 0.5, "window_s": 20},
          {"metric": "abort_ratio", "max": 0.05, "window_s": 20}]


def fleet_profile() -> tuple[Profile, str]:
    data = yaml.safe_load((data_dir("profiles") / "fleet-3x.yaml").read_text())
    data["name"] = "canary"
    data["monitoring"] = {"scrape_interval_s": 1}
    text = yaml.safe_dump(data)
    return load_text(Profile, text, "canary.yaml"), text


def settings(**kw: Any) -> Analysis:
    return Analysis.model_validate({"checks": CHECKS, **kw})


def test_analysis_against_a_real_prometheus(tmp_path: Path) -> None:
    profile, text = fleet_profile()
    a = settings(min_requests=5)
    fctx = fleet_context(profile, text, None, INVENTORY)
    deps = {n: resolve_deployment(fctx.context(n, h)) for n, h in fctx.all_hosts}
    rhost = next(d for d in deps.values() if d.router is not None)
    hosts = [n for n, _ in fctx.hosts]
    instances = {h: analysis.engine_instances(deps[h]) for h in hosts}
    files = release_files(profile, rhost)
    cfg = yaml.safe_load(files["prometheus.yml"])
    engines = [t for j in cfg["scrape_configs"] if j["job_name"].endswith("-engine")
               for c in j["static_configs"] for t in c["targets"]]
    # the analysis names engines as the fleet's scrape config does
    assert engines == [i for h in hosts for i in instances[h]]

    (tmp_path / "sim").mkdir()
    sims = Sims(tmp_path / "sim")
    prom = load = None
    try:
        # the canary (first host) is 3x slower to its first token than the two others
        urls = [sims.engine(ttft_s=3 * BASE_TTFT_S), sims.engine(ttft_s=BASE_TTFT_S),
                sims.engine(ttft_s=BASE_TTFT_S)]
        # round robin: every host gets its share of the load loop in the window (cache-aware
        # routing may leave one host idle for a while, and an idle wave fails min_requests)
        router = sims.router(workers=tuple(urls), extra=("--policy", "round_robin"))
        where = {t: u[7:] for t, u in zip(engines, urls, strict=True)}
        where[router_target(rhost)] = f"127.0.0.1:{sims.router_metrics[router]}"
        for t in (t for j in cfg["scrape_configs"] if j["job_name"].endswith("-gpu")
                  for c in j["static_configs"] for t in c["targets"]):
            where[t] = "127.0.0.1:9"  # no GPU exporter here: not what this test looks at
        mon = tmp_path / "monitoring"
        write_monitoring(mon, files, where)
        load = Load(router)
        prom = Prometheus(mon, tmp_path)
        query = analysis.prometheus_query(prom.base)
        canary, rest = instances[hosts[0]], [i for h in hosts[1:] for i in instances[h]]

        def too_few() -> list[str]:
            try:
                served = {h: query(analysis.requests_expression(
                    analysis.selector(profile.name, instances[h]), 20)) for h in hosts}
            except analysis.PrometheusUnavailable as exc:  # still starting
                return [str(exc)]
            return [f"{h}: {n} requests" for h, n in served.items()
                    if n is None or n < a.min_requests]

        prom.settle("every engine served requests in the window", too_few, 90)
        time.sleep(3)
        bad = analysis.evaluate(a, profile.name, canary, rest, query)
        assert not bad.passed, bad
        ttft = bad.comparisons[0]
        assert ttft.metric == "ttft_p95" and not ttft.passed
        assert ttft.wave is not None and ttft.baseline is not None
        assert ttft.wave > 2 * ttft.baseline  # histogram_quantile: ~0.99 s against ~0.39 s
        assert f"{ttft.wave:.3g} s" in bad.reason and f"{ttft.baseline:.3g} s" in bad.reason
        assert "the baseline's" in bad.reason and "+50%" in bad.reason
        assert bad.comparisons[1].passed  # nothing aborted
        json.dumps(bad.to_dict())  # what the journal records

        # a wave alike its baseline passes (host 2 against host 3)
        good = analysis.evaluate(a, profile.name, instances[hosts[1]], instances[hosts[2]],
                                 query)
        assert good.passed, good
        assert all(c.passed for c in good.comparisons) and good.requests >= a.min_requests
        # the last wave has no baseline left: only absolute limits apply
        last = analysis.evaluate(a, profile.name, canary, [], query)
        assert last.passed and "no baseline" in last.reason

        # no evidence is not a pass
        strict = a.model_copy(update={"min_requests": 100000})
        few = analysis.evaluate(strict, profile.name, canary, rest, query)
        assert not few.passed and "min_requests=100000" in few.reason
        nobody = analysis.evaluate(a, profile.name, ["10.9.9.9:30000"], rest, query)
        assert not nobody.passed and "served no requests" in nobody.reason
    finally:
        if load is not None:
            load.stop()
        if prom is not None:
            prom.stop()
        sims.stop()
    gone = analysis.evaluate(a, profile.name, canary, rest,
                             analysis.prometheus_query(f"http://127.0.0.1:{free_port()}", 2))
    assert not gone.passed and "did not answer" in gone.reason
    assert "monitoring.prometheus_url" in gone.reason


def test_run_waits_then_compares_and_is_off_without_prometheus() -> None:
    slept: list[float] = []
    seen: list[str] = []

    def q(expr: str) -> float | None:
        seen.append(expr)
        return 50.0 if "increase" in expr else 0.02  # 20 ms p95, 2% aborted

    v = analysis.run(settings(wait_s=7), "http://p:9090", "canary", ["a:1"], ["b:1"],
                     sleep=slept.append, query=q)
    assert v is not None and v.passed and slept == [7.0]
    assert any('instance=~"a:1"' in e for e in seen) and any('instance=~"b:1"' in e for e in seen)
    assert analysis.run(settings(), None, "canary", ["a:1"], ["b:1"], sleep=slept.append,
                        query=q) is None
    assert slept == [7.0]
    assert analysis.wait_seconds(settings()) == 20  # wait_s unset: the longest window


def test_describe_says_what_runs_or_why_not() -> None:
    on = " ".join(analysis.describe(settings(), "http://127.0.0.1:9090"))
    assert "http://127.0.0.1:9090" in on and "ttft_p95" in on
    assert "at most 50% above the baseline's" in on and "at most 5%" in on
    assert "monitoring.prometheus_url is not set" in analysis.describe(settings(), None)[0]
    assert "sets no checks" in analysis.describe(Analysis(), "http://p:9090")[0]


def test_a_check_needs_a_threshold() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as exc:
        Analysis.model_validate({"checks": [{"metric": "ttft_p95", "window_s": 30}]})
    assert "max_increase" in str(exc.value)
    with pytest.raises(ValidationError):
        Analysis.model_validate({"checks": [{"metric": "tpot", "max": 1}]})


def test_the_verdict_survives_the_fleet_journal_reader() -> None:
    """`history` reads journals back through the typed host-data reader: the verdict, both
    numbers included, comes back as written; a hostile one is refused cleanly."""
    import pytest

    from orchestrator.errors import DsvError
    from orchestrator.host_data import fleet_journal

    v = analysis.evaluate(settings(), "canary", ["a:1"], ["b:1"],
                          lambda e: 40.0 if "increase" in e else
                          (0.99 if "a:1" in e and "first_token" in e else 0.01 if "abort" in e
                           else 0.39))
    assert not v.passed and "0.99 s" in v.reason and "0.39 s" in v.reason
    entry = {"hosts": ["gpu-a"], **v.to_dict()}
    journal = {"profile": "canary", "kind": "rollout", "started": "20261202T050000Z",
               "exit_code": 3, "analysis": [entry]}
    assert fleet_journal(json.dumps(journal), "j")["analysis"] == [entry]
    bad = json.loads(json.dumps(journal))
    bad["analysis"][0]["comparisons"][0]["metric"] = "$(reboot)"
    with pytest.raises(DsvError):
        fleet_journal(json.dumps(bad), "j")


def test_the_plan_shows_the_analysis_or_says_it_is_off() -> None:
    def plan_check(**kw: Any) -> Any:
        data = yaml.safe_load((data_dir("profiles") / "fleet-3x.yaml").read_text())
        url = kw.pop("prometheus_url", "http://127.0.0.1:9090")
        data["monitoring"] = {"prometheus_url": url} if url else {}
        data.setdefault("rollout", {})["analysis"] = kw
        text = yaml.safe_dump(data)
        profile = load_text(Profile, text, "canary.yaml")
        fp = plan_fleet(fleet_context(profile, text, None, INVENTORY))
        return next(c for c in fp.checks if c.id.startswith("rollout.analysis"))

    on = plan_check(checks=CHECKS)
    assert on.id == "rollout.analysis" and on.severity == "info"
    assert "http://127.0.0.1:9090" in on.message and "ttft_p95" in on.message
    assert "at most 50% above the baseline's" in on.message and "at most 5%" in on.message
    no_url = plan_check(checks=CHECKS, prometheus_url=None)
    assert no_url.id == "rollout.analysis-off" and no_url.severity == "warning"
    assert "monitoring.prometheus_url is not set" in no_url.message
    assert no_url.field == "monitoring.prometheus_url"
    nothing = plan_check()
    assert nothing.id == "rollout.analysis-off" and nothing.severity == "info"


def test_a_profile_check_needs_a_threshold_named_in_the_error() -> None:
    import pytest

    from orchestrator.errors import DsvError

    data = yaml.safe_load((data_dir("profiles") / "fleet-3x.yaml").read_text())
    data.setdefault("rollout", {})["analysis"] = {"checks": [{"metric": "tpot", "max": 1}]}
    with pytest.raises(DsvError) as exc:
        load_text(Profile, yaml.safe_dump(data), "canary.yaml")
    assert "rollout.analysis.checks.0.metric" in repr(exc.value)
