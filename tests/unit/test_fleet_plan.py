"""Fleets (issue 23), the planning half: inventory groups, `hosts:`, placement, one router across
hosts, per-host plans with their own facts, the fleet summary, cross-host PD transfer estimates."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import InputError, ProfileError, RemoteError
from orchestrator.facts import declared_facts
from orchestrator.paths import data_dir
from orchestrator.planner.fleet import load_fleet, plan_fleet, plan_from_paths, probe_fleet
from orchestrator.profile import Inventory, Profile, load_text
from orchestrator.render.argv import engine_argv, router_argv

PROFILES = data_dir("profiles")
INV = yaml.safe_load((PROFILES / "inventory.yaml").read_text())
FLEET = yaml.safe_load((PROFILES / "fleet-3x.yaml").read_text())
DEFAULT = yaml.safe_load((PROFILES / "default.yaml").read_text())


def _write(tmp_path: Path, profile: dict, inventory: dict | None = None) -> Path:
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inventory or INV))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def _pd_fleet(**router: object) -> dict:
    """The default PD profile (4 prefill + 4 decode GPUs per host) on the fleet-3x group."""
    p = json.loads(json.dumps(DEFAULT))
    p.pop("host")
    p["hosts"] = "fleet-3x"
    p["topology"]["router"].update(router)
    return p


# -- inventory and profile ----------------------------------------------------------------------


def test_group_members_are_defaults_with_their_own_fields_over_them() -> None:
    inv = Inventory.model_validate(INV)
    hosts = inv.all_hosts()
    assert list(inv.groups["fleet-3x"].members) == ["gpu-a", "gpu-b", "gpu-c"]
    assert hosts["gpu-a"].install_root == "/srv/dsv4" and hosts["gpu-a"].gpus.count == 8
    assert hosts["gpu-c"].install_root == "/data/dsv4"  # the per-host override
    assert [d.free for d in hosts["gpu-c"].disks] == [5_200_000_000_000]
    assert hosts["router-1"].gpus is None  # a router host declares no GPU


def test_group_member_missing_a_required_field_names_it_and_the_fix() -> None:
    inv = json.loads(json.dumps(INV))
    del inv["groups"]["fleet-3x"]["hosts"]["gpu-b"]["address"]
    with pytest.raises(InputError) as info:
        load_text(Inventory, yaml.safe_dump(inv), "inventory.yaml")
    text = info.value.render()
    assert "groups.fleet-3x" in text and "hosts.gpu-b: address is required" in text
    assert "add address: to defaults or to the host" in text


def test_bad_member_value_is_located_at_the_member() -> None:
    inv = json.loads(json.dumps(INV))
    inv["groups"]["fleet-3x"]["hosts"]["gpu-b"]["link_gbps"] = -5
    with pytest.raises(InputError) as info:
        load_text(Inventory, yaml.safe_dump(inv, sort_keys=False), "inventory.yaml")
    (p,) = info.value.problems
    assert p.path == "groups.fleet-3x.hosts.gpu-b.link_gbps" and p.line is not None
    assert "-5" in (p.value or "")


def test_a_host_name_means_one_host() -> None:
    inv = json.loads(json.dumps(INV))
    inv["groups"]["fleet-3x"]["hosts"]["gpu-host"] = {"address": "10.0.1.99"}
    with pytest.raises(InputError) as info:
        load_text(Inventory, yaml.safe_dump(inv), "inventory.yaml")
    assert "host 'gpu-host' is already declared under hosts" in info.value.render()


def test_profile_takes_host_or_hosts_not_both() -> None:
    both = dict(FLEET, host="gpu-host")
    with pytest.raises(InputError) as info:
        load_text(Profile, yaml.safe_dump(both), "p.yaml")
    assert "'host' and 'hosts' are both set" in info.value.render()
    neither = {k: v for k, v in FLEET.items() if k != "hosts"}
    with pytest.raises(InputError) as info:
        load_text(Profile, yaml.safe_dump(neither), "p.yaml")
    assert "give exactly one of 'host'" in info.value.render()


def test_unknown_group_and_unknown_router_host_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as info:
        load_fleet(_write(tmp_path, dict(FLEET, hosts="fleet-9x")), None)
    assert "'fleet-9x' is neither a group nor a host" in info.value.message
    assert "fleet-3x" in (info.value.fix or "")
    p = json.loads(json.dumps(FLEET))
    p["topology"]["router"]["runs_on"] = "nowhere"
    with pytest.raises(ProfileError) as info:
        load_fleet(_write(tmp_path, p), None)
    assert "topology.router.runs_on = 'nowhere'" in info.value.message


def test_a_fleet_host_addressed_by_name_needs_a_service_address(tmp_path: Path) -> None:
    inv = json.loads(json.dumps(INV))
    inv["groups"]["fleet-3x"]["hosts"]["gpu-b"]["address"] = "gpu-b.internal"
    with pytest.raises(ProfileError) as info:
        load_fleet(_write(tmp_path, FLEET, inv), None)
    assert "host 'gpu-b'" in info.value.message and "service_address" in (info.value.fix or "")
    inv["groups"]["fleet-3x"]["hosts"]["gpu-b"]["service_address"] = "10.0.2.12"
    fleet = plan_fleet(load_fleet(_write(tmp_path, FLEET, inv), None))
    assert fleet.plan("gpu-b").deployment.roles[0].listen == "10.0.2.12"


# -- the plan ----------------------------------------------------------------------------------


def test_one_host_without_disk_fails_the_plan_naming_it_the_others_intact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Acceptance (issue 23): `plan` of a fleet where one host lacks disk -> one error naming that
    host, the others' plans intact."""
    inv = json.loads(json.dumps(INV))
    inv["groups"]["fleet-3x"]["hosts"]["gpu-b"]["disks"] = [
        {"path": "/models", "size": "1TB", "free": "78GiB"}]
    path = _write(tmp_path, FLEET, inv)
    fleet = plan_fleet(load_fleet(path, None))
    assert fleet.failed_hosts == ["gpu-b"]
    (err,) = fleet.errors
    assert err.id == "disk.space" and fleet.plan("gpu-b").errors == [err]
    for ok in ("gpu-a", "gpu-c", "router-1"):
        p = fleet.plan(ok)
        assert p.errors == [] and p.actions  # planned in full
    assert fleet.plan("gpu-a").capacity and fleet.plan("gpu-c").disks[0].shortfall_bytes == 0

    assert main(["plan", str(path)]) == 1
    out = capsys.readouterr().out
    head = " ".join(out.split("=== host")[0].split())  # the pipe folds lines at 100 columns
    assert "gpu-b engine NO 1" in head
    assert "Host gpu-b does not fit" in head and "the other hosts' plans stand" in head
    assert out.count("x error") == 1 and "=== host gpu-a ===" in out
    assert out.rstrip().endswith("host gpu-b: disk.space: checkpoint does not fit the disk")

    assert main(["plan", str(path), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["failed_hosts"] == ["gpu-b"] and data["summary"]["errors"] == 1
    assert data["summary"]["error_lines"] == [
        "host gpu-b: disk.space: checkpoint does not fit the disk"]
    assert [p["host"] for p in data["plans"]] == ["gpu-a", "gpu-b", "gpu-c", "router-1"]
    assert [p["summary"]["errors"] for p in data["plans"]] == [0, 1, 0, 0]


def test_each_host_is_planned_with_its_own_facts(tmp_path: Path) -> None:
    inv = json.loads(json.dumps(INV))
    inv["groups"]["fleet-3x"]["hosts"]["gpu-c"]["gpus"] = {"model": "rtx-pro-6000-se", "count": 4}
    fleet = plan_fleet(load_fleet(_write(tmp_path, FLEET, inv), None))
    assert fleet.failed_hosts == ["gpu-c"]  # TP8 on a 4-GPU host
    assert {c.id for c in fleet.plan("gpu-c").errors} == {"topology.gpu-missing"}
    assert fleet.plan("gpu-a").errors == []


def test_live_facts_are_probed_in_parallel_and_a_failure_names_the_host() -> None:
    fctx = load_fleet(PROFILES / "fleet-3x.yaml", None)
    running, peak, lock = [0], [0], threading.Lock()

    def gather(name, host):  # type: ignore[no-untyped-def]
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return declared_facts(name, host)

    facts = probe_fleet(fctx, gather)
    assert sorted(facts) == ["gpu-a", "gpu-b", "gpu-c", "router-1"]
    assert peak[0] == 4  # all at once, not one after the other

    def broken(name, host):  # type: ignore[no-untyped-def]
        if name == "gpu-b":
            raise RemoteError("connection refused", fix="check sshd")
        return declared_facts(name, host)

    with pytest.raises(RemoteError) as info:
        probe_fleet(fctx, broken)
    assert info.value.message == "host 'gpu-b': connection refused"
    assert probe_fleet(fctx, gather, only=("gpu-c",)).keys() == {"gpu-c"}


def test_single_host_profile_is_the_fleet_of_one() -> None:
    fctx = load_fleet(PROFILES / "default.yaml", None)
    assert not fctx.is_fleet and [n for n, _ in fctx.hosts] == ["gpu-host"]
    fleet = plan_fleet(fctx)
    assert len(fleet.plans) == 1
    assert fleet.plans[0] == plan_from_paths(PROFILES / "default.yaml")
    dep = fleet.plans[0].deployment
    assert dep.fleet == () and {r.listen for r in dep.roles} == {"127.0.0.1"}


def test_a_fleet_profile_needs_the_host_named_for_one_host_plan() -> None:
    with pytest.raises(ProfileError) as info:
        plan_from_paths(PROFILES / "fleet-3x.yaml")
    assert "targets a fleet (gpu-a, gpu-b, gpu-c)" in info.value.message
    plan = plan_from_paths(PROFILES / "fleet-3x.yaml", host_override="gpu-b")
    assert plan.host == "gpu-b" and plan.deployment.router_on == "router-1"


# -- one router across hosts -------------------------------------------------------------------


def test_regular_mode_router_serves_every_engine_at_its_host_address() -> None:
    fleet = plan_fleet(load_fleet(PROFILES / "fleet-3x.yaml", None))
    router = fleet.plan("router-1").deployment
    assert router.roles == () and router.router is not None
    argv = router_argv(router)
    assert argv[:4] == ["--worker-urls", "http://10.0.1.11:30000", "http://10.0.1.12:30000",
                        "http://10.0.1.13:30000"]
    assert "--pd-disaggregation" not in argv
    for host, ip in (("gpu-a", "10.0.1.11"), ("gpu-c", "10.0.1.13")):
        dep = fleet.plan(host).deployment
        assert dep.router is None and dep.router_on == "router-1"
        a = engine_argv(dep, dep.roles[0])
        assert a[a.index("--host") + 1] == ip  # the private address, never 0.0.0.0
    # the router-only host needs no GPU and no checkpoint
    assert fleet.plan("router-1").gpus == [] and fleet.plan("router-1").disks == []


def test_router_on_a_fleet_host_reaches_its_own_engine_over_loopback(tmp_path: Path) -> None:
    p = json.loads(json.dumps(FLEET))
    del p["topology"]["router"]["runs_on"]  # default: the first host
    fleet = plan_fleet(load_fleet(_write(tmp_path, p), None))
    assert fleet.router_on == "gpu-a" and fleet.router_only_host is None
    a = fleet.plan("gpu-a").deployment
    assert a.roles[0].listen == "127.0.0.1"
    assert a.router is not None and a.router.worker_urls == (
        "http://127.0.0.1:30000", "http://10.0.1.12:30000", "http://10.0.1.13:30000")
    assert fleet.plan("gpu-b").deployment.roles[0].listen == "10.0.1.12"


def test_pd_router_serves_every_prefill_with_its_bootstrap_port_and_every_decode(
        tmp_path: Path) -> None:
    fleet = plan_fleet(load_fleet(_write(tmp_path, _pd_fleet()), None))
    r = fleet.plan("gpu-a").deployment.router
    assert r is not None
    argv = router_argv(r and fleet.plan("gpu-a").deployment)
    assert argv[0] == "--pd-disaggregation"
    assert argv.count("--prefill") == 3 and argv.count("--decode") == 3
    i = argv.index("--prefill")
    assert argv[i + 1:i + 3] == ["http://10.0.1.11:30001", "8998"]
    assert "http://10.0.1.13:30002" in argv
    # a prefill's peer decodes are on other hosts: every engine listens on its host's address
    assert {r.listen for r in fleet.plan("gpu-a").deployment.roles} == {"10.0.1.11"}


def test_cross_host_pd_estimates_kv_transfer_and_warns_when_it_dominates_ttft(
        tmp_path: Path) -> None:
    p = _pd_fleet()
    p["topology"]["prefill"]["hosts"] = ["gpu-a"]
    p["topology"]["decode"]["hosts"] = ["gpu-b", "gpu-c"]
    fleet = plan_fleet(load_fleet(_write(tmp_path, p), None))
    assert [d.name for d in fleet.plan("gpu-a").deployment.roles] == ["prefill"]
    assert [d.name for d in fleet.plan("gpu-b").deployment.roles] == ["decode"]
    (c,) = [c for c in fleet.checks if c.id.startswith("fleet.pd-transfer")]
    bpt = next(x for x in fleet.plan("gpu-a").capacity if x.role == "prefill").bytes_per_token
    # one copy per attention-TP rank of the decode engine (TP4, no attention-DP: 4)
    assert c.numbers["decode_rank_copies"] == 4
    assert c.numbers["kv_bytes_per_request"] == int(bpt * 65536) * 4
    expect = int(bpt * 65536) * 4 * 8 / 25e9  # 25 Gbit/s declared in the inventory
    assert c.numbers["transfer_s"] == round(expect, 3)
    assert c.severity == ("warning" if expect > 10.0 / 2 else "info")
    # a slow link makes it dominate the 10 s TTFT budget
    inv = json.loads(json.dumps(INV))
    inv["groups"]["fleet-3x"]["defaults"]["link_gbps"] = 0.1
    slow = plan_fleet(load_fleet(_write(tmp_path, p, inv), None))
    (w,) = [c for c in slow.checks if c.id == "fleet.pd-transfer-dominates-ttft"]
    assert w.severity == "warning" and "gpu-a" in w.message and w.fix
    assert w.location and w.field == "topology.transfer_backend"
    # no declared link: said so, not guessed
    del inv["groups"]["fleet-3x"]["defaults"]["link_gbps"]
    unknown = plan_fleet(load_fleet(_write(tmp_path, p, inv), None))
    assert [c.id for c in unknown.checks if c.id != "rollout.analysis-off"] == ["fleet.pd-link-unknown"]


def test_role_placement_outside_the_fleet_is_refused(tmp_path: Path) -> None:
    p = _pd_fleet()
    p["topology"]["decode"]["hosts"] = ["gpu-host"]
    with pytest.raises(ProfileError) as info:
        load_fleet(_write(tmp_path, p), None)
    assert "topology.decode.hosts" in info.value.message and "not in the fleet" in info.value.message


def test_inventory_schema_has_groups(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--inventory-schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "groups" in schema["properties"]
    assert main(["schema"]) == 0
    text = capsys.readouterr().out
    assert '"hosts"' in text and '"runs_on"' in text


def test_render_writes_every_host_of_a_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tree"
    assert main(["render", str(PROFILES / "fleet-3x.yaml"), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["gpu-a", "gpu-b", "gpu-c", "router-1"]
    assert "10.0.1.13" in (out / "gpu-c" / "bin" / "launch-engine.sh").read_text()
    assert "--worker-urls" in (out / "router-1" / "bin" / "launch-router.sh").read_text()
    # the router's host runs no engine but watches the whole fleet: one Prometheus config for all
    fleet_scrape = (out / "router-1" / "monitoring" / "prometheus.yml").read_text()
    assert all(f"10.0.1.1{i}:30000" in fleet_scrape for i in (1, 2, 3))
    capsys.readouterr()
    assert main(["render", str(PROFILES / "fleet-3x.yaml"), "--host", "gpu-x"]) == 1
    assert "not a host of" in capsys.readouterr().err


def test_the_fleet_router_command_line_is_checked_against_the_router_flag_table(
        tmp_path: Path) -> None:
    """The profile's static checks see the fleet of one (no router in colocated mode): the fleet's
    router line is checked on its own, an unknown flag value named at its field."""
    from orchestrator.planner.rules import router_flag_checks

    fctx = load_fleet(PROFILES / "fleet-3x.yaml", None)
    fleet = plan_fleet(fctx)
    assert [c.id for c in fleet.checks] == ["rollout.analysis-off"]  # (info: no analysis set)
    dep = fleet.plan("router-1").deployment
    assert dep.router is not None
    bad = dep.model_copy(update={"router": dep.router.model_copy(update={"policy": "bucket"})})
    (c,) = router_flag_checks(bad, fctx.profile)
    assert c.severity == "error" and c.field == "topology.router.policy" and "bucket" in c.message


def test_a_saved_fleet_plan_holds_every_host_and_is_not_taken_for_one_hosts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.planner.build import load_fleet_plan, load_plan

    out = tmp_path / "fleet.json"
    assert main(["plan", str(PROFILES / "fleet-3x.yaml"), "-o", str(out)]) == 0
    saved = load_fleet_plan(out)
    assert [p.host for p in saved.plans] == ["gpu-a", "gpu-b", "gpu-c", "router-1"]
    assert saved == plan_fleet(load_fleet(PROFILES / "fleet-3x.yaml", None))
    assert all(f.content for p in saved.plans for f in p.files)
    with pytest.raises(InputError) as info:
        load_plan(out)
    assert "a fleet's plan (gpu-a, gpu-b, gpu-c)" in info.value.render()
    # a damaged fleet plan is named by its field, like a host's, never a pydantic traceback
    data = json.loads(out.read_text())
    del data["plans"][1]["deployment"]
    out.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        load_fleet_plan(out)
    assert "plans.1.deployment" in info.value.render() and "not a saved plan" in info.value.render()


def test_a_list_of_one_host_is_the_fleet_of_one(tmp_path: Path) -> None:
    p = json.loads(json.dumps(DEFAULT))
    p.pop("host")
    p["hosts"] = ["gpu-host"]
    fleet = plan_fleet(load_fleet(_write(tmp_path, p), None))
    assert len(fleet.plans) == 1 and fleet.plans[0].deployment.fleet == ()
    single = plan_from_paths(PROFILES / "default.yaml")
    def files(plan):  # type: ignore[no-untyped-def]
        # profile.yaml records the profile as written (hosts: [gpu-host]); the manifest hashes it
        return [f for f in plan.files if f.path not in ("profile.yaml", "manifest.json")]

    assert files(fleet.plans[0]) == files(single)  # the same units, scripts, env, monitoring


def test_pd_engines_of_a_fleet_pin_their_transfer_address(tmp_path: Path) -> None:
    """SGLang's KV transfer endpoint binds SGLANG_HOST_IP when set, else a guessed interface:
    a fleet's PD engine gets its host's service address, a single host's none."""
    from orchestrator.render import render_release

    path = _write(tmp_path, _pd_fleet())
    fctx = load_fleet(path, None)
    dep = plan_fleet(fctx).plan("gpu-b").deployment
    tree = render_release(fctx.profile, dep)
    for role in ("prefill", "decode"):
        assert 'SGLANG_HOST_IP="10.0.1.12"' in tree.files[f"env/{role}.env"].content
    single = plan_from_paths(PROFILES / "default.yaml")
    assert not any("SGLANG_HOST_IP" in (f.content or "") for f in single.files)
    p = _pd_fleet()
    p["topology"]["decode"]["env"] = {"SGLANG_HOST_IP": "1.2.3.4"}
    fctx = load_fleet(_write(tmp_path, p), None)
    with pytest.raises(Exception) as info:
        plan_fleet(fctx)
    assert "topology.decode.env.SGLANG_HOST_IP" in str(info.value)
    assert "host 'gpu-a'" in str(info.value)


def test_plan_live_probes_every_host_and_host_probes_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import orchestrator.remote as remote

    seen: list[str] = []

    def fake(name, host, model_paths=(), engine_env=None):  # type: ignore[no-untyped-def]
        seen.append(name)
        return declared_facts(name, host).model_copy(update={"source": "probed"})

    monkeypatch.setattr(remote, "gather_facts", fake)
    assert main(["plan", str(PROFILES / "fleet-3x.yaml"), "--live", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(seen) == ["gpu-a", "gpu-b", "gpu-c", "router-1"]
    assert {p["facts_source"] for p in data["plans"]} == {"probed"}
    seen.clear()
    assert main(["plan", str(PROFILES / "fleet-3x.yaml"), "--host", "gpu-b", "--live",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert seen == ["gpu-b"]
    assert [p["facts_source"] for p in data["plans"]] == ["declared", "probed", "declared",
                                                          "declared"]


def test_a_single_colocated_host_with_a_router_gets_one_in_regular_mode(tmp_path: Path) -> None:
    p = yaml.safe_load((PROFILES / "mxfp4-tp8.yaml").read_text())
    p["topology"]["router"] = {"port": 8100}
    fleet = plan_fleet(load_fleet(_write(tmp_path, p), None))
    (plan,) = fleet.plans
    dep = plan.deployment
    assert dep.router is not None and dep.roles[0].listen == "127.0.0.1"
    assert router_argv(dep)[:2] == ["--worker-urls", "http://127.0.0.1:30000"]
    assert "units/dsv4-mxfp4-tp8-router.service" in {f.path for f in plan.files}
    assert plan.errors == []
