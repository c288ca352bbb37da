"""Tests for orchestrator.planner.kvpool, the SGLang 0.5.23 DeepSeek-V4 KV-pool sizing model.

Every pinned number is derived by hand from the 0.5.23 sources, with the arithmetic in a comment
(``pool_configurator.py`` = ``sglang/srt/model_executor/pool_configurator.py``; ``pool.py`` =
``sglang/srt/mem_cache/deepseek_v4_memory_pool.py``). Property tests cover what must hold for
any input. The model was also cross-checked against sglang's own ``DSV4PoolConfigurator`` code
(3,000 random configurations, identical results; see docs/kvpool-sglang-0.5.23.md).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import DsvError
from orchestrator.planner.kvpool import (
    DSV4_FLASH_COMPRESS_RATIOS,
    KVPoolError,
    KVPoolInputs,
    bytes_per_full_token,
    fixed_bytes,
    indexer_bytes_per_token,
    paged_kv_bytes_per_token,
    pool_tokens,
    req_to_token_bytes,
    ring_sizes,
    size_pool,
    v4_page_bytes,
)

MIB = 1 << 20
GIB = 1 << 30
RTX_PRO_6000 = 97_887 * MIB  # 102,641,958,912 B
WEIGHTS = 21 * GIB  # 22,548,578,304 B, ~per rank at TP8/EP8 (research/model-hw.md §4.5)
FLASH = KVPoolInputs()  # V4-Flash defaults: FP8 KV, FP8 indexer, F32 state, r 0.1, no spec


# --- Entry and page sizes -----------------------------------------------------------------------


def test_v4_page_bytes_pad_to_576() -> None:
    # KVLayout.V4.page_bytes = ceil(n * 584 / 576) * 576 (kv_layout.py).
    # SWA page 256: 256*584 = 149,504 -> ceil(/576) = 260 -> 149,760 B = 585.0 B/entry.
    assert v4_page_bytes(256) == 149_760
    # c4 page 256/4 = 64: 64*584 = 37,376 -> 65 * 576 = 37,440 B = 585.0 B/entry.
    assert v4_page_bytes(64) == 37_440
    # c128 page 256/128 = 2: 2*584 = 1,168 -> 3 * 576 = 1,728 B = 864.0 B/entry.
    assert v4_page_bytes(2) == 1_728
    assert paged_kv_bytes_per_token(FLASH, 0) == 585.0
    assert paged_kv_bytes_per_token(FLASH, 4) == 585.0
    assert paged_kv_bytes_per_token(FLASH, 128) == 864.0


def test_indexer_entry_bytes() -> None:
    # get_dsv4_indexer_bytes_per_token (pool.py L53-57): FP8 128 + 128/128*4; FP4 128/2 + 128/32.
    assert indexer_bytes_per_token(128, fp4=False) == 132
    assert indexer_bytes_per_token(128, fp4=True) == 68


def test_ring_sizes() -> None:
    # get_compress_state_ring_size (pool.py L60-79).
    assert ring_sizes(FLASH) == {4: 8, 128: 128}
    eagle = KVPoolInputs(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    assert ring_sizes(eagle) == {4: 16, 128: 256}
    assert ring_sizes(KVPoolInputs(online_c128=True)) == {4: 8, 128: 1}


# --- Bytes per full-context token ---------------------------------------------------------------


def test_bpft_fp8_kv_fp8_indexer_f32_state_no_spec() -> None:
    b = bytes_per_full_token(FLASH)
    # L=43, n4=21, n128=20, r=0.1, page 256.
    assert b.swa_window_latent == pytest.approx(0.1 * 584 * 43)  # 2,511.2
    assert b.c4_state_ring == pytest.approx(0.1 * 8 / 256 * (2 * 2 * 512 * 4) * 21)  # 537.6
    assert b.c4_indexer_state_ring == pytest.approx(0.1 * 8 / 256 * (2 * 2 * 128 * 4) * 21)  # 134.4
    assert b.c4_latent == 584 / 4 * 21  # 3,066
    assert b.c4_indexer_keys == 132 / 4 * 21  # 693
    assert b.c128_latent == 584 / 128 * 20  # 91.25
    # Padding: SWA 0.1*(585-584)*43 = 4.3; c4 (585-584)/4*21 = 5.25; c128 (864-584)/128*20 = 43.75.
    assert b.page_padding == pytest.approx(53.3)
    assert b.speculative_reserve == 0.0
    # 2511.2 + 537.6 + 134.4 + 3066 + 693 + 91.25 + 53.3 = 7,086.75 (exact in binary: 28347/4).
    assert b.total == 7086.75
    assert sum(b.terms().values()) == pytest.approx(b.total)
    # Per SWA slot: 585*43 + 8/256*(8192+2048)*21 = 25,155 + 6,720 = 31,875.
    assert b.bytes_per_swa_token == 31_875.0


def test_bpft_fp4_indexer_is_budgeted_at_fp8_size_on_cuda() -> None:
    # pool_configurator.py L1109-1114: only HIP passes the FP4 flag to the byte count, so the
    # NVIDIA budget is unchanged (7,086.75); the pool still allocates 68 B entries.
    fp4 = KVPoolInputs(fp4_indexer=True)
    assert bytes_per_full_token(fp4).total == 7086.75
    full = 1 << 20
    fp8_alloc = size_independent_indexer_bytes(FLASH, full)
    fp4_alloc = size_independent_indexer_bytes(fp4, full)
    assert fp4_alloc * 132 == fp8_alloc * 68


def size_independent_indexer_bytes(x: KVPoolInputs, full: int) -> int:
    from orchestrator.planner.kvpool import pool_bytes

    return pool_bytes(x, pool_tokens(x, full)).c4_indexer


def test_bpft_bf16_state_halves_the_c4_rings() -> None:
    b = bytes_per_full_token(KVPoolInputs(compress_state_dtype="bfloat16"))
    # c4 rings 537.6 + 134.4 = 672 at 4 B -> 336 at 2 B: 7,086.75 - 336 = 6,750.75.
    assert b.total == pytest.approx(6750.75)


def test_bpft_eagle_and_dspark() -> None:
    eagle = KVPoolInputs(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    b = bytes_per_full_token(eagle)
    # Ring 16: c4 rings 0.1 * 16/256 * 10,240 * 21 = 1,344 (+672 over no-spec): base 7,758.75.
    # Draft reserve (L+1)/L = 44/43 (pool_configurator.py L1250-1257): 7,758.75*44/43 = 341,385/43.
    assert b.total == pytest.approx(341_385 / 43, rel=1e-12)  # 7,939.186...
    assert b.speculative_reserve == pytest.approx(7758.75 / 43, rel=1e-12)  # 180.436...
    assert b.spec_inflation == 44 / 43
    # DSpark block 5 verifies 6 tokens; the rings and the reserve are the same as EAGLE's.
    dspark = KVPoolInputs(speculative_algorithm="DSPARK", dspark_block_size=5)
    assert dspark.num_draft_tokens == 6
    assert bytes_per_full_token(dspark).total == b.total


def test_bpft_hisparse_shrinks_only_the_c4_latent() -> None:
    b = bytes_per_full_token(KVPoolInputs(hisparse_host_to_device_ratio=2))
    # c4 term (585/(4*2) + 132/4) * 21 = (73.125 + 33) * 21 = 2,228.625 instead of 3,764.25.
    assert b.total == pytest.approx(7086.75 - 3764.25 + 2228.625)  # 5,551.125


def test_compress_ratios_are_sliced_not_hardcoded() -> None:
    # The -0731 config appends DSpark entries (…, 4, 0, 0, 0): only the first 43 count.
    longer = KVPoolInputs(compress_ratios=(*DSV4_FLASH_COMPRESS_RATIOS, 0, 0, 0))
    assert bytes_per_full_token(longer).total == 7086.75
    # A 3-layer model [0, 0, 4]: 0.1*(585*3 + 8/256*10,240*1) + (585/4 + 33)*1
    # = 0.1*(1,755 + 320) + 179.25 = 386.75.
    tiny = KVPoolInputs(num_hidden_layers=3)
    assert bytes_per_full_token(tiny).total == pytest.approx(386.75)


# --- Fixed (request-scoped) bytes ---------------------------------------------------------------


def test_fixed_bytes_c128_state() -> None:
    # _get_c128_state_fixed_bytes (pool_configurator.py L1509-1528), 256 requests -> 257 slots:
    # rows = ceil((257*128 + 128 + 1) / 128) * 128 = ceil(33,025/128)*128 = 259*128 = 33,152;
    # bytes = 33,152 * (2*512) * 4 B * 20 layers = 2,715,811,840.
    f = fixed_bytes(FLASH)
    assert (f.num_req_slots, f.c128_state_rows, f.total) == (257, 33_152, 2_715_811_840)
    # BF16 state: half.
    assert fixed_bytes(KVPoolInputs(compress_state_dtype="bf16")).total == 1_357_905_920
    # Speculative ring 256: rows = ceil((257*256 + 257)/128)*128 = ceil(66,049/128)*128 = 66,176;
    # 66,176 * 4,096 * 20 = 5,421,137,920.
    eagle = KVPoolInputs(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    assert fixed_bytes(eagle).total == 5_421_137_920
    # Online c128: rows = (257 + 1 + 1) * (1 + 0) = 259, last dim 3*512: 259*6,144*20 = 31,825,920.
    assert fixed_bytes(KVPoolInputs(online_c128=True)).total == 31_825_920
    # DP attention 8: 256 // 8 = 32 requests per worker -> 33 slots:
    # rows = ceil((33*128 + 129)/128)*128 = 35*128 = 4,480 -> 4,480*4,096*20 = 367,001,600.
    assert fixed_bytes(KVPoolInputs(attn_dp_size=8)).total == 367_001_600


# --- Full sizing: 96 GB-class GPU, 21 GiB weights, mfs 0.85 -------------------------------------


def test_size_pool_rtx_pro_6000_21gib_mfs_085() -> None:
    s = size_pool(FLASH, RTX_PRO_6000, WEIGHTS, 0.85)
    assert s.fits and s.failure is None
    # pre = 102,641,958,912 B; avail = pre - 22,548,578,304 = 80,093,380,608 B.
    # rest = avail - pre*(1-0.85) = 0.85*102,641,958,912 - 22,548,578,304 = 64,697,086,771.2 B
    # -> int() = 64,697,086,771 (sglang does this in GiB floats; same integer here).
    assert s.available_after_load_bytes == 80_093_380_608
    assert s.budget_bytes == 64_697_086_771
    assert s.fixed_bytes == 2_715_811_840
    # (64,697,086,771 - 2,715,811,840) / 7,086.75 = 61,981,274,931 / 7,086.75 = 8,746,077.39
    # -> 8,746,077 // 256 = 34,164 pages -> 8,745,984 tokens.
    assert s.max_total_num_tokens == s.full_tokens == 8_745_984
    # swa = int(8,745,984 * 0.1) = 874,598 -> 3,416 pages = 874,496.
    assert s.swa_tokens == 874_496
    assert s.c4_tokens == 8_745_984 // 4 == 2_186_496
    assert s.c128_tokens == 8_745_984 // 128 == 68_328
    assert s.c4_state_slots == 3_416 * 8 == 27_328
    assert s.c128_state_slots == 257 * 128 == 32_896
    assert s.max_running_requests == 256
    pb = s.pool_bytes
    assert pb is not None
    # SWA: (874,496 + 256)/256 = 3,417 pages * 149,760 B * 43 layers = 22,004,386,560.
    assert pb.swa_kv == 3_417 * 149_760 * 43 == 22_004_386_560
    # c4: (2,186,496 + 256)/64 = 34,168 pages * 37,440 B * 21 = 26,864,248,320.
    assert pb.c4_kv == 34_168 * 37_440 * 21
    # c128: (68,328 + 256)/2 = 34,292 pages * 1,728 B * 20 = 1,185,131,520.
    assert pb.c128_kv == 34_292 * 1_728 * 20
    # Indexer: size 68,328*32 = 2,186,496 -> 34,168 pages * 64*132 B * 21 = 6,061,676,544.
    assert pb.c4_indexer == 34_168 * 64 * 132 * 21
    # c4 state rows ceil((27,328 + 8 + 1)/4)*4 = 27,340: core 27,340*2,048*4*21, indexer *512*4*21.
    assert pb.c4_state == 27_340 * 2_048 * 4 * 21
    assert pb.c4_indexer_state == 27_340 * 512 * 4 * 21
    assert pb.c128_state == 2_715_811_840
    assert pb.draft_swa_kv == 0
    # sglang allocates ~13 MB beyond its budget: one extra logical page per pool
    # (_num_dsv4_physical_kv_pages) and ring+1 state rows are not in the coefficient.
    assert s.unused_budget_bytes == s.budget_bytes - pb.total == -13_361_613
    # req_to_token: 257 rows * (1,048,576 + 4) * 4 B = 1,077,940,240 (outside the budget).
    assert s.req_to_token_bytes == 1_077_940_240
    assert s.headroom_bytes == 80_093_380_608 - pb.total - 1_077_940_240
    assert s.notes  # assumptions are always stated


def test_size_pool_eagle_reserves_and_allocates_a_draft_pool() -> None:
    eagle = KVPoolInputs(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    s = size_pool(eagle, RTX_PRO_6000, WEIGHTS, 0.85)
    # (64,697,086,771 - 5,421,137,920) / (341,385/43) = 59,275,948,851 * 43 / 341,385
    # = 7,466,250.1 -> 7,466,250 // 256 = 29,165 pages -> 7,466,240.
    assert s.full_tokens == 7_466_240
    pb = s.pool_bytes
    assert pb is not None
    # swa = int(746,624.0) -> 2,916 pages = 746,496. The draft worker allocates an SWA-only pool
    # of that size (2,916 + 1 pages) for its one layer.
    assert s.swa_tokens == 746_496
    assert pb.draft_swa_kv == (746_624 // 256 + 1) * 149_760
    # The (L+1)/L reserve (~1.35 GB) is far larger than the draft's real pool (~0.44 GB).
    assert s.unused_budget_bytes > 0


def test_world_size_float32_rounding_moves_at_most_one_page() -> None:
    one = size_pool(FLASH, RTX_PRO_6000, WEIGHTS, 0.85)
    eight = size_pool(FLASH, RTX_PRO_6000, WEIGHTS, 0.85, world_size=8)
    assert abs(one.full_tokens - eight.full_tokens) <= 256


def test_preload_used_bytes_shrinks_both_pre_and_slack() -> None:
    base = size_pool(FLASH, RTX_PRO_6000, WEIGHTS, 0.85)
    ctx = size_pool(FLASH, RTX_PRO_6000, WEIGHTS, 0.85, preload_used_bytes=GIB)
    # rest = mfs * (total - ctx) - weights: 1 GiB of context costs 0.85 GiB of budget.
    assert base.budget_bytes - ctx.budget_bytes == pytest.approx(0.85 * GIB, abs=2)


def test_max_total_tokens_caps_the_full_pool() -> None:
    s = size_pool(KVPoolInputs(max_total_tokens=1_000_000), RTX_PRO_6000, WEIGHTS, 0.85)
    # 1,000,000 // 256 = 3,906 pages -> 999,936.
    assert s.full_tokens == 999_936
    assert s.swa_tokens == 99_840  # int(99,993.6) = 99,993 -> 390 pages


def test_running_requests_capped_by_half_the_pool() -> None:
    # resolve_max_num_reqs: min(requested, full // 2).
    t = pool_tokens(KVPoolInputs(max_running_requests=4096), 4_096)
    assert t.running_requests_per_worker == 2_048


# --- Failures: sglang would refuse to start -----------------------------------------------------


def test_negative_rest_is_a_clear_zero_token_failure() -> None:
    # 80 GiB of weights on 95.6 GiB at mfs 0.8: rest = 0.8*95.59 - 80 < 0.
    s = size_pool(FLASH, RTX_PRO_6000, 80 * GIB, 0.8)
    assert not s.fits
    assert s.full_tokens == s.swa_tokens == s.max_total_num_tokens == 0
    assert s.pool_bytes is None and s.budget_bytes == 0
    assert s.failure is not None and "Loaded weights leave no GPU memory" in s.failure
    # sglang's own hint: 1 - avail/pre = 80 / 95.59 = 0.8369.
    assert s.min_mem_fraction_static == pytest.approx(80 * 1024 / 97_887)


def test_weights_larger_than_the_gpu_fail_cleanly() -> None:
    s = size_pool(FLASH, RTX_PRO_6000, 200 * GIB, 0.9)
    assert not s.fits and s.headroom_bytes == 0


def test_budget_below_fixed_bytes_is_the_swa_floor_error() -> None:
    # rest just above 0 but below the 2.7 GB c128 state: full = 0 -> swa = 0 <= 128 + 256.
    weights = int(0.85 * RTX_PRO_6000) - 1 * GIB
    s = size_pool(FLASH, RTX_PRO_6000, weights, 0.85)
    assert not s.fits
    assert s.failure is not None and "cannot hold even one request" in s.failure
    assert s.budget_bytes > 0 and s.full_tokens == 0


# --- Properties ---------------------------------------------------------------------------------

mfs_values = st.floats(min_value=0.05, max_value=1.0, allow_nan=False)
weights_gib = st.floats(min_value=0.0, max_value=120.0, allow_nan=False)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(a=mfs_values, b=mfs_values, w=weights_gib)
def test_monotone_in_mem_fraction_static(a: float, b: float, w: float) -> None:
    lo, hi = sorted((a, b))
    s_lo = size_pool(FLASH, RTX_PRO_6000, int(w * GIB), lo)
    s_hi = size_pool(FLASH, RTX_PRO_6000, int(w * GIB), hi)
    assert s_lo.full_tokens <= s_hi.full_tokens
    assert s_lo.budget_bytes <= s_hi.budget_bytes


configs = st.builds(
    KVPoolInputs,
    fp4_indexer=st.booleans(),
    compress_state_dtype=st.sampled_from(["float32", "bfloat16"]),
    swa_full_tokens_ratio=st.sampled_from([0.05, 0.1, 0.25, 1.0]),
    max_running_requests=st.sampled_from([1, 48, 64, 256]),
    attn_dp_size=st.sampled_from([1, 8]),
    hisparse_host_to_device_ratio=st.sampled_from([None, 2]),
)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(x=configs, mfs=mfs_values, w=weights_gib)
def test_sizing_invariants(x: KVPoolInputs, mfs: float, w: float) -> None:
    s = size_pool(x, RTX_PRO_6000, int(w * GIB), mfs)
    if not s.fits:
        assert s.failure and s.full_tokens == 0 and s.pool_bytes is None
        return
    bpft = bytes_per_full_token(x).total
    assert s.full_tokens % 256 == 0 and s.swa_tokens % 256 == 0
    assert s.swa_tokens > 128 + 256  # validate_swa_pool_size floor
    # The pool spends no more than the budget, and one more page would not fit.
    assert s.full_tokens * bpft + s.fixed_bytes <= s.budget_bytes
    assert (s.full_tokens + 256) * bpft + s.fixed_bytes > s.budget_bytes
    assert s.c4_tokens == s.full_tokens // (4 * (x.hisparse_host_to_device_ratio or 1))
    assert s.c128_tokens == s.full_tokens // 128
    assert 1 <= s.max_running_requests <= x.requested_running_requests_per_worker
    assert s.pool_bytes is not None and s.pool_bytes.total > 0


def test_sizing_is_deterministic() -> None:
    a = size_pool(FLASH, RTX_PRO_6000, WEIGHTS, 0.85)
    b = size_pool(FLASH, RTX_PRO_6000, WEIGHTS, 0.85)
    assert a == b


def test_req_to_token_speculative_columns() -> None:
    dspark = KVPoolInputs(speculative_algorithm="DSPARK", dspark_block_size=5, context_length=1000)
    # extra = max(4 + 6, 2*6 + 256 - 1) = 267; 257 rows * (1,000 + 267) * 4 B = 1,302,476.
    assert req_to_token_bytes(dspark, 256) == 257 * 1_267 * 4


# --- Input errors: what, value, why, fix --------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "what", "why_part"),
    [
        ({"kv_cache_dtype": "bfloat16"}, "kv_cache_dtype", "store_dtype == uint8"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype", "fp8_e4m3 or bfloat16"),
        ({"page_size": 128}, "page_size", "page_size == 256"),
        ({"swa_full_tokens_ratio": 0.0}, "swa_full_tokens_ratio", "(0, 1]"),
        ({"compress_ratios": (0, 2, 4), "num_hidden_layers": 3}, "compress_ratios", "V4.1"),
        ({"num_hidden_layers": 44}, "compress_ratios", "at least num_hidden_layers=44"),
        ({"qk_nope_head_dim": 512}, "qk_nope_head_dim/qk_rope_head_dim", "584"),
        ({"compress_state_dtype": "fp16"}, "compress_state_dtype", "float32/fp32"),
        ({"speculative_algorithm": "NGRAM"}, "speculative_algorithm", "EAGLE"),
        ({"speculative_algorithm": "EAGLE"}, "speculative_num_draft_tokens", "EAGLE topk 1"),
        ({"speculative_algorithm": "DSPARK"}, "dspark_block_size", "gamma"),
        ({"speculative_algorithm": "DSPARK", "dspark_block_size": 10},
         "speculative_num_draft_tokens", "serves at most 10"),
        ({"speculative_algorithm": "DSPARK", "dspark_block_size": 5,
          "speculative_num_draft_tokens": 5}, "speculative_num_draft_tokens", "gamma + 1"),
        ({"speculative_num_draft_tokens": 4}, "speculative_num_draft_tokens/dspark_block_size",
         "without a speculative algorithm"),
        ({"online_c128": True, "speculative_algorithm": "DSPARK", "dspark_block_size": 5},
         "online_c128", "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"),
        ({"hisparse_host_to_device_ratio": 0}, "hisparse_host_to_device_ratio", ">= 1"),
    ],
)
def test_bad_inputs_raise_clear_errors(
    changes: dict[str, object], what: str, why_part: str
) -> None:
    with pytest.raises(KVPoolError) as exc:
        dataclasses.replace(FLASH, **changes)
    err = exc.value
    assert isinstance(err, DsvError) and isinstance(err, ValueError)
    assert err.what == what
    assert why_part in err.why
    assert err.fix


def test_bad_sizing_arguments_raise_clear_errors() -> None:
    with pytest.raises(KVPoolError, match="mem_fraction_static"):
        size_pool(FLASH, RTX_PRO_6000, WEIGHTS, 1.5)
    with pytest.raises(KVPoolError, match="total_gpu_bytes"):
        size_pool(FLASH, 0, WEIGHTS, 0.85)
    with pytest.raises(KVPoolError, match="weight_bytes"):
        size_pool(FLASH, RTX_PRO_6000, -1, 0.85)
