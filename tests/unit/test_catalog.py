"""Tests of orchestrator.catalog: data provenance, hand-derived parameter/byte totals, sharding
rules, typed errors, engine rules, and that loading stays light (no torch/triton/fabric).

The expected numbers below are derived by hand from the model shapes in
shared/research/model-hw.md §1.1 (hidden 4096, 43 layers = 2 SWA + 21 C4 + 20 C128, 64 heads x
512, q_lora 1024, o_groups 8 x o_lora 1024, 256 experts x moe_intermediate 2048, vocab 129280,
index 64 x 128) and the module structure of sglang 0.5.23, independently of the YAML.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from orchestrator.catalog import (
    CatalogError,
    UnknownCatalogData,
    UnknownCatalogEntry,
    UnsupportedLayout,
    load_catalog,
)


def weight_bytes_total(*args, **kwargs):  # type: ignore[no-untyped-def]
    return load_catalog().weight_bytes_total(*args, **kwargs)


def weight_bytes_per_rank(*args, **kwargs):  # type: ignore[no-untyped-def]
    return load_catalog().weight_bytes_per_rank(*args, **kwargs)


def checkpoint_bytes(model):  # type: ignore[no-untyped-def]
    return load_catalog().checkpoint_bytes(model)

GIB = 2**30
FP8 = 1 + 1 / 4096  # 1 B + one F32 scale per 128x128 tile: 1 + 4/16384

# ---- hand-derived parameter counts (one line of arithmetic each) ----------------------------
EXPERTS_LAYER = 256 * 3 * 4096 * 2048  # 6,442,450,944
EXPERTS = 43 * EXPERTS_LAYER  # 277,025,390,592
WQ_A, WKV = 43 * 4096 * 1024, 43 * 4096 * 512  # replicated
WQ_B = 43 * 1024 * 64 * 512  # attn_tp
WO_A = 43 * (64 * 512 // 8) * (8 * 1024)  # attn_tp
WO_B = 43 * (8 * 1024) * 4096  # attn_tp
COMP_C4 = 21 * 4096 * (2 * 2 * 512)  # BF16, replicated
COMP_C128 = 20 * 4096 * (2 * 1 * 512)  # BF16, replicated
IDX_WQ_B = 21 * 1024 * 64 * 128  # FP8, replicated
IDX_WP = 21 * 4096 * 64  # BF16, replicated
IDX_COMP = 21 * 4096 * (2 * 2 * 128)  # BF16, replicated
SHARED = 43 * 3 * 4096 * 2048  # tp
GATE = 43 * 256 * 4096  # BF16, replicated
EMBED = HEAD = 129280 * 4096
SMALL = (
    43 * (2 * 24 * 16384 + 2 * 24 + 2 * 3 + 4096 + 4096 + 1024 + 512 + 64)  # hc, norms, sink
    + 21 * (4 * 1024 + 512 + 4 * 256 + 128)  # C4 compressor + indexer-compressor ape/norm
    + 20 * (128 * 512 + 512)  # C128 compressor ape/norm
    + 40 * 256  # e_score_correction_bias on non-hash layers
    + 3 * 129280 * 6  # tid2eid int32 on the 3 hash layers
    + 4096
    + 4 * 16384
    + 4
    + 1  # final norm + hc_head
)
MTP_EXPERTS = EXPERTS_LAYER
MTP_ATTN_REP = 4096 * 1024 + 4096 * 512
MTP_ATTN_TP = 1024 * 64 * 512 + 4096 * 8192 + 8192 * 4096
MTP_SHARED = 3 * 4096 * 2048
MTP_GATE = 256 * 4096
MTP_EH = 2 * 4096 * 4096
MTP_SMALL = 2 * 24 * 16384 + 2 * 24 + 2 * 3 + 9728 + 64 + 8192 + 4096 + 4 * 16384 + 5 + 256

MAIN_BIG = (
    EXPERTS
    + WQ_A
    + WKV
    + WQ_B
    + WO_A
    + WO_B
    + COMP_C4
    + COMP_C128
    + IDX_WQ_B
    + IDX_WP
    + IDX_COMP
    + SHARED
    + GATE
    + EMBED
    + HEAD
)
MTP_BIG = MTP_EXPERTS + MTP_ATTN_REP + MTP_ATTN_TP + MTP_SHARED + MTP_GATE + MTP_EH

# Bytes of everything but the routed experts, incl. MTP (same for all DeepSeek-layout variants):
DENSE_FP8 = (
    WQ_A + WKV + WQ_B + WO_A + WO_B + IDX_WQ_B + SHARED + MTP_ATTN_REP + MTP_ATTN_TP + MTP_SHARED + MTP_EH
)
BF16_PARAMS = COMP_C4 + COMP_C128 + IDX_WP + IDX_COMP + GATE + MTP_GATE + EMBED + HEAD
REST_BYTES = DENSE_FP8 * FP8 + 2 * BF16_PARAMS + 4 * (SMALL + MTP_SMALL)
ALL_EXPERTS = EXPERTS + MTP_EXPERTS


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


# ---------------------------------------------------------------- provenance of every number


def _data_files() -> list[tuple[str, object]]:
    root = resources.files("orchestrator.catalog").joinpath("data")
    out = []
    for rel in ("gpus.yaml", "quant.yaml", "models.yaml"):
        out.append((rel, yaml.safe_load(root.joinpath(rel).read_text("utf-8"))))
    for p in sorted(root.joinpath("engines").iterdir(), key=lambda p: p.name):
        if p.name.endswith(".yaml"):
            out.append((f"engines/{p.name}", yaml.safe_load(p.read_text("utf-8"))))
    return out


def _unsourced_numbers(node: object, path: str) -> list[str]:
    """Numbers that are not inside a mapping carrying `confidence` and `source` (or, for a
    known-bad rule, its `upstream` links)."""
    bad: list[str] = []
    if isinstance(node, dict):
        if "confidence" in node and ("source" in node or "upstream" in node):
            return []  # a sourced fact or rule: its values/conditions may be numbers
        for k, v in node.items():
            bad += _unsourced_numbers(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            bad += _unsourced_numbers(v, f"{path}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        bad.append(f"{path} = {node}")
    return bad


def _facts(node: object, path: str):
    if isinstance(node, dict):
        if "source" in node and "confidence" in node:
            yield path, node
        for k, v in node.items():
            yield from _facts(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _facts(v, f"{path}[{i}]")


def test_every_number_in_the_yaml_has_a_source():
    files = _data_files()
    assert len(files) >= 5
    bad = [b for rel, data in files for b in _unsourced_numbers(data, rel)]
    assert bad == []


def test_every_source_is_nonempty_and_confidence_valid():
    for rel, data in _data_files():
        for path, fact in _facts(data, rel):
            assert isinstance(fact["source"], str) and fact["source"].strip(), path
            assert fact["confidence"] in ("confirmed", "derived", "unconfirmed"), path


def test_derived_sources_show_their_arithmetic_or_origin():
    # A fact marked derived must say what it was derived from.
    for rel, data in _data_files():
        for path, fact in _facts(data, rel):
            if fact["confidence"] == "derived":
                assert len(fact["source"]) > 15, path


def test_unconfirmed_facts_carry_a_note_checks_can_quote():
    missing = []
    for rel, data in _data_files():
        for path, fact in _facts(data, rel):
            if fact["confidence"] == "unconfirmed" and not fact.get("note"):
                missing.append(path)
    assert missing == []


def test_every_engine_rule_upstream_link_is_a_url(cat):
    n = 0
    for eng in cat.engines:
        for kb in eng.known_bad:
            for url in kb.upstream:
                parsed = urlparse(url)
                assert parsed.scheme == "https" and parsed.netloc, (kb.id, url)
                n += 1
    assert n >= 10


# ---------------------------------------------------------------- loading is fast and light


def test_load_is_cached(cat):
    assert load_catalog() is cat


def test_loading_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys, time, json\n"
        "t = time.perf_counter()\n"
        "from orchestrator.catalog import load_catalog\n"
        "c = load_catalog()\n"
        "c.weight_bytes_per_rank('dsv4-flash-mxfp4', 'native', 8, 8, 1, True, False)\n"
        "dt = time.perf_counter() - t\n"
        "heavy = sorted(m for m in ('torch', 'triton', 'fabric', 'numpy', 'jinja2', 'click',"
        " 'paramiko', 'sglang') if m in sys.modules)\n"
        "print(json.dumps({'dt': dt, 'heavy': heavy}))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["heavy"] == []
    assert res["dt"] < 3.0, res  # measured ~0.2 s on the dev box (2 cores)


# ---------------------------------------------------------------- architecture and parameters


def test_config_of_variant(cat):
    cfg = cat.config_of("dsv4-flash-nvfp4")
    assert cfg.index_topk.value == 512 and cfg.num_attention_heads.value == 64
    assert cat.config_of(cat.model("dsv4-flash-mxfp4")) is cfg


def test_describe_lists_every_entry(cat):
    assert len(cat.describe("models")) == len(cat.variants)
    assert any("97887 MiB" in line for line in cat.describe("gpus"))
    assert cat.describe("engines") == ["sglang==0.5.23 (engine)", "sglang-router==0.3.2 (router)"]
    with pytest.raises(UnknownCatalogEntry):
        cat.describe("kernels")


def test_compress_ratio_schedule(cat):
    cfg = cat.architecture("dsv4-flash").config
    assert cfg.compress_ratios.value == [0, 0, 4] + [128, 4] * 20
    assert cfg.layer_ratio_counts() == {0: 2, 4: 21, 128: 20}
    assert cfg.head_dim.value == cfg.qk_nope_head_dim.value + cfg.qk_rope_head_dim.value == 512
    assert cfg.max_position_embeddings.value == 1_048_576


def test_group_params_match_hand_derivation(cat):
    a = cat.architecture("dsv4-flash")
    expected = {
        "routed_experts": EXPERTS,
        "attn_wq_a": WQ_A,
        "attn_wkv": WKV,
        "attn_wq_b": WQ_B,
        "attn_wo_a": WO_A,
        "attn_wo_b": WO_B,
        "compressor_c4": COMP_C4,
        "compressor_c128": COMP_C128,
        "indexer_wq_b": IDX_WQ_B,
        "indexer_weights_proj": IDX_WP,
        "indexer_compressor": IDX_COMP,
        "shared_experts": SHARED,
        "router_gate": GATE,
        "embed_tokens": EMBED,
        "lm_head": HEAD,
        "norms_hc": SMALL,
        "mtp_routed_experts": MTP_EXPERTS,
        "mtp_attn_replicated": MTP_ATTN_REP,
        "mtp_attn_wq_b_wo_b": 1024 * 64 * 512 + 8192 * 4096,
        "mtp_attn_wo_a": 4096 * 8192,
        "mtp_shared_experts": MTP_SHARED,
        "mtp_router_gate": MTP_GATE,
        "mtp_e_h_proj": MTP_EH,
        "mtp_norms_hc": MTP_SMALL,
    }
    assert {g.id: g.params.value for g in a.param_groups} == expected


def test_parameter_totals(cat):
    a = cat.architecture("dsv4-flash")
    big = [g for g in a.param_groups if g.kind != "small"]
    main = sum(g.params.value for g in big if g.module == "main")
    mtp = sum(g.params.value for g in big if g.module == "mtp")
    # 277.03B experts + 4.60B attention + 0.48B compressor/indexer + 1.08B shared + 0.05B gates
    # + 1.06B embed/head = 284,296,478,720 -> the model card's 284.3B (research §1.3).
    assert main == MAIN_BIG == 284_296_478_720
    # MTP: 6.44B experts + 0.107B attention + 25M shared + 1M gate + 33.5M e/h_proj.
    assert mtp == MTP_BIG == 6_609_174_528
    assert round((main + mtp) / 1e9, 1) == 290.9
    # Norms / hyper-connection mixers add ~39M (0.01 %).
    assert a.params(("main",)) == MAIN_BIG + SMALL == 284_334_567_511


# ---------------------------------------------------------------- weight totals


def test_quant_bytes_per_param(cat):
    assert float(cat.quant("mxfp4").bytes_per_param_exact) == (4 + 8 / 32) / 8 == 0.53125
    assert float(cat.quant("nvfp4").bytes_per_param_exact) == (4 + 8 / 16) / 8 == 0.5625
    assert float(cat.quant("int4_g128").bytes_per_param_exact) == (4 + 16 / 128) / 8
    assert float(cat.quant("fp8_block128").bytes_per_param_exact) == FP8
    assert float(cat.quant("bf16").bytes_per_param_exact) == 2
    for f in cat.formats:
        assert f.bits_per_param.value == pytest.approx(8 * f.bytes_per_param.value, rel=1e-12)


@pytest.mark.parametrize(
    ("variant", "expert_bpp", "extra", "research_gb"),
    [
        # research/model-hw.md §2 anchors (experts x B/param + ~1 B/param for the rest): its
        # totals treat compressors as FP8 and ignore FP32 mixers; this catalog holds compressors
        # as BF16 (sglang 0.5.23 loader) and counts them, hence +0.3-0.5 GB.
        ("dsv4-flash-mxfp4", 0.53125, 0, 159.1),
        ("dsv4-flash-nvfp4", 0.5625, 0, 167.9),
        ("dsv4-flash-fp8", FP8, 0, 292.0),
        # W4A16: shared experts BF16 per the canada-quant card: + (2 - FP8) B x shared params.
        ("dsv4-flash-w4a16", 0.515625, (2 - FP8) * (SHARED + MTP_SHARED), 154.7),
    ],
)
def test_weight_totals_with_mtp(variant, expert_bpp, extra, research_gb):
    expected = ALL_EXPERTS * expert_bpp + REST_BYTES + extra
    got = weight_bytes_total(variant, "native", include_mtp=True)
    assert got == pytest.approx(expected, abs=64)  # per-group ceil rounding only
    assert got / 1e9 == pytest.approx(research_gb, rel=0.015)


def test_weight_total_values_pinned():
    # The exact values the planner will print (hand sums above, rounded up per group).
    assert weight_bytes_total("dsv4-flash-mxfp4", "native", True) == 159_602_216_776
    assert weight_bytes_total("dsv4-flash-mxfp4", "native", False) == 156_008_354_652
    assert weight_bytes_total("dsv4-flash-nvfp4", "native", True) == 168_460_586_824


def test_expert_storage_options_change_only_experts():
    native = weight_bytes_total("dsv4-flash-mxfp4", "native", True)
    fp8 = weight_bytes_total("dsv4-flash-mxfp4", "fp8", True)
    bf16 = weight_bytes_total("dsv4-flash-mxfp4", "bf16", True)
    assert fp8 - native == pytest.approx(ALL_EXPERTS * (FP8 - 0.53125), abs=64)
    assert bf16 - native == pytest.approx(ALL_EXPERTS * (2 - 0.53125), abs=64)
    # design.md: "bf16 weights (~568 GB)" - BF16 experts + FP8/BF16 rest is ~576 GB.
    assert 560e9 < bf16 < 590e9


def test_checkpoint_bytes_and_consistency(cat):
    assert checkpoint_bytes("dsv4-flash-mxfp4") == 160_000_000_000
    assert checkpoint_bytes("dsv4-flash-0731-mxfp4") == 167_000_000_000
    # The FP8 size is derived from this catalog's own groups: must stay in sync.
    assert checkpoint_bytes("dsv4-flash-fp8") == weight_bytes_total("dsv4-flash-fp8", "native", True)
    # The DSpark estimate is the -0731 listing minus the main+MTP bytes: must stay in sync.
    v = cat.model("dsv4-flash-0731-mxfp4")
    assert v.dspark_bytes is not None and v.dspark_bytes.confidence == "unconfirmed"
    assert v.dspark_bytes.value == 167_000_000_000 - weight_bytes_total(v, "native", True)
    assert weight_bytes_total(v, "native", True, True) == 167_000_000_000


# ---------------------------------------------------------------- per-rank bytes


def test_per_rank_tp8_ep8_mxfp4_hand_derived():
    b = weight_bytes_per_rank(
        "dsv4-flash-mxfp4", "native", tp=8, ep=8, attn_dp=1, include_mtp=True, include_dspark=False
    )
    experts = ALL_EXPERTS // 8 * 0.53125  # 18,824,036,352
    attn_tp = (WQ_B + WO_A + WO_B + MTP_ATTN_TP) // 8 * FP8  # 553,783,296
    replicated_fp8 = (WQ_A + WKV + IDX_WQ_B + MTP_ATTN_REP + MTP_EH) * FP8  # 486,658,048
    replicated_bf16 = 2 * (COMP_C4 + COMP_C128 + IDX_WP + IDX_COMP + GATE + MTP_GATE)
    small = 4 * (SMALL + MTP_SMALL)
    shared = (SHARED + MTP_SHARED) // 8 * FP8
    vocab = 2 * (EMBED + HEAD) // 8
    expected = experts + attn_tp + replicated_fp8 + replicated_bf16 + small + shared + vocab
    assert b.total_bytes == pytest.approx(expected, abs=64)
    assert b.total_bytes == 21_135_000_392
    # research §4.5: "experts ~18.8 GB + non-expert share ... ~20-22 per GPU" (GB): 21.1 GB.
    assert 20e9 < b.total_bytes < 22e9
    assert 19.5 < b.total_gib < 22
    kinds = b.by_kind()
    assert kinds["routed_experts"] == 18_824_036_352
    assert sum(kinds.values()) == b.total_bytes


def test_sm120_runtime_override_holds_wo_a_as_bf16(cat):
    eng = cat.engine("sglang", "0.5.23")
    base = weight_bytes_per_rank("dsv4-flash-mxfp4", "native", 8, 8, 1, True, False)
    sm120 = weight_bytes_per_rank(
        "dsv4-flash-mxfp4", "native", 8, 8, 1, True, False, engine=eng, gpu_arch="sm_120"
    )
    sm90 = weight_bytes_per_rank(
        "dsv4-flash-mxfp4", "native", 8, 8, 1, True, False, engine=eng, gpu_arch="sm_90"
    )
    assert sm90.total_bytes == base.total_bytes
    wo_a_per_rank = (WO_A + 4096 * 8192) // 8
    assert sm120.total_bytes - base.total_bytes == pytest.approx(wo_a_per_rank * (2 - FP8), abs=8)


def test_ep1_tp_sliced_experts_equal_ep8_per_rank():
    a = weight_bytes_per_rank("dsv4-flash-nvfp4", "native", 8, 1, 1, True, False)
    b = weight_bytes_per_rank("dsv4-flash-nvfp4", "native", 8, 8, 1, True, False)
    assert a.total_bytes == b.total_bytes


def test_attention_dp_replicates_attention_and_embedding():
    dp1 = weight_bytes_per_rank("dsv4-flash-mxfp4", "native", 8, 8, 1, True, False)
    dp8 = weight_bytes_per_rank("dsv4-flash-mxfp4", "native", 8, 8, 8, True, False)
    attn_tp_full = (WQ_B + WO_A + WO_B + MTP_ATTN_TP) * FP8
    embed_full = 2 * EMBED
    grow = (attn_tp_full - attn_tp_full / 8) + (embed_full - embed_full / 8)
    assert dp8.total_bytes - dp1.total_bytes == pytest.approx(grow, abs=64)
    rows = {g.id: g for g in dp8.groups}
    assert rows["attn_wq_b"].divisor == 1 and rows["embed_tokens"].divisor == 1
    assert rows["lm_head"].divisor == 8 and rows["routed_experts"].divisor == 8


def test_pd_4_plus_4_bf16_experts_do_not_fit_but_fp4_does(cat):
    gpu = cat.gpu("rtx-pro-6000-se")
    bf16 = weight_bytes_per_rank("dsv4-flash-mxfp4", "bf16", 4, 4, 1, False, False)
    fp4 = weight_bytes_per_rank("dsv4-flash-mxfp4", "native", 4, 4, 1, False, False)
    assert bf16.total_bytes > gpu.memory_bytes  # ~139 GiB per rank > 95.6 GiB
    assert fp4.total_bytes < 0.5 * gpu.memory_bytes


def test_dspark_per_rank_is_flagged_unconfirmed():
    b = weight_bytes_per_rank("dsv4-flash-0731-mxfp4", "native", 8, 8, 1, True, True)
    rows = {g.id: g for g in b.groups}
    assert rows["dspark_module"].confidence == "unconfirmed"
    assert any(n.startswith("dspark:") and "unconfirmed" in n for n in b.unconfirmed)


# ---------------------------------------------------------------- errors, never guesses


def test_unknown_ids_raise_typed_keyerror_listing_known(cat):
    with pytest.raises(UnknownCatalogEntry) as ei:
        cat.gpu("rtx-9090")
    assert isinstance(ei.value, KeyError) and isinstance(ei.value, CatalogError)
    assert "rtx-pro-6000-se" in str(ei.value) and "rtx-9090" in str(ei.value)
    assert "rtx-pro-6000-se" in ei.value.known
    with pytest.raises(UnknownCatalogEntry) as ei:
        cat.model("dsv4-pro")
    assert "dsv4-flash-mxfp4" in str(ei.value)
    with pytest.raises(UnknownCatalogEntry) as ei:
        cat.engine("sglang", "0.5.22")
    assert "sglang==0.5.23" in str(ei.value)
    with pytest.raises(KeyError):
        weight_bytes_total("no-such-model")


def test_gpu_lookup_by_nvidia_smi_name(cat):
    assert cat.gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition").id == "rtx-pro-6000-se"
    assert cat.gpu("  nvidia   h200 ").id == "h200"
    se = cat.gpu("rtx-pro-6000-se")
    assert se.memory_mib.value == 97887 and se.arch == "sm_120" and not se.nvlink
    assert se.memory_bandwidth_gbps.value == 1597 and se.sm_count.value == 188
    assert se.smem_per_block_optin_bytes.value == 99 * 1024
    assert cat.gpu("h200").memory_mib.value == 143771
    assert cat.gpu("b200").memory_mib.value == 183359 and cat.gpu("b200").arch == "sm_100"
    assert cat.gpu("rtx-pro-6000-maxq").power_limit_w.value == 300


def test_requests_the_data_cannot_answer_raise(cat):
    with pytest.raises(UnknownCatalogData, match="DSpark"):
        weight_bytes_total("dsv4-flash-mxfp4", "native", True, include_dspark=True)
    with pytest.raises(UnknownCatalogData, match="nvfp4"):
        weight_bytes_total("dsv4-flash-nvfp4", "fp8", True)
    with pytest.raises(UnknownCatalogData, match="composition"):
        weight_bytes_total("dsv4-flash-0731-mxfp4", "fp8", True, include_dspark=True)
    no_mtp = cat.model("dsv4-flash-mxfp4").model_copy(update={"modules": ["main"]})
    with pytest.raises(UnknownCatalogData, match="MTP"):
        weight_bytes_total(no_mtp, "native", include_mtp=True)
    with pytest.raises(UnknownCatalogEntry):
        weight_bytes_total("dsv4-flash-mxfp4", "fp4")


@pytest.mark.parametrize(
    ("tp", "ep", "attn_dp", "match"),
    [
        (3, 3, 1, "must divide"),  # 64 heads / 3
        (8, 2, 1, "ep must be 1"),  # ep * moe_dp == tp with moe_dp 1
        (8, 8, 3, "does not divide tp"),
        (16, 16, 1, "o_groups"),  # 8 output groups / 16
        (0, 1, 1, "positive integer"),
    ],
)
def test_impossible_layouts_raise(tp, ep, attn_dp, match):
    with pytest.raises(UnsupportedLayout, match=match):
        weight_bytes_per_rank("dsv4-flash-mxfp4", "native", tp, ep, attn_dp, False, False)


def test_tp_sliced_int4_experts_must_align_to_groups():
    # 2048 / 32 = 64 columns per rank: not a multiple of the g128 INT4 group.
    with pytest.raises(UnsupportedLayout, match="scale block"):
        weight_bytes_per_rank("dsv4-flash-w4a16", "native", 32, 1, 4, False, False)


# ---------------------------------------------------------------- engine rules


def test_sglang_0_5_23_accepted_and_forced(cat):
    e = cat.engine("sglang", "0.5.23")
    assert e.accepts("index_topk", 512) and e.accepts("index_topk", 1024)
    assert not e.accepts("index_topk", 768)
    assert e.accepts("kv_cache_dtype", "fp8_e4m3") and e.accepts("kv_cache_dtype", "bfloat16")
    assert not e.accepts("kv_cache_dtype", "bf16")
    assert "normalised" in (e.accepted["kv_cache_dtype"].note or "")
    assert e.forced_for_v4["page_size"].value == 256
    assert e.forced_for_v4["swa_full_tokens_ratio"].value == 0.1
    assert e.forced_for_v4["max_running_requests_when_unset"].value == 256
    assert e.forced_for_v4["attention_backend"].value == "dsv4"
    assert e.accepted["speculative_algorithm"].values == ["EAGLE", "DSPARK"]
    assert e.parsers.reasoning == "deepseek-v4" and e.parsers.tool_call == "deepseekv4"
    assert e.ports["http"].value == 30000 and e.ports["disaggregation_bootstrap"].value == 8998
    assert all(flag.startswith("--") for flag in e.flags.knobs.values())
    assert e.flags.knobs["cuda_graph_max_bs_decode"] == "--cuda-graph-max-bs-decode"
    assert "--cuda-graph-max-bs" in e.flags.removed_or_deprecated


def test_moe_runner_paths_per_format_and_arch(cat):
    e = cat.engine("sglang", "0.5.23")
    d = e.default_moe_runner("mxfp4", "sm_120")
    assert d is not None and d.runner == "flashinfer_mxfp4" and d.path_kind == "tensor_core"
    d = e.default_moe_runner("nvfp4", "sm_120")
    assert d is not None and d.runner == "flashinfer_trtllm_routed" and d.path_kind == "unavailable"
    r = e.moe_runner("nvfp4", "sm_120", "flashinfer_cutlass")
    assert r is not None and r.path_kind == "tensor_core"
    assert e.moe_runner("mxfp4", "sm_120", "marlin").path_kind == "dequant_fallback"
    assert e.default_moe_runner("mxfp4", "sm_90").path_kind == "dequant_fallback"
    assert e.moe_path_cost["dequant_fallback"].decode_time_fraction.value == 0.39
    # every (expert format x arch) of a shipped variant on sm_120 has a known default
    for v in cat.variants:
        assert e.default_moe_runner(v.expert_format, "sm_120") is not None, v.id


def test_known_bad_matching(cat):
    e = cat.engine("sglang", "0.5.23")
    ids = {
        kb.id
        for kb in e.known_bad_matching({"arch": "sm_120", "expert_format": "mxfp4", "moe_runner": "marlin"})
    }
    assert "marlin-mxfp4-nan-sm120" in ids
    ids = {
        kb.id
        for kb in e.known_bad_matching({"arch": "sm_120", "expert_format": "nvfp4", "moe_runner": "auto"})
    }
    assert "nvfp4-auto-picks-trtllm-routed" in ids
    # FlashInfer's 8-heads prefill abort is a limit of the engine's path now (kernel_paths)
    (lim,) = [x for x in e.kernel_paths.limits if x.op == "attention"]
    assert lim.matches({"heads_per_attn_rank": 8, "rows_per_call": 8192})
    assert not lim.matches({"heads_per_attn_rank": 8, "rows_per_call": 64})
    assert not lim.matches({"heads_per_attn_rank": 16, "rows_per_call": 8192})
    assert {kb.id for kb in e.known_bad_matching({"expert_storage": "fp8", "moe_runner": "auto"})} == set()
    assert {kb.id for kb in e.known_bad_matching({"expert_storage": "fp8", "moe_runner": "triton"})} == {
        "fp4-dequant-needs-auto-runner"
    }
    # conditions whose facts are missing never match
    assert e.known_bad_matching({}) == []


def test_pd_backends_and_speculative(cat):
    e = cat.engine("sglang", "0.5.23")
    assert e.pd_backend("mooncake").needs == ["rdma"]
    assert e.pd_backend("mooncake_tcp").env == {"MC_FORCE_TCP": "1"}
    assert e.pd_backend("nixl").needs == []
    spec = {s.algorithm: s for s in e.speculative}
    assert spec["EAGLE"].constraints == {"speculative_eagle_topk": 1}
    assert spec["DSPARK"].requires_module == "dspark"


def test_router_rules(cat):
    r = cat.router("sglang-router", "0.3.2")
    assert r.ports["prometheus"].value == 29000
    assert r.defaults["health_check_endpoint"].value == "/health"
    assert r.policies.default == "cache_aware"
    with pytest.raises(UnknownCatalogEntry):
        cat.router("sglang-router", "9.9")
