"""Property test: any profile that passes the schema plans to a Plan or a typed error, never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import DsvError
from orchestrator.paths import data_dir
from orchestrator.planner.build import build_plan, load_context
from orchestrator.planner.report import render_json, render_markdown, render_text

PROFILES = data_dir("profiles")
BASES = [yaml.safe_load((PROFILES / n).read_text()) for n in ("default.yaml", "mxfp4-tp8.yaml")]
VARIANTS = ["dsv4-flash-mxfp4", "dsv4-flash-0731-mxfp4", "dsv4-flash-nvfp4", "dsv4-flash-fp8",
            "dsv4-flash-w4a16", "no-such-variant"]
RUNNERS = ["auto", "flashinfer_mxfp4", "flashinfer_cutlass", "marlin", "triton",
           "flashinfer_trtllm_routed", "deep_gemm", "bogus_runner"]
gpu_sets = st.lists(st.integers(0, 9), min_size=1, max_size=9)


@st.composite
def profiles(draw: st.DrawFn) -> dict:
    p = copy.deepcopy(draw(st.sampled_from(BASES)))
    p["model"]["variant"] = draw(st.sampled_from(VARIANTS))
    p["model"]["expert_storage"] = draw(st.sampled_from(["native", "fp8", "bf16"]))
    p["moe"]["runner_backend"] = draw(st.sampled_from(RUNNERS))
    p["attention"]["index_topk"] = draw(st.sampled_from([512, 1024, 768, 2048, 1]))
    p["attention"]["kv_cache_dtype"] = draw(st.sampled_from(["fp8_e4m3", "bfloat16", "bf16", "fp8_e5m2"]))
    p["attention"]["context_length"] = draw(st.sampled_from([4096, 131072, 1048576, 2_000_000]))
    p["attention"]["fp4_indexer"] = draw(st.booleans())
    p["serving"]["mem_fraction_static"] = draw(st.floats(0.05, 0.99))
    p["serving"]["max_running_requests"] = draw(st.sampled_from([None, 1, 8, 64, 256, 4096]))
    p["speculative"] = {"algorithm": draw(st.sampled_from(["none", "eagle", "dspark"])),
                        "num_draft_tokens": draw(st.sampled_from([None, 2, 4])),
                        "dspark_block_size": draw(st.sampled_from([None, 5]))}
    roles = ["engine"] if p["topology"]["mode"] == "colocated" else ["prefill", "decode"]
    for r in roles:
        gpus = draw(gpu_sets)
        tp = draw(st.sampled_from([len(gpus), 1, 2, 3, 4, 8]))
        p["topology"][r].update(gpus=gpus, tp=tp, ep=draw(st.sampled_from([1, tp, 2])),
                                attn_dp=draw(st.sampled_from([1, 2, tp])))
    return p


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(profiles())
def test_valid_profiles_plan_or_fail_cleanly(tmp_path_factory, profile: dict) -> None:
    d: Path = tmp_path_factory.mktemp("fuzz")
    (d / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    (d / "p.yaml").write_text(yaml.safe_dump(profile))
    try:
        plan = build_plan(load_context(d / "p.yaml", None))
    except DsvError as exc:
        assert exc.render().startswith("error: ")
        return
    render_text(plan, verbose=True)
    render_markdown(plan)
    render_json(plan)
    for c in plan.checks:
        assert c.id and c.message and c.severity in ("error", "warning", "info")
