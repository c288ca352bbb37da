"""Unit tests of the monitoring files a release ships (orchestrator.monitoring).

Shape and determinism of prometheus.yml / rules.yml / the dashboard, thresholds taken from the
profile, the dashboard's layout invariants, and the metric-name table checked against the real
SGLang 0.5.23 source and the sglang-router 0.3.2 binary installed by scripts/setup.sh (read as
files, not imported).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import RenderError
from orchestrator.monitoring import dashboard, release_files
from orchestrator.monitoring.metrics import METRICS
from orchestrator.paths import data_dir
from orchestrator.profile.loader import load_text
from orchestrator.profile.schema import Profile
from tests.promtool.support import resolve_inline, resolved

PD = data_dir("profiles") / "default.yaml"
COLO = data_dir("profiles") / "mxfp4-tp8.yaml"


def variant(base: Path, **changes: Any) -> tuple[Profile, Any]:
    data = yaml.safe_load(base.read_text())
    for dotted, value in changes.items():
        node = data
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    profile = load_text(Profile, yaml.safe_dump(data), "variant.yaml")
    return profile, resolve_inline(profile)


def test_release_files_are_deterministic_and_complete() -> None:
    profile, dep = resolved(PD)
    a = release_files(profile, dep)
    b = release_files(*resolved(PD))
    assert a == b
    assert list(a) == ["grafana-dashboard.json", "prometheus.yml", "rules.yml", "rules_test.yml"]
    for text in a.values():
        assert text.endswith("\n")


def test_scrape_config_pd() -> None:
    profile, dep = resolved(PD)
    cfg = yaml.safe_load(release_files(profile, dep)["prometheus.yml"])
    assert cfg["rule_files"] == ["rules.yml", "plan*.rules.yml"]
    assert cfg["global"]["scrape_interval"] == "15s"
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"dsv4-default-engine", "dsv4-default-router", "dsv4-default-gpu"}
    # dcgm-exporter's default listener on the engines' host
    assert jobs["dsv4-default-gpu"]["static_configs"] == [
        {"targets": ["127.0.0.1:9400"], "labels": {"deployment": "default", "role": "gpu"}}]
    targets = {sc["labels"]["role"]: sc["targets"] for sc in jobs["dsv4-default-engine"]
               ["static_configs"]}
    assert targets == {"prefill": [f"127.0.0.1:{dep.role('prefill').port}"],
                       "decode": [f"127.0.0.1:{dep.role('decode').port}"]}
    router = jobs["dsv4-default-router"]["static_configs"][0]
    assert router["targets"] == [f"127.0.0.1:{dep.router.prometheus_port}"]
    assert router["labels"] == {"deployment": "default", "role": "router"}
    assert all(j["metrics_path"] == "/metrics" for j in jobs.values())


def test_colocated_has_no_router_or_pd_parts() -> None:
    profile, dep = resolved(COLO)
    files = release_files(profile, dep)
    cfg = yaml.safe_load(files["prometheus.yml"])
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["dsv4-mxfp4-tp8-engine",
                                                             "dsv4-mxfp4-tp8-gpu"]
    assert cfg["scrape_configs"][0]["static_configs"][0]["labels"]["role"] == "engine"
    assert "Router" not in files["rules.yml"] and "PDBootstrap" not in files["rules.yml"]
    titles = [p["title"] for p in json.loads(files["grafana-dashboard.json"])["panels"]]
    assert not any("Router" in t or "PD" in t for t in titles)
    assert not any("Speculative" in t for t in titles)


def test_thresholds_come_from_the_profile() -> None:
    profile, dep = variant(PD, monitoring__alerts={
        "kv_usage_high": 0.7, "swa_usage_high": 0.85, "queue_high": 7, "ttft_p95_s": 3.5,
        "itl_p95_s": 0.05, "spec_accept_length_min": 1.25, "for_minutes": 9},
        speculative={"algorithm": "eagle"}, monitoring__scrape_interval_s=30)
    files = release_files(profile, dep)
    alerts = {r["alert"]: r for g in yaml.safe_load(files["rules.yml"])["groups"]
              for r in g["rules"] if "alert" in r}
    assert alerts["DSV4KVCacheFullPoolHigh"]["expr"].endswith("> 0.7")
    assert alerts["DSV4KVCacheSWAPoolHigh"]["expr"].endswith("> 0.85")
    assert "> 7 and" in alerts["DSV4QueueGrowing"]["expr"]
    assert alerts["DSV4TTFTHigh"]["expr"].endswith("> 3.5")
    assert alerts["DSV4ITLHigh"]["expr"].endswith("> 0.05")
    assert "< 1.25" in alerts["DSV4SpecAcceptanceCollapsed"]["expr"]
    assert alerts["DSV4KVCacheFullPoolHigh"]["for"] == "9m"
    assert alerts["DSV4EngineDown"]["for"] == "1m"
    assert yaml.safe_load(files["prometheus.yml"])["global"]["evaluation_interval"] == "30s"
    panels = json.loads(files["grafana-dashboard.json"])["panels"]
    ttft = next(p for p in panels if p["title"] == "Time to first token")
    assert {"color": "red", "value": 3.5} in ttft["fieldConfig"]["defaults"]["thresholds"]["steps"]


def test_every_selector_is_scoped_to_the_deployment() -> None:
    profile, dep = resolved(PD)
    files = release_files(profile, dep)
    exprs = [r["expr"] for g in yaml.safe_load(files["rules.yml"])["groups"] for r in g["rules"]]
    exprs += [e for _, _, e in dashboard.expressions(json.loads(files["grafana-dashboard.json"]))]
    for e in exprs:
        for sel in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*\{([^}]*)\}", e):
            assert 'deployment="default"' in sel, e


def test_threshold_that_cannot_fire_is_refused() -> None:
    profile, dep = variant(PD, monitoring__alerts={"ttft_p95_s": 400.0})
    with pytest.raises(RenderError) as exc:
        release_files(profile, dep)
    assert "cannot fire" in exc.value.message and exc.value.fix


def test_monitoring_disabled_renders_nothing() -> None:
    profile, dep = variant(PD, monitoring__enabled=False)
    assert release_files(profile, dep) == {}


def _boxes(panels: list[dict[str, Any]]) -> list[tuple[int, int, int, int, int]]:
    return [(p["id"], p["gridPos"]["x"], p["gridPos"]["y"], p["gridPos"]["w"], p["gridPos"]["h"])
            for p in panels]


def overlapping(boxes: list[tuple[int, int, int, int, int]]) -> list[tuple[int, int]]:
    out = []
    for i, (a, ax, ay, aw, ah) in enumerate(boxes):
        for b, bx, by, bw, bh in boxes[i + 1:]:
            if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                out.append((a, b))
    return out


@pytest.mark.parametrize("path", [PD, COLO], ids=["pd", "colocated"])
def test_dashboard_layout_and_import_shape(path: Path) -> None:
    profile, dep = resolved(path)
    doc = json.loads(release_files(profile, dep)["grafana-dashboard.json"])
    panels = doc["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    boxes = _boxes(panels)
    for pid, x, _y, w, h in boxes:
        assert x >= 0 and x + w <= 24 and w > 0 and h > 0, pid
    assert overlapping(boxes) == []
    assert doc["__inputs"][0]["name"] == "DS_PROMETHEUS"
    assert doc["__inputs"][0]["pluginId"] == "prometheus"
    var = doc["templating"]["list"][0]
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
    assert doc["uid"] == f"dsv4-{dep.name}" and doc["id"] is None
    titles = {p["title"] for p in panels}
    for needed in ("KV token usage per pool", "KV tokens used / capacity", "Running requests",
                   "Queued requests", "Generation throughput", "Time to first token",
                   "Inter-token latency", "End-to-end latency", "Prefix cache hit rate"):
        assert needed in titles
    if dep.router is not None:
        assert {"PD queues", "KV transfer latency", "KV transfer speed", "Router requests",
                "Worker health"} <= titles


def test_dashboard_overlap_check_can_fail() -> None:
    """Control for the overlap check: a panel placed on another one is reported."""
    profile, dep = resolved(PD)
    panels = dashboard.layout(dashboard.rows(profile, dep))
    clash = {**panels[3], "id": 999, "gridPos": {**panels[3]["gridPos"], "x": 2}}  # over 2 and 3
    assert overlapping(_boxes([*panels, clash])) == [(panels[1]["id"], 999),
                                                     (panels[2]["id"], 999)]


def test_speculative_row_only_when_enabled() -> None:
    profile, dep = variant(PD, speculative={"algorithm": "eagle"})
    doc = json.loads(release_files(profile, dep)["grafana-dashboard.json"])
    assert any(p["title"] == "Acceptance length" for p in doc["panels"])


def _package_file(pkg: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(pkg)
    assert spec is not None and spec.submodule_search_locations, (
        f"{pkg} is not installed; scripts/setup.sh full installs it (requirements/parsers.txt)")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def test_sglang_metric_names_exist_in_sglang_0_5_23() -> None:
    src = _package_file("sglang", "srt", "observability", "metrics_collector.py").read_text()
    kinds = {"gauge": "Gauge", "counter": "Counter", "histogram": "Histogram"}
    for m in METRICS.values():
        if not m.name.startswith("sglang:"):
            continue
        at = src.find(f'name="{m.name}"')
        assert at >= 0, f"{m.name} is not declared in sglang 0.5.23 metrics_collector.py"
        decl = src[max(0, src.rfind("=", 0, at) - 80):at]
        assert kinds[m.type] + "(" in decl, f"{m.name}: declared type differs from {m.type}"


def test_router_metric_names_exist_in_router_0_3_2() -> None:
    pkg = _package_file("sglang_router")
    binaries = list(pkg.glob("sglang_router_rs*.so"))
    assert binaries, f"no sglang_router_rs extension in {pkg}"
    blob = binaries[0].read_bytes()
    for m in METRICS.values():
        if m.name.startswith("smg_"):
            assert m.name.encode() in blob, f"{m.name} not found in {binaries[0].name}"


def _sglang_declarations() -> dict[str, str]:
    """Every metric SGLang 0.5.23 declares under srt/observability: name -> prometheus_client
    class (Counter names without the _total prometheus_client adds on exposition)."""
    out: dict[str, str] = {}
    for path in _package_file("sglang", "srt", "observability").glob("*.py"):
        src = path.read_text()
        for m in re.finditer(r'(Counter|Gauge|Histogram|Summary)\(\s*name="(sglang:[a-z_0-9]+)"',
                             src):
            out[m.group(2)] = m.group(1)
    assert len(out) > 100, "sglang's metric declarations were not found"
    return out


def _sim_families(engine_type: str, speculative: bool) -> dict[str, str]:
    from tests.sim.metrics import EngineMetrics

    m = EngineMetrics(model_name="m", engine_type=engine_type, attn_dp_size=2,
                      max_total_tokens=1000, speculative=speculative, start_time=0.0)
    with m.lock:
        m.note_kv_transfer()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", m.render(), re.M))


@pytest.mark.parametrize("engine_type", ["unified", "prefill", "decode"])
def test_simulator_exports_only_sglang_0_5_23_names(engine_type: str) -> None:
    """The simulator's /metrics families are metrics SGLang 0.5.23 declares, with its types: a
    name SGLang does not export (or a histogram shown as a gauge) would let a rule pass here and
    never fire on a real engine."""
    declared = _sglang_declarations()
    for name, typ in _sim_families(engine_type, speculative=True).items():
        base = name.removesuffix("_total") if typ == "counter" else name
        assert base in declared or name in declared, f"simulator exports {name}: not in sglang"
        want = declared.get(base) or declared[name]
        assert want.lower() == typ, f"simulator exports {name} as {typ}, sglang as {want}"


def test_simulator_name_check_can_fail() -> None:
    declared = _sglang_declarations()
    assert "sglang:kv_transfer_latency_ms" in declared and declared[
        "sglang:kv_transfer_latency_ms"] == "Histogram"  # the simulator once showed it as a gauge
    assert "sglang:num_queue_requests" not in declared


def test_gpu_exporter_none_drops_the_gpu_parts() -> None:
    profile, dep = variant(PD, monitoring__gpu_exporter="none")
    files = release_files(profile, dep)
    cfg = yaml.safe_load(files["prometheus.yml"])
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["dsv4-default-engine",
                                                             "dsv4-default-router"]
    assert cfg["rule_files"] == ["rules.yml"]
    assert "DCGM" not in files["rules.yml"] and "DCGM" not in files["grafana-dashboard.json"]
    on = release_files(*resolved(PD))
    titles = [p["title"] for p in json.loads(on["grafana-dashboard.json"])["panels"]]
    assert titles[0] == "GPUs (dcgm-exporter)"  # the board opens with the GPUs
    assert {"GPU utilization", "Framebuffer used vs plan", "Framebuffer drift from plan",
            "Power draw", "GPU temperature"} <= set(titles)


def test_gpu_exporter_port_and_bad_value() -> None:
    profile, dep = variant(COLO, monitoring__gpu_exporter_port=9500)
    cfg = yaml.safe_load(release_files(profile, dep)["prometheus.yml"])
    assert cfg["scrape_configs"][-1]["static_configs"][0]["targets"] == ["127.0.0.1:9500"]
    with pytest.raises(Exception) as exc:
        variant(COLO, monitoring__gpu_exporter="nvml")
    assert "monitoring.gpu_exporter" in repr(exc.value) and "dcgm, none" in repr(exc.value)


def test_fleet_router_host_scrapes_the_whole_fleet() -> None:
    from tests.validate.helpers import render_fleet

    trees = render_fleet(data_dir("profiles") / "fleet-3x.yaml")
    cfg = yaml.safe_load(trees["router-1"].all_files()["monitoring/prometheus.yml"].content)
    jobs = {j["job_name"]: [t for c in j["static_configs"] for t in c["targets"]]
            for j in cfg["scrape_configs"]}
    assert jobs == {"dsv4-fleet-3x-engine": ["10.0.1.11:30000", "10.0.1.12:30000",
                                             "10.0.1.13:30000"],
                    # the router serves its metrics on its own listen address (not loopback)
                    "dsv4-fleet-3x-router": ["10.0.1.10:29000"],
                    "dsv4-fleet-3x-gpu": ["10.0.1.11:9400", "10.0.1.12:9400", "10.0.1.13:9400"]}
    own = yaml.safe_load(trees["gpu-b"].all_files()["monitoring/prometheus.yml"].content)
    assert [t for j in own["scrape_configs"] for c in j["static_configs"]
            for t in c["targets"]] == ["10.0.1.12:30000", "10.0.1.12:9400"]


def test_plan_rules_carry_the_plans_per_gpu_prediction() -> None:
    from orchestrator.monitoring import plan_rules_file
    from orchestrator.planner.build import build_plan, load_context

    plan = build_plan(load_context(PD, None))
    path, text = plan_rules_file(plan) or ("", "")
    assert path == "monitoring/plan.rules.yml"
    rules = yaml.safe_load(text)["groups"][0]["rules"]
    need = {c.role: c.headroom_need_bytes for c in plan.capacity}
    want = {str(g.index): g.preload_bytes + g.weights_bytes + g.kv_bytes + g.req_to_token_bytes
            + need[g.role] for g in plan.gpus if g.role}
    assert {r["labels"]["gpu"]: int(r["expr"][7:-1]) for r in rules} == want
    assert all(0 < n < plan.gpus[0].total_bytes for n in want.values())
    assert {r["labels"]["instance"] for r in rules} == {"127.0.0.1:9400"}


def _rules(text: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load(text)["groups"][0]["rules"])


def test_fleet_router_host_gets_every_engine_hosts_plan_rules() -> None:
    """The router host's Prometheus scrapes every engine host's GPU exporter: its plan rules are
    each engine host's own (the numbers of that host's plan, its exporter as ``instance``), one
    rule per GPU of the fleet; the same plans in any order give the same bytes."""
    from orchestrator.monitoring import plan_rules_file
    from orchestrator.planner.fleet import load_fleet, plan_fleet

    fp = plan_fleet(load_fleet(data_dir("profiles") / "fleet-3x.yaml",
                               data_dir("profiles") / "inventory.yaml"))
    router = fp.plan("router-1")
    assert not router.gpus  # a host of its own: sizes no GPU
    assert plan_rules_file(router) is None  # no fleet given: none, never a part of them
    path, text = plan_rules_file(router, fp.plans) or ("", "")
    assert path == "monitoring/plan.rules.yml"
    own = {h: plan_rules_file(fp.plan(h)) for h in fp.hosts}
    want = sorted((r["labels"]["instance"], int(r["labels"]["gpu"]), r["expr"])
                  for h in fp.hosts for r in _rules((own[h] or ("", ""))[1]))
    got = sorted((r["labels"]["instance"], int(r["labels"]["gpu"]), r["expr"])
                 for r in _rules(text))
    assert got == want and len(got) == 3 * 8
    cfg = yaml.safe_load(next(f.content for f in router.files
                              if f.path == "monitoring/prometheus.yml"))
    scraped = [t for j in cfg["scrape_configs"] if j["job_name"].endswith("-gpu")
               for c in j["static_configs"] for t in c["targets"]]
    assert {i for i, _, _ in got} == set(scraped) == {"10.0.1.11:9400", "10.0.1.12:9400",
                                                       "10.0.1.13:9400"}
    assert {r["labels"]["deployment"] for r in _rules(text)} == {router.deployment.name}
    assert plan_rules_file(router, list(reversed(fp.plans))) == (path, text)
    # an engine host scrapes its own exporter only: the fleet's plans change nothing there
    assert plan_rules_file(fp.plan("gpu-b"), fp.plans) == own["gpu-b"]


def test_fleet_plan_rules_refuse_a_host_the_router_does_not_scrape() -> None:
    from orchestrator.monitoring import plan_rules_file
    from orchestrator.planner.fleet import load_fleet, plan_fleet

    fp = plan_fleet(load_fleet(data_dir("profiles") / "fleet-3x.yaml",
                               data_dir("profiles") / "inventory.yaml"))
    b = fp.plan("gpu-b")
    moved = b.model_copy(update={"deployment": b.deployment.model_copy(update={"roles": tuple(
        r.model_copy(update={"listen": "10.9.9.9"}) for r in b.deployment.roles)})})
    with pytest.raises(RenderError, match=r"host 'gpu-b': its engine listens on 10\.9\.9\.9"):
        plan_rules_file(fp.plan("router-1"), [p if p.host != "gpu-b" else moved
                                              for p in fp.plans])


def _subset_missing(ours: Any, theirs: Any, where: str = "") -> list[str]:
    """Paths of values in ``ours`` that ``theirs`` lacks or holds differently."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [where or "/"]
        return [p for k, v in ours.items() for p in (
            [f"{where}/{k}"] if k not in theirs else _subset_missing(v, theirs[k], f"{where}/{k}"))]
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return [where]
        return [p for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
                for p in _subset_missing(a, b, f"{where}[{i}]")]
    return [] if ours == theirs else [where]


def _sdk_roundtrip(doc: dict[str, Any]) -> dict[str, Any]:
    """The board decoded by grafana-foundation-sdk's Dashboard model and encoded again: what
    Grafana's own schema (the SDK is generated from it) knows of it."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    return json.loads(JSONEncoder().encode(Dashboard.from_json(doc)))


@pytest.mark.parametrize("path", [PD, COLO, data_dir("profiles") / "fleet-3x.yaml"],
                         ids=lambda p: p.stem)
def test_dashboard_parses_with_grafana_foundation_sdk(path: Path) -> None:
    """Every field the board sets survives Grafana's dashboard model unchanged (a misspelt or
    misplaced key would be dropped by the decoder); the import-time ``__inputs``/``__requires``
    and the null ``id`` are outside the model."""
    from tests.validate.helpers import render_fleet

    if path.stem == "fleet-3x":
        text = render_fleet(path)["router-1"].all_files()["monitoring/grafana-dashboard.json"].content
    else:
        text = release_files(*resolved(path))["grafana-dashboard.json"]
    doc = json.loads(text)
    ours = {k: v for k, v in doc.items() if k not in ("__inputs", "__requires", "id")}
    assert doc["id"] is None
    assert _subset_missing(ours, _sdk_roundtrip(doc)) == []


def test_sdk_parse_check_can_fail() -> None:
    doc = json.loads(release_files(*resolved(COLO))["grafana-dashboard.json"])
    doc["panels"][1]["gridpos"] = doc["panels"][1].pop("gridPos")
    doc["panels"][2]["fieldconfig"] = doc["panels"][2].pop("fieldConfig")
    missing = _subset_missing({k: v for k, v in doc.items() if k != "__inputs"},
                              _sdk_roundtrip(doc))
    assert "/panels[1]/gridpos" in missing and "/panels[2]/fieldconfig" in missing
