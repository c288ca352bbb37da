"""The real Prometheus 2.42 over a release's whole monitoring surface, on the wire.

Two deployments, each with the release's own rendered ``prometheus.yml`` and rules (targets
rewritten only where the harness listens elsewhere), the engine simulator (SGLang 0.5.23's metric
names), the real sglang-router 0.3.2 and the dcgm-exporter stand-in (tests/sim/dcgm.py):

- a PD deployment (prefill + decode behind the router in PD mode), from the plan as apply writes
  it (the plan's files and its per-GPU memory rules);
- a fleet of three colocated hosts behind one router: the router host's release, which scrapes
  the whole fleet.

Through the server's HTTP API: every target is up (router and GPU exporters included); every
metric name the rules and the board use has a live series; every panel's query returns a number;
killing an engine makes DSV4EngineDown fire; a slow engine makes DSV4TTFTHigh fire within the
profile's `for:`; an XID and memory above the plan fire the GPU alerts. A planted wrong metric
name in a rule or a panel fails the same checks.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator.monitoring import plan_rules_file
from orchestrator.monitoring.metrics import MIB
from orchestrator.monitoring.prometheus import PLANNED_FB, router_target
from orchestrator.paths import data_dir
from orchestrator.planner.build import PlanContext, build_plan
from orchestrator.profile.loader import load_inventory, load_text
from orchestrator.profile.schema import Profile
from tests.promtool.live import (
    Prometheus,
    dead_names,
    empty_panels,
    panel_exprs,
    rewrite_targets,
    rule_exprs,
)
from tests.promtool.support import Load, Sims

FOR_S = 60  # monitoring.alerts.for_minutes: 1 in the test profiles
SLOW_TTFT_S = 1.5  # the slow engine's extra time to first token; the budget is 1 s
SLACK_S = 20  # scrape + evaluation intervals (1 s) and this box's load


def live_profile(base: str, name: str) -> tuple[Profile, str]:
    data = yaml.safe_load((data_dir("profiles") / base).read_text())
    data["name"] = name
    data["monitoring"] = {"scrape_interval_s": 1,
                          "alerts": {"ttft_p95_s": 1.0, "for_minutes": FOR_S // 60}}
    text = yaml.safe_dump(data)
    return load_text(Profile, text, f"{name}.yaml"), text


def write_monitoring(mon: Path, files: dict[str, str], where: dict[str, str]) -> dict[str, Any]:
    mon.mkdir()
    for rel, text in files.items():
        (mon / rel).write_text(text)
    cfg = rewrite_targets(yaml.safe_load(files["prometheus.yml"]), where)
    (mon / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


def check_surface(prom: Prometheus, mon: Path, deployment: str, n_targets: int) -> None:
    """Every target up, every name live, every panel a number; then the planted mistakes."""
    def all_up() -> bool:
        active = prom.api("targets", state="active")["activeTargets"]
        return len(active) == n_targets and not prom.targets_down()

    prom.wait("every scrape target up", all_up, 60)
    rules = yaml.safe_load((mon / "rules.yml").read_text())
    board = json.loads((mon / "grafana-dashboard.json").read_text())
    exprs = rule_exprs(rules) + [e for _, e in panel_exprs(board)]
    prom.settle("every metric name of the rules and the board live",
                lambda: dead_names(prom, exprs, deployment), 60)
    prom.settle("every panel's query returns a number", lambda: empty_panels(prom, board), 60)

    # planted wrong names: a typo, and a name in our table that no live target exports
    bad_rules = copy.deepcopy(rules)
    rec = next(r for r in bad_rules["groups"][0]["rules"] if r.get("record") ==
               "dsv4:queue_reqs:sum")
    rec["expr"] = rec["expr"].replace("sglang:num_queue_reqs", "sglang:num_queue_requests")
    assert set(dead_names(prom, rule_exprs(bad_rules), deployment)) == {
        "sglang:num_queue_requests"}
    bad_board = copy.deepcopy(board)
    power = next(p for p in bad_board["panels"] if p.get("title") == "Power draw")
    power["targets"][0]["expr"] = power["targets"][0]["expr"].replace(
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_POWER_DRAW")
    running = next(p for p in bad_board["panels"] if p.get("title") == "Running requests")
    running["targets"][0]["expr"] = f'sum(smg_router_request_errors_total{{deployment="{deployment}"}})'
    empty = empty_panels(prom, bad_board)
    assert sorted(p.split(":")[0] for p in empty) == ["Power draw", "Running requests"], empty
    assert set(dead_names(prom, [e for _, e in panel_exprs(bad_board)], deployment)) == {
        "DCGM_FI_DEV_POWER_DRAW", "smg_router_request_errors_total"}


def wait_firing(prom: Prometheus, name: str, timeout: float, **labels: str) -> dict[str, Any]:
    def firing() -> list[dict[str, Any]]:
        return [a for a in prom.alert(name, "firing")
                if all(a["labels"].get(k) == v for k, v in labels.items())]

    return prom.wait(f"{name} {labels} firing", firing, timeout)[0]


def active_at(alert: dict[str, Any]) -> float:
    """The alert's activeAt (RFC 3339 with nanoseconds) as a Unix time."""
    from datetime import datetime

    stamp = alert["activeAt"]
    head, _, frac = stamp.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00").timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def test_pd_deployment_surface(tmp_path: Path) -> None:
    profile, text = live_profile("default.yaml", "livepd")
    inv_path = data_dir("profiles") / "inventory.yaml"
    host = load_inventory(inv_path).hosts[str(profile.host)]
    plan = build_plan(PlanContext(profile, None, text, str(profile.host), host, inv_path))
    dep = plan.deployment
    assert dep.pd and dep.router is not None
    files = {f.path.removeprefix("monitoring/"): f.content for f in plan.files
             if f.path.startswith("monitoring/") and f.content is not None}
    planned = plan_rules_file(plan)
    assert planned is not None
    files[planned[0].removeprefix("monitoring/")] = planned[1]
    planned_bytes = {r["labels"]["gpu"]: int(r["expr"][len("vector("):-1])
                     for r in yaml.safe_load(planned[1])["groups"][0]["rules"]}
    assert len(planned_bytes) == 8

    (tmp_path / "sim").mkdir()
    sims = Sims(tmp_path / "sim")
    prom = load = None
    state = tmp_path / "dcgm.json"
    as_planned = {g: int(n * 0.97 / MIB) for g, n in planned_bytes.items()}
    state.write_text(json.dumps({"fb_used_mib_by_gpu": as_planned}))
    try:
        spec = (("--speculative-algorithm", "EAGLE")
                if dep.speculative_algorithm != "none" else ())
        prefill = sims.engine(mode="prefill", extra=spec)
        decode = sims.engine(mode="decode", extra=spec, ttft_s=SLOW_TTFT_S)  # the slow engine
        router = sims.router(prefill, decode)
        gpus = sims.dcgm(state)
        roles = {r.name: r for r in dep.roles}
        where = {f"{roles['prefill'].listen}:{roles['prefill'].port}": prefill[7:],
                 f"{roles['decode'].listen}:{roles['decode'].port}": decode[7:],
                 f"127.0.0.1:{dep.router.prometheus_port}":
                     f"127.0.0.1:{sims.router_metrics[router]}",
                 "127.0.0.1:9400": gpus[7:]}
        mon = tmp_path / "monitoring"
        write_monitoring(mon, files, where)
        load = Load(router)
        started = time.time()
        prom = Prometheus(mon, tmp_path)
        check_surface(prom, mon, dep.name, n_targets=4)
        assert load.ok > 0

        # faults: the prefill dies, GPU 3 logs an XID, GPU 2 holds 20% more than planned
        over = dict(as_planned, **{"2": int(planned_bytes["2"] * 1.2 / MIB)})
        state.write_text(json.dumps({"fb_used_mib_by_gpu": over, "xid": {"3": 79}}))
        killed = time.time()
        sims.kill(prefill)
        xid = wait_firing(prom, "DSV4GPUXidError", 30, gpu="3")
        assert xid["labels"]["severity"] == "critical"
        ttft = wait_firing(prom, "DSV4TTFTHigh", FOR_S + SLACK_S + 40, role="decode")
        assert active_at(ttft) - started < SLACK_S + 20, "the slow engine was noticed late"
        assert time.time() - active_at(ttft) >= FOR_S  # fired only after `for:`
        assert not prom.alert("DSV4TTFTHigh", "firing") or all(
            a["labels"]["role"] == "decode" for a in prom.alert("DSV4TTFTHigh", "firing"))
        down = wait_firing(prom, "DSV4EngineDown", FOR_S + SLACK_S, role="prefill")
        assert time.time() - killed <= FOR_S + SLACK_S + 5
        assert down["labels"]["severity"] == "critical"
        mem = wait_firing(prom, "DSV4GPUMemoryAbovePlan", FOR_S + SLACK_S, gpu="2")
        assert mem["labels"]["role"] == "prefill"
        assert [a["labels"]["gpu"] for a in prom.alert("DSV4GPUMemoryAbovePlan", "firing")] \
            == ["2"]
        assert not prom.alert("DSV4EngineDown", "firing") or all(
            a["labels"]["role"] == "prefill" for a in prom.alert("DSV4EngineDown", "firing"))
    finally:
        if load is not None:
            load.stop()
        if prom is not None:
            prom.stop()
        sims.stop()


def test_fleet_surface(tmp_path: Path) -> None:
    """Three colocated hosts behind the real router; the router host's release scrapes all.

    The fleet's router host sizes no GPU of its own: its plan rules (as apply writes them there,
    from the fleet's plans) carry every engine host's, so the board's "planned" queries return
    each engine host's GPUs there too."""
    from orchestrator.planner.fleet import fleet_context, plan_fleet

    profile, text = live_profile("fleet-3x.yaml", "livefleet")
    fctx = fleet_context(profile, text, None, data_dir("profiles") / "inventory.yaml")
    fleet = plan_fleet(fctx)
    rplan = next(p for p in fleet.plans if p.deployment.router is not None)
    rhost = rplan.deployment
    assert not rhost.roles and rhost.router is not None and not rplan.gpus
    files = {f.path.removeprefix("monitoring/"): f.content for f in rplan.files
             if f.path.startswith("monitoring/") and f.content is not None}
    planned = plan_rules_file(rplan, fleet.plans)
    assert planned is not None
    files[planned[0].removeprefix("monitoring/")] = planned[1]
    rendered = yaml.safe_load(files["prometheus.yml"])
    engines = [t for j in rendered["scrape_configs"] if j["job_name"].endswith("-engine")
               for c in j["static_configs"] for t in c["targets"]]
    gpu_targets = [t for j in rendered["scrape_configs"] if j["job_name"].endswith("-gpu")
                   for c in j["static_configs"] for t in c["targets"]]
    assert len(engines) == 3 and len(gpu_targets) == 3

    (tmp_path / "sim").mkdir()
    sims = Sims(tmp_path / "sim")
    prom = load = None
    try:
        urls = [sims.engine(), sims.engine(), sims.engine(ttft_s=SLOW_TTFT_S)]
        # the release's policy (cache_aware); the load loop's prompts differ from the first
        # character on, so the router spreads them and the slow host is asked too
        router = sims.router(workers=tuple(urls), extra=("--policy", rhost.router.policy))
        states = [tmp_path / f"dcgm-{i}.json" for i in range(3)]
        for st in states:
            st.write_text("{}")
        gpus = [sims.dcgm(st) for st in states]
        where = {t: u[7:] for t, u in zip(engines, urls, strict=True)}
        where |= {t: g[7:] for t, g in zip(gpu_targets, gpus, strict=True)}
        where[router_target(rhost)] = f"127.0.0.1:{sims.router_metrics[router]}"
        mon = tmp_path / "monitoring"
        write_monitoring(mon, files, where)
        load = Load(router)
        started = time.time()
        prom = Prometheus(mon, tmp_path)
        check_surface(prom, mon, rhost.name, n_targets=7)
        # the prediction of every engine host's every GPU, beside its exporter's measurement
        want = {(f"{p.deployment.roles[0].listen}:{profile.monitoring.gpu_exporter_port}",
                 str(g.index)) for p in fleet.plans for g in p.gpus if g.role}
        assert len(want) == 3 * 8 and {t for t, _ in want} == set(gpu_targets)
        got = {(r["metric"]["instance"], r["metric"]["gpu"])
               for r in prom.query(f'{PLANNED_FB}{{deployment="{rhost.name}"}}')}
        assert got == want
        sel = f'{{deployment="{rhost.name}"}}'
        used = (f"dsv4:gpu_fb_used_bytes{sel} / on (deployment, instance, gpu) "
                f"group_left (role) {PLANNED_FB}{sel}")
        assert {(r["metric"]["instance"], r["metric"]["gpu"]) for r in prom.query(used)} == want

        killed = time.time()
        sims.kill(urls[0])
        slow = engines[2]
        ttft = wait_firing(prom, "DSV4TTFTHigh", FOR_S + SLACK_S + 40)
        assert active_at(ttft) - started < SLACK_S + 20
        down = wait_firing(prom, "DSV4EngineDown", FOR_S + SLACK_S, instance=engines[0])
        assert time.time() - killed <= FOR_S + SLACK_S + 5
        assert down["labels"]["role"] == "engine"
        # the slow host is the one with the high TTFT p95, per instance
        q = ('histogram_quantile(0.95, sum by (instance, le) (rate('
             f'sglang:time_to_first_token_seconds_bucket{{deployment="{rhost.name}"}}[5m])))')
        p95 = {r["metric"]["instance"]: float(r["value"][1]) for r in prom.query(q)}
        # a host with no request in the window (the killed one, if the router sent it none
        # before the kill) has no p95: NaN (0/0), not a fast host
        others = {k: v for k, v in p95.items() if k != slow and not math.isnan(v)}
        assert p95[slow] > 1.0 and others and all(v < 1.0 for v in others.values()), p95
    finally:
        if load is not None:
            load.stop()
        if prom is not None:
            prom.stop()
        sims.stop()
