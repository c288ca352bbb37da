"""The headroom model (planner/headroom.py) and the ``capacity.headroom`` check built on it.

The terms' equality with sglang 0.5.23's own code is proven in
tests/parsers_real/test_headroom_vs_sglang.py; here: the arithmetic of each term on worked
numbers, and that the check fires for the longest declared request, names the largest term and
both ways out with their price, and stays quiet when the request fits.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from orchestrator.paths import data_dir
from orchestrator.planner import headroom as H
from orchestrator.planner.fleet import plan_from_paths
from orchestrator.planner.report import render_json

MIB, GIB = 1 << 20, 1 << 30
RTX = 97_887 * MIB
PROFILES = data_dir("profiles")

PREFILL = H.HeadroomInputs(gpu_total_bytes=RTX, mem_fraction_static=0.85, tp=4,
                           disaggregation_mode="prefill", chunked_prefill_size=8192,
                           max_running_requests=64, longest_request_tokens=1_048_576)


def _term(m: H.HeadroomModel, tid: str) -> H.HeadroomTerm:
    return next(t for t in m.terms if t.id == tid)


def test_every_term_is_present_sourced_and_flagged() -> None:
    m = H.build(PREFILL, 13 * GIB)
    assert [t.id for t in m.terms] == ["cuda_context", "nccl", "custom_allreduce",
                                       "activations", "cuda_graphs", "indexer_logits"]
    for t in m.terms:
        assert t.source and t.detail
        assert t.exact or "estimate" in t.source or "unconfirmed" in t.source, t
    assert m.preload_bytes == 1 * GIB + 2 * 8 * 2 * 4 * MIB  # context + NCCL; custom AR off
    assert m.runtime_bytes == sum(t.bytes for t in m.terms if t.phase == "runtime")


def test_activation_term_arithmetic() -> None:
    # residual 2*4096*(4+2) = 49,152; attention 2*(2*16*512 + 1024) = 34,816; indexer
    # 64*132 = 8,448; routed 2*6*(3*2048 + 4096) = 122,880; shared 2*(3*2048 + 4096)//4 = 5,120
    assert H.activation_bytes_per_token(PREFILL) == 220_416
    m = H.build(PREFILL)
    assert _term(m, "activations").bytes == 512 * MIB + 8192 * 220_416
    dec = H.build(replace(PREFILL, disaggregation_mode="decode", tokens_per_request=4))
    assert _term(dec, "activations").bytes == 512 * MIB + 64 * 4 * 220_416


def test_tilelang_default_on_sm120_is_one_unchunked_piece() -> None:
    # sglang's V4 hook sets SGLANG_OPT_USE_TILELANG_INDEXER=1 and SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1
    # on sm_120: TileLang scores all 8,192 rows x 262,144 keys at once, no DeepGEMM schedule.
    m = H.build(replace(PREFILL, indexer_path="tilelang", torch_mqa_env=True), 13 * GIB)
    assert _term(m, "indexer_logits").bytes == 8192 * 262_144 * 4 == 8 * GIB


def test_indexer_logits_deepgemm_opt_in_is_chunked_by_budget_and_sm120_cap() -> None:
    # 1,048,576 tokens = 4,096 pages x 64 compressed keys = 262,144 columns; a row is 1 MiB fp32.
    assert H.compressed_cols(1_048_576) == 262_144
    assert H.mqa_row_bytes(262_144) == 1 * MIB
    free = 13 * GIB - 0  # runtime available passed to build, minus activations and graphs inside
    m = H.build(PREFILL, free)
    act, graphs = _term(m, "activations").bytes, _term(m, "cuda_graphs").bytes
    budget = min(H.mqa_static_budget(RTX, 0.85), int((free - act - graphs) * 0.2))
    rows = min(4096, budget // MIB)  # the SM120 cap or the budget, whichever is smaller
    paged = rows * MIB
    nonpaged = 262_144 * 132 + (budget // MIB) * MIB  # one request >= 8192 rows: K + chunk
    assert _term(m, "indexer_logits").bytes == max(paged, nonpaged)
    assert _term(m, "indexer_logits").exact


def test_decode_indexer_is_graph_backed_and_unchunked() -> None:
    dec = H.build(replace(PREFILL, disaggregation_mode="decode"))
    # 64 rows x 1 MiB: under the SM120 cap, no budget inside a CUDA graph
    assert _term(dec, "indexer_logits").bytes == 64 * MIB


def test_torch_sm120_path_is_orders_of_magnitude_larger() -> None:
    m = H.build(replace(PREFILL, indexer_path="torch-sm120", torch_mqa_env=True), 13 * GIB)
    t = _term(m, "indexer_logits")
    # 8 slices of 1024 rows: the last slice's working set rides on 7 slices' fp32 outputs
    slice_peak = 1024 * max(516 * 262_144, (392 + 6 * 64) * 262_144 + 256 * 64)
    assert t.bytes == max(7 * 1024 * 262_144 * 4 + slice_peak, 2 * 8192 * 262_144 * 4)
    assert t.bytes > 100 * GIB and m.largest_runtime.id == "indexer_logits"


def test_defaults_follow_sglang_for_the_card() -> None:
    m = H.build(replace(PREFILL, chunked_prefill_size=None, cuda_graph_max_bs=None,
                        max_running_requests=None, disaggregation_mode="null"))
    assert m.chunked_prefill_size == 8192 and m.cuda_graph_max_bs == 512  # tp 4, < 160 GiB
    assert H.build(replace(PREFILL, tp=2, cuda_graph_max_bs=None,
                           max_running_requests=None)).cuda_graph_max_bs == 256


def _plan(tmp_path: Path, **changes: object):
    prof = yaml.safe_load((PROFILES / "default.yaml").read_text())
    for path, value in changes.items():
        node = prof
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    inv = yaml.safe_load((PROFILES / "inventory.yaml").read_text())
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inv))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    return plan_from_paths(tmp_path / "p.yaml")


def test_default_profile_fits_and_the_plan_carries_the_terms(tmp_path: Path) -> None:
    plan = plan_from_paths(PROFILES / "default.yaml")
    assert "capacity.headroom" not in {c.id for c in plan.checks}
    for cap in plan.capacity:
        assert [t.id for t in cap.headroom_terms][-1] == "indexer_logits"
        assert 0 < cap.headroom_need_bytes <= cap.headroom_bytes
        assert cap.longest_request_tokens == 65536
    assert '"headroom_terms"' in render_json(plan)


def test_check_fires_for_a_long_request_on_the_torch_path(tmp_path: Path) -> None:
    plan = _plan(tmp_path, **{"workload.longest_request_tokens": 1_048_576,
                              "topology.prefill.env": {"SGLANG_OPT_USE_TILELANG_INDEXER": "0"}})
    pre = next(c for c in plan.capacity if c.role == "prefill")
    assert "sm_120 torch function" in pre.headroom_terms[-1].detail
    c = next(c for c in plan.checks if c.id == "capacity.headroom" and c.subject == "prefill")
    assert c.severity == "error"  # the exact term alone does not fit
    assert c.numbers["largest_term"] == "indexer_logits"
    assert "indexer_logits" in c.message and "1,048,576" in c.message
    # 218 GB: neither way out is enough, and the fix says so, then names the path that fits
    assert c.fix.startswith("no lower mem_fraction_static fits it")
    assert "no smaller chunk fits" in c.fix and "TileLang" in c.fix


def test_default_sm120_path_fits_1m_at_085_and_not_at_090(tmp_path: Path) -> None:
    """The default sm_120 path (the bundled Triton indexer, kernels on; TileLang, sglang's own
    default, sizes the same): unchunked 8 GiB of logits for an 8K chunk of a 1M request fits the
    13.9 GiB mfs 0.85 leaves; at 0.90 (9.2 GiB) the exact 8 GiB plus the estimates do not."""
    ok = _plan(tmp_path, **{"workload.longest_request_tokens": 1_048_576})
    assert "capacity.headroom" not in {c.id for c in ok.checks}
    tight = _plan(tmp_path, **{"workload.longest_request_tokens": 1_048_576,
                               "serving.mem_fraction_static": 0.90})
    c = next(c for c in tight.checks if c.id == "capacity.headroom" and c.subject == "prefill")
    assert c.numbers["largest_term"] == "indexer_logits" and c.numbers["largest_bytes"] == 8 * GIB
    assert c.severity == "warning"  # 8 GiB (exact) alone would fit; the estimates tip it


def test_check_names_both_ways_out_with_their_price(tmp_path: Path) -> None:
    # 32K-token chunks of a 128K request at mfs 0.93: one step's activations outgrow the headroom
    plan = _plan(tmp_path, **{"workload.longest_request_tokens": 131_072,
                              "topology.prefill.chunked_prefill_size": 32768,
                              "serving.mem_fraction_static": 0.93})
    c = next(c for c in plan.checks if c.id == "capacity.headroom" and c.subject == "prefill")
    assert c.severity == "warning"  # estimates tip it
    assert c.numbers["largest_term"] == "activations"
    assert "lower mem_fraction_static to 0." in c.fix and "tokens per rank instead of" in c.fix
    assert "set chunked_prefill_size to" in c.fix and "prefill steps instead of 4" in c.fix
    # the first way out really fits
    m = float(c.fix.split("lower mem_fraction_static to ")[1].split(" ")[0])
    fixed = _plan(tmp_path, **{"workload.longest_request_tokens": 131_072,
                               "topology.prefill.chunked_prefill_size": 32768,
                               "serving.mem_fraction_static": m})
    assert not [x for x in fixed.checks if x.id == "capacity.headroom" and x.subject == "prefill"]


def test_indexer_path_follows_the_env_render_writes(tmp_path: Path) -> None:
    """The indexer term models the function SGLang calls under the role's rendered env file
    (tests/parsers_real/test_indexer_path_vs_sglang.py runs SGLang's own dispatch on it): where
    the role's indexer takes the bundled path (kernels.indexer), render sets
    SGLANG_OPT_USE_TILELANG_INDEXER=0 and the hooked Triton indexer scores; on the engine's path
    (the default), sglang's sm_120 default (TileLang), unless the role's env turns TileLang off
    (the torch function)."""
    def detail(plan, role: str = "prefill") -> str:  # type: ignore[no-untyped-def]
        cap = next(c for c in plan.capacity if c.role == role)
        return cap.headroom_terms[-1].detail

    on = _plan(tmp_path, **{"kernels.indexer": "bundled"})
    for role in ("prefill", "decode"):
        assert detail(on, role).startswith("dsv4ctl's Triton indexer hooked in place of the torch")
    off = plan_from_paths(PROFILES / "default.yaml")
    assert detail(off).startswith("TileLang tilelang_fp8_paged_mqa_logits")
    torch_fn = _plan(tmp_path, **{"topology.prefill.env": {"SGLANG_OPT_USE_TILELANG_INDEXER": "0"}})
    assert detail(torch_fn).startswith("sm_120 torch function")
    assert detail(torch_fn, "decode").startswith("TileLang")  # only the prefill role's env says so


def test_kernels_own_the_tilelang_switch(tmp_path: Path) -> None:
    """With the bundled indexer, a role cannot turn TileLang back on behind it: the plan says
    which field to remove instead of rendering an engine that never calls the kernel."""
    plan = _plan(tmp_path, **{"kernels.indexer": "bundled",
                              "topology.prefill.env": {"SGLANG_OPT_USE_TILELANG_INDEXER": "1"}})
    [err] = [c for c in plan.checks if c.severity == "error"]
    assert err.id == "profile.env-reserved"
    assert err.field == "topology.prefill.env.SGLANG_OPT_USE_TILELANG_INDEXER"
    assert "kernels.indexer: bundled" in err.message and not plan.files
