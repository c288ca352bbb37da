"""SGLang 0.5.23 DeepSeek-V4(-Flash) KV-pool sizing, as a pure, exact, sourced model.

Owns the answer to "how many KV tokens will ``sglang serve`` allocate per GPU, and how much memory
is left outside ``--mem-fraction-static``" for the planner, without torch or a GPU. It reproduces,
in the same order of floating-point operations, what SGLang 0.5.23 does at startup on CUDA (sm_120):

1. ``KVCacheConfigurator._profile_available_bytes`` (``mem_cache/kv_cache_configurator.py``
   L2990-3060)::

       pre   = free GPU bytes right after torch.distributed init, before weights   [GiB float]
       avail = free GPU bytes after the weights (and draft weights) are loaded      [GiB float]
       rest  = avail - pre * (1 - mem_fraction_static) - 0 (mm reservation, text model)
       available_bytes = int(rest * 2**30)          # ValueError if rest <= 0

   Both free-memory reads are ``torch.cuda.mem_get_info`` MIN-reduced over all ranks through a
   float32 tensor when world_size > 1 (``utils/common.py::get_available_gpu_memory`` L427-577,
   ``distributed/bootstrap.py::measure_pre_model_load_memory`` L193-223). So "total" is *not* in
   the formula: ``pre = total - preload_used_bytes`` (CUDA context, NCCL, other processes).
2. ``DSV4PoolConfigurator.calculate_pool_sizes`` (``model_executor/pool_configurator.py``
   L1638-1701)::

       fixed = c128 compress-state ring bytes (per request slot)      # _get_c128_state_fixed_bytes
       full  = int(max(available_bytes - fixed, 0) / bytes_per_full_token) // page * page
       swa   = int(full * swa_full_tokens_ratio) // page * page          # ValueError if too small
       c4 = full // (4 * hisparse_ratio); c128 = full // 128; c4_state = swa // page * ring4

3. ``KVCacheConfigurator.resolve_max_num_reqs`` (L3119-3172): running requests per worker =
   ``min(max_running_requests // attn_dp_size, full // 2)``; then
   ``DSV4PoolConfigurator.finalize_with_max_running_requests`` sizes the c128 state pool.

Scope (anything else raises :class:`KVPoolError` instead of guessing): CUDA, the paged FlashMLA
``KVLayout.V4`` pool (``SGLANG_DSV4_KV_LAYOUT`` default ``v4``), V4-Flash compress ratios
{0, 4, 128}, no pipeline parallelism, ``--dsv4-attn-backend`` flashmla (trtllm is SM100-only), no
unified_kv (HIP-only), no encoder SWA replay (V4.1-only), ratio-mode SWA sizing (V4-Flash always:
``arg_groups/model_overrides/deepseek_v4.py`` declares ``swa_full_tokens_ratio=0.1`` before
``handle_cache_compatibility`` records it as explicit, so cap mode is unreachable),
``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING`` off (its default).

Every constant carries its source location (sglang 0.5.23 wheel paths; prefix ``python/`` on
GitHub). Assumptions that code cannot settle are listed in ``PoolSizing.notes``.

Past 400 lines on purpose: the arithmetic follows sglang's startup in order, each constant beside
its source line, so that ``tests/parsers_real/test_kvpool_vs_sglang.py`` can pin it term by term.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.errors import DsvError

SGLANG_VERSION = "0.5.23"

# --- Constants, each read in sglang 0.5.23 -------------------------------------------------------

#: Page size the V4 model override forces on CUDA; the DSV4 pool builder asserts it.
#: ``arg_groups/model_overrides/deepseek_v4.py::_deepseek_v4_overrides`` (``page_size = 256``) and
#: ``mem_cache/kv_cache_configurator.py::_build_dsv4_kv_pool`` L2070 (assert == 256).
DSV4_PAGE_SIZE = 256

#: ``--swa-full-tokens-ratio`` the V4 override declares when unset.
#: ``arg_groups/model_overrides/deepseek_v4.py`` and ``pool_configurator.py`` L1046.
DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO = 0.1

#: ``--max-running-requests`` the V4 hook declares when unset.
#: ``arg_groups/deepseek_v4_hook.py::apply_deepseek_v4_defaults``.
DSV4_DEFAULT_MAX_RUNNING_REQUESTS = 256

#: V4 latent entry = 448 fp8 nope + 64 bf16 rope (128 B) + 448/64 = 7 ue8m0 scales + 1 pad.
#: ``mem_cache/deepseek_v4_memory_pool.py::DeepSeekV4SingleKVPool.get_bytes_per_token`` L295-305,
#: asserted in ``create_buffer`` L311-318; ``kernels/ops/attention/dsv4/kv_layout.py``
#: ``KVLayout.V4``: data_bytes 576 + scale_bytes 8.
V4_ENTRY_BYTES = 584
#: FlashMLA TMA row stride the V4 page is padded to: ``kv_layout.py::KVLayout.page_align`` (V4: 576)
#: and ``KVLayout.page_bytes`` = ceil(page * 584 / 576) * 576 (also asserted in ``create_buffer``).
V4_PAGE_ALIGN = 576
#: Tokens per scale tile of the V4 nope part (``kv_layout.py::KVLayout.tile_size``, V4: 64).
V4_TILE = 64

#: Compress ratios of DeepSeek-V4-Flash's 43 layers: [0, 0, 4] + [128, 4] * 20 (config.json;
#: research/model-hw.md §1.2). The ``-0731`` revision appends DSpark entries: always slice.
DSV4_FLASH_COMPRESS_RATIOS: tuple[int, ...] = (0, 0, 4, *([128, 4] * 20))

#: The V4 hook asserts speculative decoding is one of these (``deepseek_v4_hook.py``).
SpecAlgorithm = Literal["EAGLE", "DSPARK"]
KVCacheDtype = Literal["fp8_e4m3", "bfloat16"]
StateDtype = Literal["float32", "bfloat16"]
DisaggMode = Literal["null", "prefill", "decode"]

_STATE_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2}


class KVPoolError(DsvError, ValueError):
    """Inputs the 0.5.23 model cannot size, or that sglang itself would reject at startup.

    The message says what was wrong, the value and why (with the sglang source location);
    ``fix`` says what to change. A ``ValueError`` too, for callers outside the CLI boundary.
    """

    def __init__(self, what: str, value: object, why: str, fix: str) -> None:
        self.what, self.value, self.why = what, value, why
        super().__init__(f"{what} = {value!r}: {why}", fix=fix)


# --- Inputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVPoolInputs:
    """Everything sglang 0.5.23 reads when it sizes the DeepSeek-V4 KV pool on one rank.

    Defaults are DeepSeek-V4-Flash under ``sglang serve`` with no overrides on CUDA: FP8 KV,
    FP32 compress state, ratio 0.1, page 256, 256 running requests, no speculation.
    """

    #: ``num_hidden_layers``; ``compress_ratios`` is sliced to it (never hardcode 43).
    num_hidden_layers: int = 43
    compress_ratios: tuple[int, ...] = DSV4_FLASH_COMPRESS_RATIOS
    #: ``head_dim - qk_rope_head_dim`` (``configs/model_config.py`` V4 branch) and rope dims.
    qk_nope_head_dim: int = 448
    qk_rope_head_dim: int = 64
    index_head_dim: int = 128
    #: ``sliding_window`` of config.json (``ModelConfig.window_size``).
    sliding_window: int = 128
    kv_cache_dtype: KVCacheDtype = "fp8_e4m3"
    #: ``--enable-deepseek-v4-fp4-indexer``.
    fp4_indexer: bool = False
    #: env ``SGLANG_DSV4_COMPRESS_STATE_DTYPE`` (default float32; ``environ.py`` L1832).
    compress_state_dtype: StateDtype = "float32"
    swa_full_tokens_ratio: float = DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO
    page_size: int = DSV4_PAGE_SIZE
    #: ``--max-running-requests`` (whole server; divided by ``attn_dp_size`` per worker).
    max_running_requests: int = DSV4_DEFAULT_MAX_RUNNING_REQUESTS
    attn_dp_size: int = 1
    speculative_algorithm: SpecAlgorithm | None = None
    #: ``--speculative-num-draft-tokens`` (EAGLE topk 1: num_steps + 1).
    speculative_num_draft_tokens: int | None = None
    #: ``--speculative-dspark-block-size`` (gamma); DSpark verifies gamma + 1 tokens.
    dspark_block_size: int | None = None
    #: Layers of the draft model's own KV pool (MTP: 1). Only changes the draft allocation
    #: estimate; sglang's reserve is always one layer's worth, (L + 1) / L.
    draft_num_layers: int = 1
    #: env ``SGLANG_OPT_USE_ONLINE_COMPRESS`` (c128 ring collapses to 1).
    online_c128: bool = False
    #: env ``SGLANG_EXPERIMENTAL_ONLINE_C128_MTP`` (online c128 + EAGLE only).
    online_c128_mtp: bool = False
    #: ``--enable-hisparse`` host_to_device_ratio (``mem_cache/sparsity/factory.py`` default 2);
    #: None = HiSparse off.
    hisparse_host_to_device_ratio: int | None = None
    disaggregation_mode: DisaggMode = "null"
    #: ``--disaggregation-decode-extra-slots`` as resolved (decode role only).
    disaggregation_decode_extra_slots: int = 0
    #: ``--context-length``: only sizes the req_to_token table (outside the KV budget).
    context_length: int = 1_048_576
    #: ``--max-total-tokens`` user cap (``_apply_token_constraints``), None = no cap.
    max_total_tokens: int | None = None

    def __post_init__(self) -> None:
        _validate(self)

    # Derived views -----------------------------------------------------------------------------
    @property
    def stage_ratios(self) -> tuple[int, ...]:
        """``cfg.compress_ratios[start:end]`` (pool_configurator.py L1118)."""
        return self.compress_ratios[: self.num_hidden_layers]

    @property
    def n_c4(self) -> int:
        return self.stage_ratios.count(4)

    @property
    def n_c128(self) -> int:
        return self.stage_ratios.count(128)

    @property
    def attn_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def num_draft_tokens(self) -> int:
        """``speculative_num_draft_tokens`` as the speculative hook resolves it; 0 = off."""
        if self.speculative_algorithm is None:
            return 0
        if self.speculative_algorithm == "DSPARK" and self.dspark_block_size is not None:
            return self.dspark_block_size + 1
        return self.speculative_num_draft_tokens or 0

    @property
    def state_dtype_bytes(self) -> int:
        return _STATE_DTYPE_BYTES[self.compress_state_dtype]

    @property
    def requested_running_requests_per_worker(self) -> int:
        """``max(1, max_running_requests // attn_dp_size)`` (pool_configurator.py L1141-1145)."""
        return max(1, self.max_running_requests // self.attn_dp_size)


def cuda_kv_dtype_refusal(dtype: str) -> tuple[str, str] | None:
    """``(why, fix)`` when a KV dtype the V4 argument check accepts still cannot start on CUDA.
    One owner: the pool model refuses it, and the static engine rules (what `validate` reports)
    and every fix that offers a dtype ask here, so no fix names a dtype that fails startup."""
    if dtype != "bfloat16":
        return None
    return ("on CUDA 0.5.23 has no BF16 V4 pool: DSV4PoolConfigurator budgets the 584-B FP8 "
            "entry whatever the dtype (pool_configurator.py L1108) while "
            "DeepSeekV4SingleKVPool.create_buffer asserts store_dtype == uint8 "
            "(deepseek_v4_memory_pool.py L321), which a bfloat16 pool is not, so startup fails; "
            "BF16 V4 KV exists only on NPU and in HIP's unified_kv (1024 B/row, "
            "dsv4_unified_row_bytes)", "use kv_cache_dtype fp8_e4m3")


def _need(ok: bool, what: str, value: object, why: str, fix: str) -> None:
    if not ok:
        raise KVPoolError(what, value, why, fix)


def _validate(x: KVPoolInputs) -> None:
    _need(x.num_hidden_layers >= 1, "num_hidden_layers", x.num_hidden_layers,
          "a model has at least one layer", "read num_hidden_layers from config.json")
    _need(len(x.compress_ratios) >= x.num_hidden_layers, "compress_ratios", x.compress_ratios,
          f"needs at least num_hidden_layers={x.num_hidden_layers} entries",
          "pass the full compress_ratios list of config.json")
    bad = sorted({r for r in x.stage_ratios if r not in (0, 4, 128)})
    _need(not bad, "compress_ratios", bad,
          "only ratios 0/4/128 (DeepSeek-V4-Flash) are modelled; 1/2 are V4.1 kv_source layers and "
          "others are rejected by deepseek_v4_memory_pool.py::collect_sources_by_ratio",
          "use a V4-Flash config, or extend the model for V4.1 low-ratio pools")
    entry = x.qk_nope_head_dim + 2 * x.qk_rope_head_dim + x.qk_nope_head_dim // V4_TILE + 1
    _need(entry == V4_ENTRY_BYTES, "qk_nope_head_dim/qk_rope_head_dim",
          (x.qk_nope_head_dim, x.qk_rope_head_dim),
          f"the V4 layout entry would be {entry} B; DeepSeekV4SingleKVPool.create_buffer asserts "
          f"{V4_ENTRY_BYTES} B (448 fp8 + 64 bf16 rope + 8 B scales)",
          "use head_dim 512 and qk_rope_head_dim 64 (DeepSeek-V4)")
    _need(x.index_head_dim > 0 and x.index_head_dim % 128 == 0, "index_head_dim", x.index_head_dim,
          "the FP8 indexer stores one fp32 scale per 128 values "
          "(deepseek_v4_memory_pool.py::get_dsv4_indexer_bytes_per_token)",
          "use config.json's index_head_dim (128)")
    _need(x.sliding_window >= 1, "sliding_window", x.sliding_window, "must be positive",
          "use config.json's sliding_window (128)")
    _need(x.kv_cache_dtype in ("fp8_e4m3", "bfloat16"), "kv_cache_dtype", x.kv_cache_dtype,
          "arg_groups/overrides.py::_deepseek_v4_kv_cache_dtype asserts fp8_e4m3 or bfloat16",
          "use fp8_e4m3 (what 'auto' resolves to)")
    refusal = cuda_kv_dtype_refusal(x.kv_cache_dtype)
    _need(refusal is None, "kv_cache_dtype", x.kv_cache_dtype, *(refusal or ("", "")))
    _need(x.compress_state_dtype in _STATE_DTYPE_BYTES, "compress_state_dtype",
          x.compress_state_dtype,
          "pool_configurator.py::_get_dsv4_compress_state_dtype_sizes accepts float32/fp32/"
          "bfloat16/bf16 only", "use float32 (default) or bfloat16")
    _need(0 < x.swa_full_tokens_ratio <= 1, "swa_full_tokens_ratio", x.swa_full_tokens_ratio,
          "kv_cache_hook.py::handle_cache_compatibility requires (0, 1]",
          "use 0.1 (the V4 default)")
    _need(x.page_size == DSV4_PAGE_SIZE, "page_size", x.page_size,
          "the V4 override forces 256 and kv_cache_configurator.py::_build_dsv4_kv_pool L2070 "
          "asserts page_size == 256 on CUDA", "use 256")
    _need(x.max_running_requests >= 1, "max_running_requests", x.max_running_requests,
          "must be positive", "use 256 (the V4 default) or the planned concurrency")
    _need(x.attn_dp_size >= 1, "attn_dp_size", x.attn_dp_size, "must be positive",
          "use 1 or tp_size")
    _need(x.draft_num_layers >= 1, "draft_num_layers", x.draft_num_layers, "must be positive",
          "use 1 (MTP)")
    _need(x.context_length >= 1, "context_length", x.context_length, "must be positive",
          "use the --context-length to be served")
    _need(x.max_total_tokens is None or x.max_total_tokens >= 1, "max_total_tokens",
          x.max_total_tokens, "a token cap must be positive", "omit it or pass a positive cap")
    _need(x.disaggregation_mode in ("null", "prefill", "decode"), "disaggregation_mode",
          x.disaggregation_mode, "sglang accepts null/prefill/decode", "use one of them")
    _need(x.disaggregation_decode_extra_slots >= 0, "disaggregation_decode_extra_slots",
          x.disaggregation_decode_extra_slots, "must be >= 0", "use 0")
    h = x.hisparse_host_to_device_ratio
    _need(h is None or (isinstance(h, int) and h >= 1), "hisparse_host_to_device_ratio", h,
          "pool_configurator.py L1156 asserts c4_shrink_factor >= 1", "omit it or pass an int >= 1")
    _validate_spec(x)


def _validate_spec(x: KVPoolInputs) -> None:
    algo = x.speculative_algorithm
    _need(algo in (None, "EAGLE", "DSPARK"), "speculative_algorithm", algo,
          "deepseek_v4_hook.py::apply_deepseek_v4_defaults allows only EAGLE (topk 1) or DSPARK",
          "use EAGLE or DSPARK, or None")
    if algo is None:
        _need(x.speculative_num_draft_tokens is None and x.dspark_block_size is None,
              "speculative_num_draft_tokens/dspark_block_size",
              (x.speculative_num_draft_tokens, x.dspark_block_size),
              "draft sizes without a speculative algorithm are ignored by sglang and signal a typo",
              "set speculative_algorithm or drop the draft sizes")
    elif algo == "EAGLE":
        _need(x.speculative_num_draft_tokens is not None and x.speculative_num_draft_tokens >= 2,
              "speculative_num_draft_tokens", x.speculative_num_draft_tokens,
              "EAGLE topk 1 verifies num_steps + 1 >= 2 tokens; the c4/c128 ring sizes depend on "
              "it (deepseek_v4_memory_pool.py::resolve_compress_state_ring_size)",
              "pass the resolved --speculative-num-draft-tokens")
        _need(x.dspark_block_size is None, "dspark_block_size", x.dspark_block_size,
              "only DSpark has a block size", "drop it for EAGLE")
    else:
        _need(x.dspark_block_size is not None or x.speculative_num_draft_tokens is not None,
              "dspark_block_size", None,
              "the DSpark verify window (gamma + 1) sizes the rings; sglang reads gamma from the "
              "draft checkpoint (default 7, speculative/dspark_components/dspark_config.py), which "
              "a pure planner cannot", "pass --speculative-dspark-block-size explicitly")
        if x.dspark_block_size is not None:
            _need(x.dspark_block_size >= 1, "dspark_block_size", x.dspark_block_size,
                  "speculative_hook.py::_handle_dspark requires a positive block size", "use 5-7")
            _need(x.speculative_num_draft_tokens in (None, x.dspark_block_size + 1),
                  "speculative_num_draft_tokens", x.speculative_num_draft_tokens,
                  "speculative_hook.py::_handle_dspark requires num_draft_tokens == gamma + 1",
                  f"use {x.dspark_block_size + 1} or omit it")
        _need(x.num_draft_tokens >= 2, "speculative_num_draft_tokens", x.num_draft_tokens,
              "speculative_hook.py::_handle_dspark requires >= 2 (gamma + 1)", "use gamma + 1")
    if algo is not None:
        # DSV4PoolConfigurator._assert_ring_serves_draft_tokens (pool_configurator.py L1291-1307):
        # a ring of R slots over a window W serves at most R - W + 2 drafts
        # (deepseek_v4_memory_pool.py::get_compress_state_write_pad L118-122).
        rings = ring_sizes(x)
        for ratio, n_layers in ((4, x.n_c4), (128, x.n_c128)):
            if n_layers == 0 or (ratio == 128 and x.online_c128):
                continue
            window = ratio * (2 if ratio == 4 else 1)
            ring = rings[ratio]
            pad = ring - window + 2 if ring > window else 0
            _need(x.num_draft_tokens <= pad, "speculative_num_draft_tokens", x.num_draft_tokens,
                  f"the c{ratio} compress-state ring ({ring} slots) serves at most {pad} draft "
                  "tokens (pool_configurator.py::_assert_ring_serves_draft_tokens)",
                  f"use at most {pad} draft tokens (DSpark block size <= {pad - 1})")
    if x.online_c128 and algo is not None:
        _need(algo == "EAGLE" and x.online_c128_mtp, "online_c128", x.online_c128,
              "SGLANG_OPT_USE_ONLINE_COMPRESS does not support speculative decoding except EAGLE "
              "with SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=1 (pool_configurator.py L1260-1270)",
              "turn online c128 off, or use EAGLE with online_c128_mtp")


# --- Per-token and fixed bytes --------------------------------------------------------------------


def ring_sizes(x: KVPoolInputs) -> dict[int, int]:
    """Compress-state ring rows per request, by ratio.

    ``deepseek_v4_memory_pool.py::get_compress_state_ring_size`` L60-79: c4 8 (16 when speculative),
    c128 128 (256 when speculative; 1 with online c128). "Speculative" means a positive
    ``speculative_num_draft_tokens`` (``resolve_compress_state_ring_size`` L82-91).
    """
    spec = x.num_draft_tokens > 0
    return {
        4: 16 if spec else 8,
        128: 1 if x.online_c128 else (256 if spec else 128),
    }


def v4_page_bytes(page_tokens: int) -> int:
    """Bytes of one V4-layout page: ``KVLayout.page_bytes`` = ceil(n * 584 / 576) * 576."""
    return -(-page_tokens * V4_ENTRY_BYTES // V4_PAGE_ALIGN) * V4_PAGE_ALIGN


def paged_kv_bytes_per_token(x: KVPoolInputs, compress_ratio: int = 0) -> float:
    """``DSV4PoolConfigurator._get_paged_kv_bytes_per_token`` (pool_configurator.py L1353-1370).

    SWA pages hold ``page_size`` tokens, a ratio-r pool ``page_size // r``: 256 → 585.0 B,
    64 (c4) → 585.0 B, 2 (c128) → 864.0 B per stored entry.
    """
    page = x.page_size // compress_ratio if compress_ratio else x.page_size
    return v4_page_bytes(page) / page


def indexer_bytes_per_token(index_head_dim: int, fp4: bool) -> int:
    """``get_dsv4_indexer_bytes_per_token`` (deepseek_v4_memory_pool.py L53-57).

    FP8: 128 + 128/128 * 4 = 132 B; FP4: 128/2 + 128/32 = 68 B.
    """
    if fp4:
        return index_head_dim // 2 + index_head_dim // 32
    return index_head_dim + index_head_dim // 128 * 4


@dataclass(frozen=True)
class BytesPerFullToken:
    """One full-context token's share of every pool, per rank, in bytes (floats, as in sglang).

    The seven terms sum to ``total`` (up to float rounding); ``total`` itself is computed in
    sglang's exact operation order and is what the sizing divides by.
    """

    swa_window_latent: float  #: r_swa * 584 * L
    c4_state_ring: float  #: r_swa * ring4/page * (2*2*head_dim*dt) * n4
    c4_indexer_state_ring: float  #: r_swa * ring4/page * (2*2*index_head_dim*dt) * n4
    c4_latent: float  #: 584 / (4 * hisparse) * n4
    c4_indexer_keys: float  #: indexer_bytes / 4 * n4 (FP8 size on CUDA even with FP4 on)
    c128_latent: float  #: 584 / 128 * n128
    page_padding: float  #: the 576-B page rounding on top of 584 B entries
    speculative_reserve: float  #: (L+1)/L - 1 of the rest (draft worker), 0 without spec
    total: float
    #: Bytes one SWA slot costs across the stage (``_get_bytes_per_swa_token``), inflated too.
    bytes_per_swa_token: float
    spec_inflation: float

    def terms(self) -> dict[str, float]:
        """The breakdown in a stable order (for rendering)."""
        return {
            "swa_window_latent": self.swa_window_latent,
            "c4_state_ring": self.c4_state_ring,
            "c4_indexer_state_ring": self.c4_indexer_state_ring,
            "c4_latent": self.c4_latent,
            "c4_indexer_keys": self.c4_indexer_keys,
            "c128_latent": self.c128_latent,
            "page_padding": self.page_padding,
            "speculative_reserve": self.speculative_reserve,
        }


def bytes_per_full_token(x: KVPoolInputs) -> BytesPerFullToken:
    """``DSV4PoolConfigurator.bytes_per_full_token`` (pool_configurator.py L1246-1257, L1372-1446).

    ::

        bpst = P(0) * L + ring4/page * (2*2*512*dt + 2*2*128*dt) * n4          # per SWA slot
        bpft = r_swa * bpst + (P(4)/(4*h) + idx/4) * n4 + P(128)/128 * n128
        bpft, bpst *= (L + 1) / L   if speculative (reserves one draft layer)

    with P(r) = 576-padded page bytes / tokens per page, idx = 132 on CUDA (the configurator keeps
    the FP8 estimate even with ``--enable-deepseek-v4-fp4-indexer``: only HIP passes the FP4 flag,
    L1109-1114), h = HiSparse host_to_device_ratio (1 when off).
    """
    n_layers, n4, n128 = len(x.stage_ratios), x.n_c4, x.n_c128
    ring4 = ring_sizes(x)[4] if n4 else 0
    dt = x.state_dtype_bytes
    c4_state = 2 * 2 * x.attn_head_dim * dt  # L1380 (overlap c4: 2 * (1 + 1) * head_dim)
    c4_idx_state = 2 * 2 * x.index_head_dim * dt  # L1381
    c4_state_ratio = ring4 / x.page_size  # L1383
    p0 = paged_kv_bytes_per_token(x, 0)
    p4 = paged_kv_bytes_per_token(x, 4)
    p128 = paged_kv_bytes_per_token(x, 128)
    shrink = x.hisparse_host_to_device_ratio or 1
    idx = indexer_bytes_per_token(x.index_head_dim, fp4=False)  # CUDA: FP8 estimate (L1109-1114)
    r = x.swa_full_tokens_ratio

    # Exact sglang order: _get_bytes_per_swa_token, then _get_bytes_per_full_token.
    bpst = p0 * n_layers + (c4_state_ratio * (c4_state + c4_idx_state) * n4)
    per_ratio: list[float] = []
    if n4:  # collect_sources_by_ratio iterates (4, 128, 1, 2)
        c4_frac = 1 / (4 * shrink)
        per_ratio.append((c4_frac * p4 + 1 / 4 * idx) * n4)
    if n128:
        per_ratio.append(1 / 128 * p128 * n128)
    bpft = r * bpst + sum(per_ratio)
    infl = 1.0
    if x.speculative_algorithm is not None:
        infl = (n_layers + 1) / n_layers  # L1250-1257: draft_layers = 1
        bpft *= infl
        bpst *= infl

    base = V4_ENTRY_BYTES
    c4_frac = 1 / (4 * shrink)
    padding = r * (p0 - base) * n_layers + c4_frac * (p4 - base) * n4 + (p128 - base) / 128 * n128
    uninflated = bpft / infl
    return BytesPerFullToken(
        swa_window_latent=r * base * n_layers,
        c4_state_ring=r * c4_state_ratio * c4_state * n4,
        c4_indexer_state_ring=r * c4_state_ratio * c4_idx_state * n4,
        c4_latent=c4_frac * base * n4,
        c4_indexer_keys=idx / 4 * n4,
        c128_latent=base / 128 * n128,
        page_padding=padding,
        speculative_reserve=bpft - uninflated,
        total=bpft,
        bytes_per_swa_token=bpst,
        spec_inflation=infl,
    )


def num_req_slots(x: KVPoolInputs, running_requests_per_worker: int) -> int:
    """``DSV4PoolConfigurator._get_num_req_slots`` (L1504-1507): requests + 1 (+ decode extras)."""
    extra = x.disaggregation_decode_extra_slots if x.disaggregation_mode == "decode" else 0
    return running_requests_per_worker + extra + 1


@dataclass(frozen=True)
class FixedBytes:
    """Request-scoped bytes subtracted before dividing by bytes_per_full_token (the "bias")."""

    c128_state: int  #: ``_get_c128_state_fixed_bytes`` (L1509-1528)
    c128_state_rows: int
    num_req_slots: int
    #: c2 state, encoder-replay window, cap-mode SWA, unified rings: all 0 for V4-Flash on CUDA.
    other: int
    total: int


def fixed_bytes(x: KVPoolInputs, running_requests_per_worker: int | None = None) -> FixedBytes:
    """Fixed (per-request-slot) bytes of ``calculate_pool_sizes`` (pool_configurator.py L1647-1666).

    Offline c128 (default): rows = ceil((slots * ring + ring + 1) / 128) * 128, each
    2 * head_dim * dt bytes, per c128 layer. Online c128: rows = (slots + 1 + 1) * (1 + mtp drafts),
    each 3 * head_dim * dt. ``slots`` uses the *requested* running requests per worker (the
    configurator runs before ``resolve_max_num_reqs`` caps it).
    """
    reqs = (
        x.requested_running_requests_per_worker
        if running_requests_per_worker is None
        else running_requests_per_worker
    )
    slots = num_req_slots(x, reqs)
    if x.n_c128 == 0:
        return FixedBytes(0, 0, slots, 0, 0)
    ring = ring_sizes(x)[128]
    if x.online_c128:
        mtp = x.num_draft_tokens if (x.online_c128_mtp and x.speculative_algorithm) else 0
        rows = (slots + ring + 1) * (1 + mtp)
        last_dim = 3 * x.attn_head_dim
    else:
        rows = -(-(slots * ring + ring + 1) // 128) * 128
        last_dim = 2 * x.attn_head_dim
    c128 = rows * last_dim * x.state_dtype_bytes * x.n_c128
    return FixedBytes(c128, rows, slots, 0, c128)


# --- Pool token counts and allocated bytes --------------------------------------------------------


@dataclass(frozen=True)
class PoolTokens:
    """``_compute_dsv4_sizes`` + ``finalize_with_max_running_requests`` (L1463-1502, L1622-1636)."""

    full: int  #: max_total_num_tokens (page-aligned)
    swa: int
    c4: int
    c128: int
    c4_state_slots: int
    c128_state_slots: int
    running_requests_per_worker: int


@dataclass(frozen=True)
class PoolBytes:
    """Bytes the pools really allocate (pool constructors), by pool, per rank."""

    swa_kv: int
    c4_kv: int
    c128_kv: int
    c4_indexer: int
    c4_state: int
    c4_indexer_state: int
    c128_state: int
    #: The draft worker's own SWA-only pool (spec only): ratios all 0, same swa size.
    draft_swa_kv: int

    @property
    def total(self) -> int:
        return (self.swa_kv + self.c4_kv + self.c128_kv + self.c4_indexer + self.c4_state
                + self.c4_indexer_state + self.c128_state + self.draft_swa_kv)

    def as_dict(self) -> dict[str, int]:
        return {
            "swa_kv": self.swa_kv, "c4_kv": self.c4_kv, "c128_kv": self.c128_kv,
            "c4_indexer": self.c4_indexer, "c4_state": self.c4_state,
            "c4_indexer_state": self.c4_indexer_state, "c128_state": self.c128_state,
            "draft_swa_kv": self.draft_swa_kv,
        }


def pool_tokens(x: KVPoolInputs, full_tokens: int) -> PoolTokens:
    """Token counts of every pool for a full-pool size (floored to a page, like sglang)."""
    page = x.page_size
    full = max(full_tokens, 0) // page * page
    swa = int(full * x.swa_full_tokens_ratio) // page * page  # L1457-1461
    shrink = x.hisparse_host_to_device_ratio or 1
    rings = ring_sizes(x)
    reqs = min(x.requested_running_requests_per_worker, full // 2)  # resolve_max_num_reqs L3129
    slots = num_req_slots(x, reqs)
    # finalize_with_max_running_requests L1626-1630: ring_sizes.get(128, 0) is 0 without c128
    # layers, but the online branch sets the slot count regardless.
    c128_state = slots if x.online_c128 else (slots * rings[128] if x.n_c128 else 0)
    return PoolTokens(
        full=full,
        swa=swa,
        # L1492-1493: set whatever the stage owns (a stage without the ratio allocates 0 layers).
        c4=full // (4 * shrink),
        c128=full // 128,
        c4_state_slots=swa // page * rings[4] if x.n_c4 else 0,
        c128_state_slots=c128_state,
        running_requests_per_worker=reqs,
    )


def _pages(size: int, page: int, global_page: int) -> int:
    """``_num_dsv4_physical_kv_pages`` (deepseek_v4_memory_pool.py L166-171): +1 logical page."""
    return -(-(size + global_page) // page)


def pool_bytes(x: KVPoolInputs, t: PoolTokens) -> PoolBytes:
    """What ``DeepSeekV4TokenToKVPool.__init__`` allocates for these token counts (CUDA, V4 layout).

    SWA/c4/c128: ``DeepSeekV4SingleKVPool._create_buffers`` (pages of ``KVLayout.page_bytes``);
    indexer: ``DeepSeekV4IndexerPool._create_buffer`` with size ``c128 * 32``
    (``c4_logical_size``, deepseek_v4_memory_pool.py L1000) and the real FP8/FP4 width; state:
    ``CompressStatePool`` rows = ceil((size + ring + 1) / ratio) * ratio
    (deepseek_v4_compress_state.py L159-179).
    """
    page, n_layers, n4, n128 = x.page_size, len(x.stage_ratios), x.n_c4, x.n_c128
    dt = x.state_dtype_bytes
    rings = ring_sizes(x)
    swa_layer = _pages(t.swa, page, page) * v4_page_bytes(page)
    swa_kv = swa_layer * n_layers
    c4_kv = c4_idx = c4_state = c4_idx_state = 0
    if n4:
        p4 = page // 4
        c4_kv = _pages(t.c4, p4, page) * v4_page_bytes(p4) * n4
        idx_bytes = indexer_bytes_per_token(x.index_head_dim, x.fp4_indexer)
        c4_idx = _pages(t.c128 * 32, p4, page) * p4 * idx_bytes * n4
        rows4 = -(-(t.c4_state_slots + rings[4] + 1) // 4) * 4
        c4_state = rows4 * 4 * x.attn_head_dim * dt * n4
        c4_idx_state = rows4 * 4 * x.index_head_dim * dt * n4
    c128_kv = c128_state = 0
    if n128:
        p128 = page // 128
        c128_kv = _pages(t.c128, p128, page) * v4_page_bytes(p128) * n128
        reqs_slots = num_req_slots(x, t.running_requests_per_worker)
        ring = rings[128]
        if x.online_c128:
            size = max(t.c128_state_slots, reqs_slots)
            mtp = x.num_draft_tokens if (x.online_c128_mtp and x.speculative_algorithm) else 0
            rows = (size + ring + 1) * (1 + mtp)
            c128_state = rows * 3 * x.attn_head_dim * dt * n128
        else:
            size = max(t.c128_state_slots, reqs_slots * ring)
            rows = -(-(size + ring + 1) // 128) * 128
            c128_state = rows * 2 * x.attn_head_dim * dt * n128
    draft = swa_layer * x.draft_num_layers if x.speculative_algorithm else 0
    return PoolBytes(swa_kv, c4_kv, c128_kv, c4_idx, c4_state, c4_idx_state, c128_state, draft)


def req_to_token_bytes(x: KVPoolInputs, running_requests_per_worker: int) -> int:
    """The int32 ``ReqToTokenPool`` table (memory_pool.py L388-410), allocated after profiling.

    rows = requests + 1 (+ PD decode pre-allocation); columns = context_length + extra, where
    extra = 4 + drafts, or max(that, 2 * drafts + page - 1) with speculation at page > 1
    (``mem_cache/allocation_sizing.py::get_req_to_token_extra_context_len``; topk 1).
    """
    nd = x.num_draft_tokens
    extra = 4 + nd
    if x.speculative_algorithm is not None and x.page_size > 1:
        extra = max(extra, 2 * nd + x.page_size - 1)
    rows = num_req_slots(x, running_requests_per_worker)
    return rows * (x.context_length + extra) * 4


# --- The startup sizing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolSizing:
    """Result of :func:`size_pool`: what one rank of ``sglang serve`` 0.5.23 allocates.

    ``fits`` is False (and every token count 0) when sglang would refuse to start; ``failure``
    then quotes the error sglang raises and ``min_mem_fraction_static`` says what would fit.
    """

    fits: bool
    failure: str | None
    # The memory model (bytes, per rank).
    pre_model_load_bytes: int  #: sglang's baseline "pre" (free bytes before weights)
    available_after_load_bytes: int  #: free bytes at profiling ("avail")
    slack_bytes: int  #: pre * (1 - mfs): what sglang keeps outside the KV budget
    budget_bytes: int  #: available_bytes = int((avail - slack) GiB * 2**30), 0 if negative
    fixed_bytes: int  #: request-scoped c128 state bytes taken off the budget first
    bytes_per_full_token: float
    # Token counts (max_total_num_tokens == full_tokens).
    max_total_num_tokens: int
    full_tokens: int
    swa_tokens: int
    c4_tokens: int
    c128_tokens: int
    c4_state_slots: int
    c128_state_slots: int
    max_running_requests: int  #: per attention-DP worker, after resolve_max_num_reqs
    # What is really allocated, and what is left.
    pool_bytes: PoolBytes | None
    budgeted_bytes: int  #: full * bpft + fixed: the part of the budget the sizing spends
    unused_budget_bytes: int  #: budget - allocated (negative: extra pages sglang does not budget)
    req_to_token_bytes: int  #: allocated after profiling, outside the budget
    #: Free bytes after the KV pools and req_to_token table: what activations, CUDA graphs,
    #: NCCL/workspaces and JIT kernels get (sglang's intended reserve is ``slack_bytes``).
    headroom_bytes: int
    min_mem_fraction_static: float | None  #: 1 - avail/pre, sglang's own "minimum viable" hint
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: The inputs and terms behind the numbers above, for `plan --explain`.
    preload_used_bytes: int = 0  #: in use before sglang's baseline (as passed in)
    bytes_per_token_terms: tuple[tuple[str, float], ...] = ()  #: BytesPerFullToken.terms()
    page_size: int = DSV4_PAGE_SIZE


def _free_gib(free_bytes: int, distributed: bool) -> float:
    """``get_available_gpu_memory``: MIN all-reduce through a float32 tensor, then / 2**30."""
    value = float(free_bytes)
    if distributed:
        value = struct.unpack("f", struct.pack("f", value))[0]
    return value / (1 << 30)


def _base_notes(x: KVPoolInputs) -> list[str]:
    notes = [
        f"Model of sglang {SGLANG_VERSION} on CUDA, KVLayout.V4, ratio-mode SWA sizing.",
        "'pre' = total - preload_used_bytes: sglang's baseline is free memory after "
        "torch.distributed init (CUDA context, NCCL communicators, other processes already "
        "subtracted), not the card's total; pass preload_used_bytes to model that.",
        "weight_bytes + other_static_bytes must be everything allocated between that baseline and "
        "KV profiling: target weights, draft (MTP/DSpark) weights, load-time buffers that stay "
        "referenced. Unmeasured here; the result is only as exact as those inputs.",
        "Not modelled, all allocated after profiling from the slack: CUDA graphs, activations, "
        "sampling/logits buffers, HiSparse coordinator device buffers, custom all-reduce buffers; "
        "headroom_bytes is what they share.",
        "With world_size > 1 sglang MIN-reduces free memory over ranks: the smallest rank sizes "
        "every rank; this model assumes all ranks look alike.",
        "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING (off by default) and --disable-hybrid-swa-memory "
        "change the sizing path and are not modelled.",
    ]
    if x.fp4_indexer:
        notes.append(
            "FP4 indexer: the configurator budgets the FP8 indexer (132 B/entry, "
            "pool_configurator.py L1109-1114: only HIP passes the FP4 flag) but the pool allocates "
            "68 B/entry, so "
            f"{(132 - 68) / 4 * x.n_c4:g} B per full token stay unused inside the budget."
        )
    if x.speculative_algorithm is not None:
        notes.append(
            "Speculative: the draft pool is reserved as (L+1)/L of the per-token bytes "
            "(pool_configurator.py L1250-1257), while the draft worker allocates only an SWA pool "
            f"({x.draft_num_layers} layer(s), compress ratio 0): draft_swa_kv."
        )
    if x.hisparse_host_to_device_ratio:
        notes.append(
            "HiSparse: the device c4 pool is full/(4*ratio); the host pool lives in host RAM and "
            "the coordinator's device buffers are not modelled."
        )
    if x.disaggregation_mode == "decode":
        notes.append(
            "PD decode: req_to_token rows approximate DecodeReqToTokenPool's pre-allocation."
        )
    return notes


def size_pool(
    inputs: KVPoolInputs,
    total_gpu_bytes: int,
    weight_bytes: int,
    mem_fraction_static: float,
    other_static_bytes: int = 0,
    *,
    preload_used_bytes: int = 0,
    world_size: int = 1,
) -> PoolSizing:
    """Reproduce sglang 0.5.23's startup KV sizing for one rank.

    ``pre = total_gpu_bytes - preload_used_bytes`` is the free memory when sglang takes its
    baseline; ``avail = pre - weight_bytes - other_static_bytes`` is the free memory at profiling.
    Then ``rest = avail - pre * (1 - mem_fraction_static)`` (GiB floats, exactly as
    ``_profile_available_bytes``), ``fixed`` = c128 state ring, ``full = floor((rest - fixed) /
    bytes_per_full_token)`` aligned down to the page, and the other pools follow from ``full``.
    """
    x = inputs
    _need(total_gpu_bytes > 0, "total_gpu_bytes", total_gpu_bytes, "must be positive",
          "pass the GPU's memory in bytes (97,887 MiB for an RTX PRO 6000)")
    _need(weight_bytes >= 0, "weight_bytes", weight_bytes, "must be >= 0",
          "pass the per-rank weight bytes")
    _need(other_static_bytes >= 0, "other_static_bytes", other_static_bytes, "must be >= 0",
          "pass 0 or the extra bytes allocated before KV profiling")
    _need(0 <= preload_used_bytes < total_gpu_bytes, "preload_used_bytes", preload_used_bytes,
          "must be in [0, total_gpu_bytes)", "pass the memory in use before weights load")
    _need(isinstance(mem_fraction_static, float | int) and 0 < mem_fraction_static <= 1,
          "mem_fraction_static", mem_fraction_static, "must be in (0, 1]", "use e.g. 0.85")
    _need(world_size >= 1, "world_size", world_size, "must be >= 1", "use tp_size * pp_size")

    notes = _base_notes(x)
    distributed = world_size > 1
    pre_free = total_gpu_bytes - preload_used_bytes
    avail_free = pre_free - weight_bytes - other_static_bytes
    pre_gb = _free_gib(pre_free, distributed)
    avail_gb = _free_gib(max(avail_free, 0), distributed)
    slack_gb = pre_gb * (1 - mem_fraction_static)
    rest_gb = avail_gb - slack_gb - 0.0  # mm_runtime_reservation_gb = 0 for a text model
    bpft = bytes_per_full_token(x)
    fixed = fixed_bytes(x)
    slack_bytes = int(slack_gb * (1 << 30))
    base = dict(
        pre_model_load_bytes=int(pre_gb * (1 << 30)),
        available_after_load_bytes=int(avail_gb * (1 << 30)),
        slack_bytes=slack_bytes,
        fixed_bytes=fixed.total,
        bytes_per_full_token=bpft.total,
        preload_used_bytes=preload_used_bytes,
        bytes_per_token_terms=tuple(bpft.terms().items()),
        page_size=x.page_size,
    )

    def refuse(failure: str, budget: int) -> PoolSizing:
        min_mfs = 1 - avail_gb / pre_gb if pre_gb > 0 else None
        return PoolSizing(
            fits=False, failure=failure, budget_bytes=budget, max_total_num_tokens=0,
            full_tokens=0, swa_tokens=0, c4_tokens=0, c128_tokens=0, c4_state_slots=0,
            c128_state_slots=0, max_running_requests=0, pool_bytes=None, budgeted_bytes=0,
            unused_budget_bytes=budget, req_to_token_bytes=0,
            headroom_bytes=max(avail_free, 0), min_mem_fraction_static=min_mfs,
            notes=(*notes, failure), **base,
        )

    if rest_gb <= 0:
        # kv_cache_configurator.py L3041-3058
        return refuse(
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={mem_fraction_static} (rest = {rest_gb:.3f} GiB; minimum "
            f"viable = 1 - available/pre = {1 - avail_gb / pre_gb:.4f})",
            0,
        )
    budget = int(rest_gb * (1 << 30))

    # DSV4PoolConfigurator.calculate_pool_sizes (L1667-1669).
    avail_tokens = max(budget - fixed.total, 0)
    full = int(avail_tokens / bpft.total)
    full = full // x.page_size * x.page_size
    # Low-ratio (V4.1 ratios 1/2) padding loop: no such layers here, so no pages are removed.
    if x.max_total_tokens is not None and x.max_total_tokens < full:
        # _apply_token_constraints, then calculate_pool_sizes_from_max_tokens re-floors to a page.
        full = x.max_total_tokens // x.page_size * x.page_size
        notes.append(f"--max-total-tokens {x.max_total_tokens} caps the full pool.")
    tokens = pool_tokens(x, full)
    floor = x.sliding_window + x.page_size
    if floor >= tokens.swa:
        # MemoryPoolConfigurator.validate_swa_pool_size (L198-216) runs before MemoryPoolConfig's
        # "Not enough memory" check, so it is the error sglang shows.
        return refuse(
            f"ValueError: SWA pool ({tokens.swa} tokens) cannot hold even one request: the prefill "
            f"admission floor is sliding_window_size ({x.sliding_window}) + page_size "
            f"({x.page_size}) (full pool {full} tokens, budget {budget} B, fixed {fixed.total} B). "
            "Increase --swa-full-tokens-ratio or the total KV budget (--mem-fraction-static).",
            budget,
        )
    pb = pool_bytes(x, tokens)
    allocated = pb.total
    r2t = req_to_token_bytes(x, tokens.running_requests_per_worker)
    budgeted = int(tokens.full * bpft.total) + fixed.total
    if tokens.running_requests_per_worker < x.requested_running_requests_per_worker:
        notes.append(
            f"max_running_requests reduced from {x.requested_running_requests_per_worker} to "
            f"{tokens.running_requests_per_worker} per worker (full // 2)."
        )
    return PoolSizing(
        fits=True,
        failure=None,
        budget_bytes=budget,
        max_total_num_tokens=tokens.full,
        full_tokens=tokens.full,
        swa_tokens=tokens.swa,
        c4_tokens=tokens.c4,
        c128_tokens=tokens.c128,
        c4_state_slots=tokens.c4_state_slots,
        c128_state_slots=tokens.c128_state_slots,
        max_running_requests=tokens.running_requests_per_worker,
        pool_bytes=pb,
        budgeted_bytes=budgeted,
        unused_budget_bytes=budget - allocated,
        req_to_token_bytes=r2t,
        headroom_bytes=avail_free - allocated - r2t,
        min_mem_fraction_static=None,
        notes=tuple(notes),
        **base,
    )


def max_tokens_per_gib(x: KVPoolInputs) -> float:
    """Convenience for reports: full-context tokens one GiB of budget buys (ignores fixed bytes)."""
    return (1 << 30) / bytes_per_full_token(x).total


__all__ = [
    "DSV4_DEFAULT_MAX_RUNNING_REQUESTS",
    "DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO",
    "DSV4_FLASH_COMPRESS_RATIOS",
    "DSV4_PAGE_SIZE",
    "SGLANG_VERSION",
    "V4_ENTRY_BYTES",
    "V4_PAGE_ALIGN",
    "BytesPerFullToken",
    "FixedBytes",
    "KVPoolError",
    "KVPoolInputs",
    "PoolBytes",
    "PoolSizing",
    "PoolTokens",
    "bytes_per_full_token",
    "fixed_bytes",
    "indexer_bytes_per_token",
    "max_tokens_per_gib",
    "paged_kv_bytes_per_token",
    "pool_bytes",
    "pool_tokens",
    "req_to_token_bytes",
    "ring_sizes",
    "size_pool",
    "v4_page_bytes",
]
