"""Canary analysis on the harness fleet: three engine hosts and the router's own (real sshd,
`systemd --user`, the engine simulator, the real sglang-router 0.3.2), scraped by the real
Prometheus 2.42 with the router host's rendered config, named in the profile as
``monitoring.prometheus_url``.

- The first rollout has no router yet, so nothing to compare: the analysis says it did not run.
- A canary whose time to first token is 3x the baseline's passes its health check and smoke
  prompt, then fails the analysis: it is rolled back, the other hosts never move, the exit code
  is 3, and the fleet's journal and `history` say why with both numbers.
- A release within the threshold goes through every wave, each wave's verdict recorded.
- Under a load loop through the router neither rollout drops a request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import ExitCode
from tests.harness import HostCluster
from tests.integration.test_fleet_rollout import ENGINES, Fleet, Load, engine_hosts, profile
from tests.promtool.live import Prometheus, rewrite_targets
from tests.promtool.support import free_port

pytestmark = pytest.mark.integration
WINDOW_S = 12


def analysed(prom_url: str, **serving: Any) -> dict[str, Any]:
    p = profile(**serving)
    p["topology"]["router"]["policy"] = "round_robin"  # every host gets its share of the load
    p["monitoring"] = {"scrape_interval_s": 1, "gpu_exporter": "none", "prometheus_url": prom_url}
    p["rollout"]["analysis"] = {
        "checks": [{"metric": "ttft_p95", "max_increase": 0.5, "window_s": WINDOW_S},
                   {"metric": "abort_ratio", "max": 0.05, "window_s": WINDOW_S}],
        "wait_s": WINDOW_S, "min_requests": 3}
    return p


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, str]]:
    tmp = tmp_path_factory.mktemp("analysis")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with HostCluster(n=4, workdir=tmp / "hosts") as hosts:
        engine_hosts(hosts)  # every engine: 0.3 s to its first token
        f = Fleet(hosts, tmp)
        # the router host's own prometheus.yml, from `dsv4ctl render`; only the router's own
        # listener (127.0.0.1 there) is reached here at the router host's address
        (tmp / "p.yaml").write_text(yaml.safe_dump(analysed(url)))
        assert main(["render", str(tmp / "p.yaml"), "-i", str(f.inventory), "-o",
                     str(tmp / "tree")]) == 0
        mon = tmp / "tree" / "router-1" / "monitoring"
        cfg = yaml.safe_load((mon / "prometheus.yml").read_text())
        where = {t: t for j in cfg["scrape_configs"] for c in j["static_configs"]
                 for t in c["targets"]}
        where["127.0.0.1:29000"] = f"{f.fakes['router-1'].address}:29000"
        live = tmp / "prom"
        live.mkdir()
        for rel in ("rules.yml",):
            (live / rel).write_text((mon / rel).read_text())
        (live / "prometheus.yml").write_text(yaml.safe_dump(rewrite_targets(cfg, where)))
        prom = Prometheus(live, tmp, port=port)
        try:
            yield f, url
        finally:
            prom.stop()


def _last(f: Fleet) -> dict[str, Any]:
    return f.journals()[-1]


def test_first_rollout_has_nothing_to_compare(fleet: tuple[Fleet, str]) -> None:
    f, url = fleet
    assert f.apply(analysed(url)) == 0
    j = _last(f)
    assert j["exit_code"] == 0
    assert all("not run" in a["reason"] for a in j.get("analysis", [])), j.get("analysis")


def test_a_slow_canary_is_rolled_back_by_the_analysis(fleet: tuple[Fleet, str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    f, url = fleet
    before = {h: f.current(h) for h in (*ENGINES, "router-1")}
    canary = f.fakes["gpu-a"]
    canary.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}, "rules": [
        {"match": {"argv_contains": ["--cuda-graph-max-bs-decode 40"]},
         "set": {"ttft_s": 0.9}}]})  # 3x the baseline's simulated time to first token
    try:
        with Load(f) as load:
            rc = f.apply(analysed(url, cuda_graph_max_bs=40), "slow.yaml")
    finally:
        canary.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}})
    assert rc == ExitCode.ROLLED_BACK
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert {h: f.current(h) for h in (*ENGINES, "router-1")} == before
    j = _last(f)
    assert j["stopped_after_wave"] == 0 and j["exit_code"] == int(ExitCode.ROLLED_BACK)
    states = {o["host"]: o["state"] for o in j["outcomes"]}
    assert states == {"gpu-a": "rolled_back", "gpu-b": "not_reached", "gpu-c": "not_reached",
                      "router-1": "not_reached"}
    [verdict] = j["analysis"]
    assert verdict["hosts"] == ["gpu-a"] and not verdict["passed"]
    ttft = verdict["comparisons"][0]
    assert ttft["metric"] == "ttft_p95" and not ttft["passed"]
    assert ttft["wave"] > 2 * ttft["baseline"]  # ~0.99 s against ~0.39 s (SGLang's buckets)
    both = (f"{ttft['wave']:.3g} s", f"{ttft['baseline']:.3g} s")
    assert all(n in verdict["reason"] for n in both)
    message = next(o["message"] for o in j["outcomes"] if o["host"] == "gpu-a")
    assert "canary analysis failed" in message and all(n in message for n in both)
    capsys.readouterr()
    assert main(["history", "--profile", str(f.tmp / "slow.yaml"), "-i", str(f.inventory)]) == 0
    text = capsys.readouterr().out
    assert "canary analysis of gpu-a: FAILED" in text and all(n in text for n in both)
    assert all(w["is_healthy"] for w in f.workers()) and len(f.workers()) == 3


def test_a_canary_within_the_threshold_goes_on(fleet: tuple[Fleet, str]) -> None:
    f, url = fleet
    before = {h: f.current(h) for h in ENGINES}
    with Load(f) as load:
        rc = f.apply(analysed(url, cuda_graph_max_bs=56), "ok.yaml")
    assert rc == 0
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert all(f.current(h) != before[h] for h in ENGINES)
    j = _last(f)
    assert j["exit_code"] == 0 and j["stopped_after_wave"] is None
    assert [a["hosts"] for a in j["analysis"]] == [["gpu-a"], ["gpu-b"], ["gpu-c"]]
    assert all(a["passed"] for a in j["analysis"]), json.dumps(j["analysis"], indent=1)
    assert "no host left unmoved" in j["analysis"][-1]["reason"]
    assert all(c["baseline"] is not None for c in j["analysis"][0]["comparisons"]
               if c["metric"] == "ttft_p95")


