"""The planner catches, by stable check id and with numbers, the plans people get wrong by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import DsvError
from orchestrator.facts import DiskFact, Facts, GpuFact, ModelFact, UnitFact
from orchestrator.paths import data_dir
from orchestrator.planner.build import build_plan, load_context, load_plan, save_plan
from orchestrator.planner.fleet import load_fleet, plan_fleet, plan_from_paths
from orchestrator.planner.fleet_report import (
    render_fleet_json,
    render_fleet_markdown,
    render_fleet_text,
)
from orchestrator.planner.report import render_json, render_text
from orchestrator.planner_model import Plan

PROFILES_DIR = data_dir("profiles")
SHIPPED = sorted(p for p in PROFILES_DIR.glob("*.yaml") if p.name != "inventory.yaml")


def _write(tmp_path: Path, profile: dict, inventory: dict | None = None) -> Path:
    inv = inventory or yaml.safe_load((PROFILES_DIR / "inventory.yaml").read_text())
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inv))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def _default() -> dict:
    return yaml.safe_load((PROFILES_DIR / "default.yaml").read_text())


def _ids(plan) -> dict[str, str]:
    return {c.id: c.severity for c in plan.checks}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_profiles_plan_without_errors(path: Path) -> None:
    fleet = plan_fleet(load_fleet(path, None))
    assert fleet.errors == [], [c.message for c in fleet.errors]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_golden_plan_text_and_json(path: Path, golden, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the fleet renderers, as `dsv4ctl plan` prints: a single host's output is its plan's,
    byte for byte (the fleet of one), a fleet's has the summary first."""
    monkeypatch.chdir(PROFILES_DIR.parent)  # plans record the profile path as given: keep it relative
    fleet = plan_fleet(load_fleet(Path("profiles") / path.name, None))
    if len(fleet.plans) == 1:
        plan = plan_from_paths(Path("profiles") / path.name)
        assert render_fleet_text(fleet) == render_text(plan)
        assert render_fleet_json(fleet) == render_json(plan)
    golden.check(f"plan/{path.stem}.txt", render_fleet_text(fleet))
    golden.check(f"plan/{path.stem}.md", render_fleet_markdown(fleet))
    golden.check(f"plan/{path.stem}.json", render_fleet_json(fleet))


def test_plans_are_deterministic() -> None:
    a = render_json(plan_from_paths(PROFILES_DIR / "default.yaml"), include_content=True)
    b = render_json(plan_from_paths(PROFILES_DIR / "default.yaml"), include_content=True)
    assert a == b


def test_checkpoint_larger_than_free_disk(tmp_path: Path) -> None:
    inv = yaml.safe_load((PROFILES_DIR / "inventory.yaml").read_text())
    host = inv["hosts"]["gpu-host"]
    host["disks"] = [{"path": "/models", "size": "1TB", "free": "78GiB"}]
    host["models"] = [{"path": "/models/old-llama", "size": "140GB"},
                      {"path": "/models/small", "size": "20GB"}]
    plan = plan_from_paths(_write(tmp_path, _default(), inv))
    (c,) = [c for c in plan.checks if c.id == "disk.space"]
    assert c.severity == "error"
    needed = c.numbers["needed_bytes"]
    assert c.numbers["shortfall_bytes"] == needed - 78 * 2**30
    assert "78GiB" not in c.message and "83.8 GB" in c.message  # 78 GiB in GB, with the shortfall
    assert "/models/old-llama" in (c.fix or "")  # the one present model that frees enough
    (row,) = plan.disks
    assert row.shortfall_bytes == needed - 78 * 2**30 and row.could_free == ["/models/old-llama (140.0 GB)"]


def test_present_model_needs_no_space(tmp_path: Path) -> None:
    inv = yaml.safe_load((PROFILES_DIR / "inventory.yaml").read_text())
    inv["hosts"]["gpu-host"]["disks"] = [{"path": "/models", "size": "1TB", "free": "10GiB"}]
    inv["hosts"]["gpu-host"]["models"] = [{"path": "/models/DeepSeek-V4-Flash-NVFP4",
                                           "size": "168GB", "variant": "dsv4-flash-nvfp4"}]
    plan = plan_from_paths(_write(tmp_path, _default(), inv))
    assert "disk.space" not in _ids(plan)
    assert plan.disks[0].present


def test_bf16_experts_on_a_4_plus_4_split(tmp_path: Path) -> None:
    prof = _default()
    prof["model"]["expert_storage"] = "bf16"
    prof["moe"]["runner_backend"] = "auto"
    plan = plan_from_paths(_write(tmp_path, prof))
    weights = [c for c in plan.checks if c.id == "capacity.weights"]
    assert {c.subject for c in weights} == {"prefill", "decode"}
    assert all(c.severity == "error" for c in weights)
    assert weights[0].numbers["weights_bytes"] > weights[0].numbers["budget_bytes"]
    assert "more GPUs" in (weights[0].fix or "")


def test_bf16_experts_fit_colocated_on_eight(tmp_path: Path) -> None:
    prof = yaml.safe_load((PROFILES_DIR / "mxfp4-tp8.yaml").read_text())
    prof["model"]["expert_storage"] = "bf16"
    prof["moe"]["runner_backend"] = "auto"
    prof["topology"]["engine"]["attn_dp"] = 1
    plan = plan_from_paths(_write(tmp_path, prof))
    assert "capacity.weights" not in _ids(plan)


def test_index_topk_768(tmp_path: Path) -> None:
    prof = _default()
    prof["attention"]["index_topk"] = 768
    plan = plan_from_paths(_write(tmp_path, prof))
    (c,) = [c for c in plan.checks if c.id == "engine.index-topk"]
    assert c.severity == "error" and "512, 1024" in c.message and "768" in c.message
    assert "deepseek_v4_backend.py" in (c.source or "")


def test_index_topk_512_warns_about_recall(tmp_path: Path) -> None:
    prof = _default()
    prof["attention"]["index_topk"] = 512
    plan = plan_from_paths(_write(tmp_path, prof))
    assert _ids(plan)["known-bad.index-topk-512-long-context-recall"] == "warning"
    prof["acknowledge"] = [{"id": "known-bad.index-topk-512-long-context-recall",
                            "reason": "short prompts only on this host"}]
    plan = plan_from_paths(_write(tmp_path, prof))
    (c,) = [c for c in plan.checks if c.id.startswith("known-bad.index-topk-512")]
    assert c.acknowledged and c.ack_reason == "short prompts only on this host"
    assert "(acknowledged)" in render_text(plan)


def test_gpu_used_by_two_roles(tmp_path: Path) -> None:
    prof = _default()
    prof["topology"]["decode"]["gpus"] = [3, 4, 5, 6]
    plan = plan_from_paths(_write(tmp_path, prof))
    (c,) = [c for c in plan.checks if c.id == "topology.gpu-overlap"]
    assert c.severity == "error" and c.numbers["gpu"] == 3 and "prefill" in c.message


def test_tp_not_dividing_heads(tmp_path: Path) -> None:
    prof = _default()
    prof["topology"]["prefill"].update(gpus=[0, 1, 2], tp=3, ep=3)
    plan = plan_from_paths(_write(tmp_path, prof))
    (c,) = [c for c in plan.checks if c.id == "topology.tp-heads"]
    assert c.severity == "error" and "64" in c.message and "1, 2, 4, 8" in (c.fix or "")


def test_moe_backend_that_does_not_run_on_sm120(tmp_path: Path) -> None:
    prof = _default()
    prof["moe"]["runner_backend"] = "flashinfer_trtllm_routed"
    plan = plan_from_paths(_write(tmp_path, prof))
    ids = _ids(plan)
    assert ids["engine.moe-runner-unavailable"] == "error"
    # one mistake, one error: the known-bad entry about the same runner is not said again
    assert "known-bad.trtllm-moe-sm100-only" not in ids
    (c,) = [c for c in plan.checks if c.severity == "error"]
    assert c.id == "engine.moe-runner-unavailable"
    assert "flashinfer_cutlass" in (c.fix or "")


def test_nvfp4_auto_runner_is_caught(tmp_path: Path) -> None:
    prof = _default()
    prof["moe"]["runner_backend"] = "auto"
    plan = plan_from_paths(_write(tmp_path, prof))
    (c,) = [c for c in plan.checks if c.severity == "error"]  # one error for one mistake
    assert c.id == "engine.moe-runner-unavailable" and "flashinfer_trtllm_routed" in c.message


def test_marlin_on_sm120_is_a_fallback_with_its_cost(tmp_path: Path) -> None:
    prof = yaml.safe_load((PROFILES_DIR / "mxfp4-tp8.yaml").read_text())
    prof["moe"]["runner_backend"] = "marlin"
    plan = plan_from_paths(_write(tmp_path, prof))
    (c,) = [c for c in plan.checks if c.id == "engine.moe-runner-fallback"]
    assert "39%" in c.message and "flashinfer_mxfp4" in (c.fix or "")


def test_port_conflict_and_ack_of_error(tmp_path: Path) -> None:
    prof = _default()
    prof["topology"]["decode"]["port"] = 30001
    prof["acknowledge"] = [{"id": "topology.port-conflict", "reason": "please"},
                           {"id": "no.such-check", "reason": "stale"}]
    plan = plan_from_paths(_write(tmp_path, prof))
    ids = _ids(plan)
    assert ids["topology.port-conflict"] == "error"
    assert ids["profile.ack-error"] == "error"
    assert ids["profile.ack-unused"] == "warning"


def test_context_beyond_the_pool(tmp_path: Path) -> None:
    prof = _default()
    prof["serving"]["mem_fraction_static"] = 0.45
    plan = plan_from_paths(_write(tmp_path, prof))
    ids = _ids(plan)
    assert ids.get("capacity.context") == "error" or ids.get("capacity.kv-pool") == "error"


def test_unknown_variant_lists_known_ids(tmp_path: Path) -> None:
    prof = _default()
    prof["model"]["variant"] = "dsv4-flash-mxfp5"
    with pytest.raises(DsvError) as info:
        plan_from_paths(_write(tmp_path, prof))
    text = info.value.render()
    assert "model.variant" in text and "dsv4-flash-mxfp4" in text


def test_probed_facts_change_the_plan(tmp_path: Path) -> None:
    ctx = load_context(PROFILES_DIR / "default.yaml", None)
    facts = Facts(source="probed", host="gpu-host",
                  gpus=[GpuFact(index=i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                memory_mib=97887, compute_cap="12.0") for i in range(8)],
                  disks=[DiskFact(path="/", size_bytes=2 * 10**12, free_bytes=10**12)],
                  models=[ModelFact(path="/models/x", size_bytes=1)], ports_in_use=[30001],
                  current_release="r0001")
    plan = build_plan(ctx, facts)
    assert _ids(plan)["host.port-in-use"] == "error"
    assert plan.facts_source == "probed" and plan.current_release == "r0001"


def _running(plan: Plan) -> list[UnitFact]:
    """Every unit of ``plan``'s release, active (a host that runs it)."""
    return [UnitFact(name=f.path.removeprefix("units/"), active="active") for f in plan.files
            if f.path.startswith("units/")]


def test_no_change_plan_against_current_release() -> None:
    ctx = load_context(PROFILES_DIR / "default.yaml", None)
    first = build_plan(ctx)
    current = {f.path: f.sha256 for f in first.files if f.sha256}
    facts = Facts(source="probed", host="gpu-host",
                  gpus=[GpuFact(index=i, name="rtx-pro-6000-se") for i in range(8)],
                  disks=[DiskFact(path="/models", size_bytes=4 * 10**12, free_bytes=2 * 10**12)],
                  current_release="r0001", current_files=current,
                  current_roles={f.path: f.roles for f in first.files if f.roles},
                  units=_running(first))
    plan = build_plan(ctx, facts)
    assert plan.actions == [] and plan.restarts == []
    assert "No changes." in render_text(plan)
    # one decode knob changes: only decode restarts
    changed = dict(current)
    decode = next(f for f in first.files if f.path == "bin/launch-decode.sh")
    changed[decode.path] = "0" * 64
    plan = build_plan(ctx, facts.model_copy(update={"current_files": changed}))
    assert plan.restarts == ["decode"]
    assert [a.kind for a in plan.actions] == ["change", "restart"]


def test_saved_plan_round_trip(tmp_path: Path) -> None:
    plan = plan_from_paths(PROFILES_DIR / "default.yaml")
    save_plan(plan, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json") == plan
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DsvError) as info:
        load_plan(tmp_path / "bad.json")
    assert "not a saved plan" in info.value.render()


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    assert main(["plan", "--detailed-exitcode"]) == 2
    prof = _default()
    prof["attention"]["index_topk"] = 768
    assert main(["plan", str(_write(tmp_path, prof))]) == 1
    out = capsys.readouterr().out
    assert "engine.index-topk" in out and "nothing can be applied" in out
    assert main(["plan", str(tmp_path / "missing.yaml")]) == 1
    assert "file not found" in capsys.readouterr().err
    assert main(["plan", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == 2 and data["summary"]["errors"] == 0


@pytest.mark.parametrize("argv", [
    ["plan"],
    ["plan", "--explain"],
    ["plan", str(PROFILES_DIR / "fleet-3x.yaml")],
    ["plan", str(PROFILES_DIR / "fleet-3x.yaml"), "--explain", "--format", "json"],
], ids=["host", "explain", "fleet", "fleet-explain-json"])
def test_plan_path_imports_no_torch_triton_or_fabric(argv: list[str]) -> None:
    code = (f"import sys; from orchestrator.cli import main; rc = main({argv!r}); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'triton', 'fabric', 'paramiko', 'invoke', 'aiohttp')); print(rc, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []"


def test_topology_switch_stops_dropped_roles_and_starts_new_ones(tmp_path: Path) -> None:
    pd = build_plan(load_context(PROFILES_DIR / "default.yaml", None))
    current = {f.path: f.sha256 for f in pd.files if f.sha256}
    roles = {f.path: f.roles for f in pd.files if f.roles}
    prof = yaml.safe_load((PROFILES_DIR / "mxfp4-tp8.yaml").read_text())
    prof["name"] = "default"  # same deployment, now colocated
    ctx = load_context(_write(tmp_path, prof), None)
    facts = Facts(source="probed", host="gpu-host",
                  gpus=[GpuFact(index=i, name="rtx-pro-6000-se") for i in range(8)],
                  disks=[DiskFact(path="/models", size_bytes=4 * 10**12, free_bytes=2 * 10**12)],
                  current_release="r0001", current_files=current, current_roles=roles,
                  units=_running(pd))
    plan = build_plan(ctx, facts)
    lifecycle = [(a.kind, a.target) for a in plan.actions if a.kind in ("start", "stop", "restart")]
    assert lifecycle == [("stop", "dsv4-default-router.service"),
                         ("stop", "dsv4-default-decode.service"),
                         ("stop", "dsv4-default-prefill.service"),
                         ("start", "dsv4-default-engine.service")]
    assert plan.restarts == []
    assert ("remove", "units/dsv4-default-router.service") in [(a.kind, a.target) for a in plan.actions]


def _paths(plan) -> dict[tuple[str, str], object]:
    return {(r.name, p.op): p for r in plan.deployment.roles for p in r.kernels}


def test_default_profile_on_sm120_takes_the_engines_paths(tmp_path: Path) -> None:
    # no measurement: FlashInfer attention and the TileLang indexer (SGLang's own sm_120
    # defaults); the mHC pre GEMM bundled, since the engine's is FP32 without tensor cores
    plan = build_plan(load_context(_write(tmp_path, _default()), None))
    paths = _paths(plan)
    for role in ("prefill", "decode"):
        assert paths[(role, "attention")].path == "engine"
        assert paths[(role, "attention")].runs == "FlashInfer sparse MLA"
        assert paths[(role, "indexer")].path == "engine"
        assert paths[(role, "indexer")].runs.startswith("TileLang")
        mhc = paths[(role, "mhc_pre")]
        assert mhc.path == "bundled" and "no tensor-core path" in mhc.why
        assert "fp32-gemms" in mhc.source
    assert "Kernels per role" in render_text(plan)


def test_explicit_choices_win_and_old_keys_are_reported(tmp_path: Path) -> None:
    p = _default()
    p["kernels"] = {"attention": "bundled", "indexer": "bundled", "mhc_pre": "engine"}
    paths = _paths(build_plan(load_context(_write(tmp_path, p), None)))
    assert [paths[("decode", op)].path for op in ("attention", "indexer", "mhc_pre")] == \
        ["bundled", "bundled", "engine"]
    p["kernels"] = {"enabled": False}
    plan = build_plan(load_context(_write(tmp_path, p), None))
    assert {x.path for x in _paths(plan).values()} == {"engine"}
    (dep,) = [c for c in plan.checks if c.id == "kernels.deprecated-key"]
    assert dep.severity == "warning" and "kernels.attention: engine" in dep.message
    p["kernels"] = {"enabled": True}
    (dep,) = [c for c in build_plan(load_context(_write(tmp_path, p), None)).checks
              if c.id == "kernels.deprecated-key"]
    assert "no longer forces the bundled kernels" in dep.message


def test_bundled_on_a_gpu_without_the_entry_points_does_nothing(tmp_path: Path) -> None:
    # SGLang reaches the hooked functions only on sm_120; bundled on an H200 would only move the
    # indexer to a slow torch fallback, so it renders nothing and the plan warns
    p = _default()
    p["kernels"] = {"indexer": "bundled"}
    inv = yaml.safe_load((PROFILES_DIR / "inventory.yaml").read_text()
                         .replace("model: rtx-pro-6000-se", "model: h200"))
    plan = build_plan(load_context(_write(tmp_path, p, inv), None))
    assert {x.path for x in _paths(plan).values()} == {"engine"}
    assert "kernels.bundled-no-effect" in _ids(plan)
    assert not any("DSV4_KERNELS" in (f.content or "") for f in plan.files)
