"""What lives outside ``--mem-fraction-static`` on one rank of SGLang 0.5.23 serving DeepSeek-V4.

Owns the answer to "is the memory the static fraction leaves enough for the longest declared
request?". :mod:`orchestrator.planner.kvpool` sizes what sglang puts *inside* the fraction; this
module lists, term by term, what needs memory *outside* it, each with the sglang 0.5.23 code it
comes from (wheel paths, ``python/`` prefix on GitHub) and whether the number is exact or an
estimate. Two phases:

- **before the baseline** (``cuda_context``, ``nccl``, ``custom_allreduce``): allocated before
  ``distributed/bootstrap.py::measure_pre_model_load_memory`` (L193-223) takes sglang's "pre"
  reading, so they shrink ``pre`` and, through ``pre * mfs``, the KV pool. They are the KV model's
  ``preload_used_bytes``.
- **at run time** (``activations``, ``indexer_logits``, ``cuda_graphs``): allocated after the KV
  pool from what is left (``PoolSizing.headroom_bytes``), all live at the worst moment of the
  declared workload: the last prefill chunk of the longest request (prefill/colocated roles) or a
  full decode batch against the longest context (decode role).

Pure arithmetic, no torch: ``dsv4ctl plan`` imports it. One module past 400 lines on purpose:
every term sits beside the sglang constants it is computed from. docs/headroom-sglang-0.5.23.md derives it;
tests/parsers_real/test_headroom_vs_sglang.py runs sglang's own functions against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from orchestrator.catalog import Gpu

SGLANG_VERSION = "0.5.23"
MIB = 1 << 20
GIB = 1 << 30

Phase = Literal["before-baseline", "runtime"]
IndexerPath = Literal["deepgemm", "tilelang", "torch-sm120", "dsv4-kernels"]
DisaggMode = Literal["null", "prefill", "decode"]

# --- Constants, each read in sglang 0.5.23 (or marked as an estimate) ----------------------------

#: CUDA context + cuBLAS/cuDNN handles before sglang's baseline. Not measured on an RTX PRO 6000
#: with sglang 0.5.23 (unconfirmed); 1 GiB is the conservative figure the planner used before this
#: model existed, kept so the KV pool errs small. Calibration (``dsv4ctl calibrate``) corrects it.
CUDA_CONTEXT_BYTES = 1 * GIB
#: NCCL's default staging buffer per channel and peer: ``NCCL_BUFFSIZE`` = 4 MiB (NCCL env docs,
#: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-buffsize).
NCCL_BUFFSIZE = 4 * MIB
#: Channels NCCL opens on a PCIe ring: unconfirmed estimate (NCCL picks it from the topology).
NCCL_CHANNELS_ESTIMATE = 8
#: Communicators holding NCCL buffers on each rank: sglang's PyNccl TP communicator and torch's
#: world process group (``distributed/parallel_state.py``); estimate, others are created lazily.
NCCL_COMMUNICATORS_ESTIMATE = 2
#: ``CustomAllreduce._MAX_CAR_SIZE`` = 8192 * 1024 (custom_all_reduce.py L42); world sizes L41.
CUSTOM_AR_MAX_SIZE = 8192 * 1024
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)

#: ``reserved_mem = 512`` MiB of "constant meta data (e.g., from attention backend)"
#: (arg_groups/memory_hook.py L309); sglang's own estimate.
ACTIVATION_CONSTANT_BYTES = 512 * MIB

#: DeepGEMM's logits row stride is padded to 256 fp32 columns (mqa_logits_utils.py L26).
MQA_ROW_ALIGN = 256
#: Matrices under 8,000,000 elements are never chunked (mqa_logits_utils.py L21).
MQA_STATIC_SKIP_ELEMS = 8_000_000
#: Logits budget caps: 30% of the card (L22), 20% of the free memory
#: (``SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION`` default 0.2, environ.py L1985).
MQA_TOTAL_MEM_FRACTION = 0.3
MQA_FREE_MEM_FRACTION = 0.2
#: DeepGEMM's paged-MQA metadata kernel schedules at most 4096 rows on SM120
#: (layers/attention/dsv4/metadata.py L70 ``_SM120_INDEXER_M_CHUNK``).
SM120_INDEXER_ROW_CAP = 4096
#: The c4 indexer pool page: 256-token pages / ratio 4 = 64 compressed entries
#: (indexer.py L1087 views the cache as ``[pages, 64, 1, 132]``).
INDEXER_PAGE = 64
#: One indexer K entry: 128 fp8 + one fp32 scale (132 B), FP4: 68 B (indexer.py L1086).
INDEXER_ENTRY_BYTES = {False: 132, True: 68}
#: The sm_120 torch path scores 1024 query rows at a time (indexer.py L204 ``_QUERY_CHUNK``).
TORCH_SM120_QUERY_CHUNK = 1024
#: ``SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS`` default 8192 (environ.py L1828).
NONPAGED_MIN_QUERY_TOKENS = 8192


@dataclass(frozen=True)
class HostGpu:
    """The GPU a deployment runs on (capacity resolves it; the headroom terms read it)."""

    spec: Gpu
    total_bytes: int  # the smallest memory among the GPUs the deployment uses
    arch: str


@dataclass(frozen=True)
class HeadroomInputs:
    """One rank of one role, as sglang 0.5.23 sees it, and the longest request it must serve."""

    gpu_total_bytes: int
    mem_fraction_static: float
    tp: int
    attn_dp: int = 1
    disaggregation_mode: DisaggMode = "null"
    #: ``--chunked-prefill-size``; None = sglang's default for the card (memory_hook.py L84-180).
    chunked_prefill_size: int | None = None
    #: ``--cuda-graph-max-bs``; None = sglang's default for the card, capped by max running.
    cuda_graph_max_bs: int | None = None
    #: ``--max-running-requests`` as passed (None = the V4 default 256).
    max_running_requests: int | None = None
    #: tokens verified per request and decode step (1 without speculation).
    tokens_per_request: int = 1
    speculative: bool = False
    #: The longest request of the declared workload (prompt + output tokens).
    longest_request_tokens: int = 65536
    # The model (config.json of DeepSeek-V4-Flash; catalog facts).
    hidden_size: int = 4096
    hc_mult: int = 4
    num_attention_heads: int = 64
    head_dim: int = 512
    q_lora_rank: int = 1024
    moe_intermediate_size: int = 2048
    num_experts_per_tok: int = 6
    n_shared_experts: int = 1
    index_n_heads: int = 64
    fp4_indexer: bool = False
    # The host.
    is_sm120: bool = True
    #: NVLink between all ranks (RTX PRO 6000 hosts: PCIe only).
    full_nvlink: bool = False
    #: Which function scores the indexer (dsv4/indexer.py L855-880), from the env the engine runs
    #: with: SGLANG_OPT_USE_TILELANG_INDEXER -> tilelang; else SGLANG_FP8_PAGED_MQA_LOGITS_TORCH
    #: -> the sm_120 torch function (or dsv4ctl's kernel hooked in its place); else DeepGEMM.
    #: sglang 0.5.23 sets both env vars on sm_120 unless given (arg_groups/model_hook.py
    #: L495-502), so an RTX PRO 6000 runs TileLang out of the box; where a role's indexer takes the
    #: bundled path (orchestrator/kernel_paths.py) render writes SGLANG_OPT_USE_TILELANG_INDEXER=0
    #: so that the hooked kernel runs (planner/outside.py reads the role's rendered env).
    indexer_path: IndexerPath = "deepgemm"
    #: SGLANG_FP8_PAGED_MQA_LOGITS_TORCH: with it set, ``PagedIndexerMetadata`` builds no DeepGEMM
    #: schedule and never row-chunks the logits, whatever the path (dsv4/metadata.py L207-212).
    torch_mqa_env: bool = False


@dataclass(frozen=True)
class HeadroomTerm:
    id: str
    phase: Phase
    bytes: int
    exact: bool  #: computed as sglang's code computes it; False = an estimate
    source: str  #: sglang 0.5.23 file:line (or the estimate's basis, "unconfirmed")
    detail: str  #: the arithmetic, with the numbers


@dataclass(frozen=True)
class HeadroomModel:
    terms: tuple[HeadroomTerm, ...]
    chunked_prefill_size: int  #: as resolved (sglang's default when unset)
    cuda_graph_max_bs: int
    longest_request_tokens: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def preload_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.phase == "before-baseline")

    @property
    def runtime_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.phase == "runtime")

    @property
    def largest_runtime(self) -> HeadroomTerm:
        return max((t for t in self.terms if t.phase == "runtime"), key=lambda t: t.bytes)


# --- sglang's defaults for the card ----------------------------------------------------------------


def default_chunked_prefill_size(gpu_total_bytes: int) -> int:
    """``handle_gpu_memory_settings`` (memory_hook.py L84-180), by card memory in MiB."""
    mib = gpu_total_bytes / MIB
    if mib < 20 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    if mib < 160 * 1024:
        return 8192
    return 16384


def default_cuda_graph_max_bs(gpu_total_bytes: int, tp: int, max_running_requests: int | None) -> int:
    """Decode graph max batch (memory_hook.py L84-188): by card and TP, capped by max running."""
    mib = gpu_total_bytes / MIB
    if mib < 20 * 1024:
        bs = 8
    elif mib < 35 * 1024:
        bs = 48 if tp < 4 else 160
    elif mib < 60 * 1024:
        bs = 32 if tp < 4 else 160
    elif mib < 160 * 1024:
        bs = 256 if tp < 4 else 512
    else:
        bs = 512
    if max_running_requests is not None and bs > max_running_requests:
        bs = max_running_requests  # L182-188, only when max_bs was the default
    return bs


def decode_capture_bs(max_bs: int, speculative: bool) -> list[int]:
    """``generate_decode_cuda_graph_batch_sizes`` (cuda_graph_hook.py L500-532)."""
    if not speculative:
        bs = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
              *range(512, max_bs + 1, 32)]
    else:
        bs = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
              + list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16)))
    bs = [b for b in bs if b <= max_bs]
    if max_bs not in bs:
        bs.append(max_bs)
    return bs


def prefill_capture_bs(max_tokens: int) -> list[int]:
    """``generate_prefill_cuda_graph_batch_sizes`` (cuda_graph_hook.py L480-497)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
             + list(range(4608, max_tokens + 1, 512)))
    return [s for s in sizes if s <= max_tokens]


# --- The indexer's logits workspace ----------------------------------------------------------------


def mqa_row_bytes(cols: int) -> int:
    """``mqa_logits_row_bytes`` (mqa_logits_utils.py L36-40): fp32, stride padded to 256."""
    return -(-cols // MQA_ROW_ALIGN) * MQA_ROW_ALIGN * 4


def mqa_static_budget(total: int, mfs: float) -> int:
    """``mqa_logits_static_budget_bytes`` (mqa_logits_utils.py L44-56)."""
    cap = int(total * MQA_TOTAL_MEM_FRACTION)
    return max(1, min(int(int(total * max(0.0, 1.0 - mfs)) * MQA_FREE_MEM_FRACTION), cap))


def indexer_rows_per_chunk(rows: int, cols: int, budget: int | None, sm120: bool) -> int:
    """``plan_indexer_row_chunks`` (dsv4/metadata.py L73-108) + ``mqa_logits_should_chunk`` and
    ``mqa_logits_rows_per_chunk`` (mqa_logits_utils.py L66-100); returns the rows of the largest
    chunk (``rows`` when the batch runs whole)."""
    chunk: int | None = SM120_INDEXER_ROW_CAP if sm120 and rows > SM120_INDEXER_ROW_CAP else None
    if budget is not None and rows * cols >= MQA_STATIC_SKIP_ELEMS and rows * cols * 4 > budget:
        rb = mqa_row_bytes(cols)
        if rows * rb > budget:
            by_budget = max(budget // max(rb, 1), 1)
            if by_budget < rows:
                chunk = by_budget if chunk is None else min(chunk, by_budget)
    return rows if chunk is None else min(chunk, rows)


def compressed_cols(context_tokens: int) -> int:
    """Indexer columns for a request: its 256-token pages x 64 c4 entries
    (``PagedIndexerMetadata.max_compressed_seq_len``, dsv4/metadata.py L318-320)."""
    return -(-context_tokens // 256) * INDEXER_PAGE


def torch_sm120_peak_bytes(rows: int, cols: int, index_n_heads: int) -> int:
    """The allocator peak of ``fp8_paged_mqa_logits_torch_sm120`` (indexer.py L188-272) for
    ``rows`` query rows against ``cols`` keys (a multiple of the 64-entry page).

    It scores 1024-row slices (L204-221). In a slice of ``r`` rows, per (row, key): the gathered
    uint8 pages (132 B) and the bf16 keys (256 B) stay alive; on top comes the larger of two
    moments: converting the keys (their contiguous uint8 copy, 128 B) or weighting the scores
    (the fp32 scales 4 B, relu'd bf16 scores 2 B x heads and their fp32 product 4 B x heads) with
    the bf16 queries (256 B x heads per row). Earlier slices' fp32 outputs stay alive for
    ``torch.cat``, which then holds them and the result (2 x rows x cols x 4 B). Equal to the peak
    measured on the real function by tests/parsers_real/test_headroom_vs_sglang.py.
    """
    h = index_n_heads
    peak = done = 0
    for start in range(0, rows, TORCH_SM120_QUERY_CHUNK):
        r = min(TORCH_SM120_QUERY_CHUNK, rows - start)
        slice_peak = r * max(516 * cols, (392 + 6 * h) * cols + 256 * h)
        peak = max(peak, done + slice_peak)
        done += r * cols * 4
    if rows > TORCH_SM120_QUERY_CHUNK:
        peak = max(peak, 2 * rows * cols * 4)
    return peak


def indexer_logits_term(x: HeadroomInputs, rows: int, cols: int, free_bytes: int,
                        graph_backed: bool) -> HeadroomTerm:
    """The indexer's workspace for ``rows`` query rows against ``cols`` compressed keys."""
    src = ("sglang 0.5.23 layers/attention/dsv4/indexer.py L600-736,L855-1130; dsv4/metadata.py "
           "L73-108,L200-316; layers/attention/mqa_logits_utils.py L21-100")
    whole = rows * cols * 4
    if x.indexer_path == "torch-sm120" and x.torch_mqa_env:
        peak = torch_sm120_peak_bytes(rows, cols, x.index_n_heads)
        return HeadroomTerm(
            "indexer_logits", "runtime", peak, True, src + "; the torch function L188-272",
            f"sm_120 torch function: {rows:,} rows x {cols:,} keys in 1024-row slices, no budget "
            f"(SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 builds no DeepGEMM schedule) = {peak:,} B")
    if x.torch_mqa_env:
        fn = {"tilelang": "TileLang tilelang_fp8_paged_mqa_logits (fp32 [rows, keys], "
                          "kernels/ops/attention/dsa/tilelang_kernel.py L1373)",
              "dsv4-kernels": "dsv4ctl's Triton indexer hooked in place of the torch function "
                              "(fp32 [rows, keys], kernels/dsv4_kernels/indexer.py L848)",
              "deepgemm": "DeepGEMM"}.get(x.indexer_path, x.indexer_path)
        return HeadroomTerm(
            "indexer_logits", "runtime", whole, True, src,
            f"{fn}: all {rows:,} rows x {cols:,} keys x 4 B in one piece = {whole:,} B "
            "(SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1: no row chunking, no memory budget)")
    budget = None if graph_backed else min(mqa_static_budget(x.gpu_total_bytes,
                                                              x.mem_fraction_static),
                                           max(1, int(max(free_bytes, 0) * MQA_FREE_MEM_FRACTION)))
    chunk = indexer_rows_per_chunk(rows, cols, budget, x.is_sm120)
    rb = mqa_row_bytes(cols) if x.indexer_path == "deepgemm" else cols * 4
    total = chunk * rb
    detail = (f"{x.indexer_path}, DeepGEMM schedule: {chunk:,} of {rows:,} rows x {rb:,} B "
              f"({cols:,} keys fp32) = {total:,} B"
              + ("" if budget is None else f"; budget min(static, 0.2 x free) = {budget:,} B")
              + (f"; SM120 row cap {SM120_INDEXER_ROW_CAP}" if x.is_sm120 else ""))
    if (x.indexer_path == "deepgemm" and not graph_backed and rows >= NONPAGED_MIN_QUERY_TOKENS
            and not x.fp4_indexer):
        # One request of >= 8192 query rows, eager: the non-paged path gathers the whole K once
        # and chunks the logits by the budget only (indexer.py L600-736, L1000-1022).
        k = cols * INDEXER_ENTRY_BYTES[False]
        nchunk = indexer_rows_per_chunk(rows, cols, budget, sm120=False)
        nonpaged = k + nchunk * mqa_row_bytes(cols)
        detail += (f"; non-paged DeepGEMM (one request >= {NONPAGED_MIN_QUERY_TOKENS} rows): "
                   f"K {k:,} B + {nchunk:,} rows x {mqa_row_bytes(cols):,} B = {nonpaged:,} B")
        total = max(total, nonpaged)
    return HeadroomTerm("indexer_logits", "runtime", total, True, src, detail)


# --- The model ---------------------------------------------------------------------------------


def activation_bytes_per_token(x: HeadroomInputs) -> int:
    """Estimated live activation bytes per token in the busiest layer of one rank (bf16).

    Hyper-connection residual streams (``hc_mult`` x hidden) plus the layer's input and output;
    attention q/o for this rank's heads and the q LoRA; the indexer's fp8 q and fp32 head weights;
    the routed experts' gate/up, activation and down outputs for every routed copy (all top-k on
    this rank: the worst case without DeepEP); the shared expert's TP shard. Unconfirmed: not
    measured; the torch caching allocator's fragmentation is not included.
    """
    h, inter = x.hidden_size, x.moe_intermediate_size
    residual = 2 * h * (x.hc_mult + 2)
    attn = 2 * (2 * (x.num_attention_heads // x.tp) * x.head_dim + x.q_lora_rank)
    indexer = x.index_n_heads * (128 + 4)
    routed = 2 * x.num_experts_per_tok * (3 * inter + h)
    shared = 2 * x.n_shared_experts * (3 * inter + h) // x.tp
    return residual + attn + indexer + routed + shared


def build(x: HeadroomInputs, runtime_available_bytes: int | None = None) -> HeadroomModel:
    """Every term for one rank. ``runtime_available_bytes`` (the KV model's headroom) sets the free
    memory the indexer's budget sees; None = the whole share outside the static fraction."""
    mode = x.disaggregation_mode
    chunk = x.chunked_prefill_size or default_chunked_prefill_size(x.gpu_total_bytes)
    if chunk < 0:  # -1 disables chunking: a prefill step is the whole prompt
        chunk = x.longest_request_tokens
    max_bs = x.cuda_graph_max_bs or default_cuda_graph_max_bs(
        x.gpu_total_bytes, x.tp, x.max_running_requests)
    mrr = x.max_running_requests or 256
    world = x.tp
    terms: list[HeadroomTerm] = [HeadroomTerm(
        "cuda_context", "before-baseline", CUDA_CONTEXT_BYTES, False,
        "unconfirmed estimate (not measured on RTX PRO 6000 + sglang 0.5.23)",
        "CUDA context, cuBLAS workspaces; before sglang's baseline "
        "(distributed/bootstrap.py L193-223)")]
    nccl = (NCCL_COMMUNICATORS_ESTIMATE * NCCL_CHANNELS_ESTIMATE * 2 * NCCL_BUFFSIZE
            if world > 1 else 0)
    terms.append(HeadroomTerm(
        "nccl", "before-baseline", nccl, False,
        "NCCL_BUFFSIZE default 4 MiB (NCCL docs); channels and communicators unconfirmed",
        f"{NCCL_COMMUNICATORS_ESTIMATE} communicators x {NCCL_CHANNELS_ESTIMATE} channels x 2 "
        f"ring peers x 4 MiB" if world > 1 else "tp 1: no communicator"))
    car_on = world in CUSTOM_AR_WORLD_SIZES and (world == 2 or x.full_nvlink)
    terms.append(HeadroomTerm(
        "custom_allreduce", "before-baseline", 3 * CUSTOM_AR_MAX_SIZE if car_on else 0, True,
        "sglang 0.5.23 distributed/device_communicators/custom_all_reduce.py L41-42,L104-121; "
        "custom_all_reduce_utils.py L455-497",
        "meta + buffer + rank_data of 8 MiB each (meta_size() not counted)" if car_on else
        (f"off: {world} PCIe-only GPUs (more than two without NVLink)" if world > 2 else
         f"off: world size {world}")))

    decode = mode == "decode"
    if decode:
        tokens = max(1, mrr // x.attn_dp) * x.tokens_per_request
        what = f"a decode batch of {tokens:,} tokens"
    else:
        tokens = min(chunk, x.longest_request_tokens)
        what = f"one chunked-prefill step of {tokens:,} tokens"
    per_tok = activation_bytes_per_token(x)
    act = ACTIVATION_CONSTANT_BYTES + tokens * per_tok
    terms.append(HeadroomTerm(
        "activations", "runtime", act, False,
        "estimate from config.json shapes (unconfirmed); the 512 MiB constant is sglang's "
        "(arg_groups/memory_hook.py L309)",
        f"512 MiB + {what} x {per_tok:,} B/token"))

    # reserve_for_graph_mb (memory_hook.py L357-392); V4 is not an MLA arch in sglang
    # (configs/model_config.py L1418-1430: AttentionArch.MHA), so prefill graphs cost 8 MiB each.
    graph_mib = 0.0
    parts = []
    if mode != "prefill":
        graph_mib += max_bs * 2
        parts.append(f"decode max_bs {max_bs} x 2 MiB")
        if x.attn_dp > 1:
            graph_mib += max_bs * x.attn_dp * 3 + (max_bs * x.attn_dp * 1.5 if max_bs > 300 else 0)
            parts.append(f"attention-DP {x.attn_dp} padding")
    if mode != "decode":
        nb = len(prefill_capture_bs(chunk))
        graph_mib += nb * 8
        parts.append(f"{nb} breakable prefill graphs x 8 MiB")
    terms.append(HeadroomTerm(
        "cuda_graphs", "runtime", int(graph_mib * MIB), False,
        "sglang 0.5.23's own reserve, arg_groups/memory_hook.py L357-392 (an estimate by "
        "sglang; capture bs: cuda_graph_hook.py L480-532)", "; ".join(parts)))

    ctx = x.longest_request_tokens
    cols = compressed_cols(ctx)
    free = (runtime_available_bytes if runtime_available_bytes is not None
            else int(x.gpu_total_bytes * (1 - x.mem_fraction_static))) - act - int(graph_mib * MIB)
    terms.append(indexer_logits_term(x, tokens, cols, free, graph_backed=decode))
    notes = [f"{what} against a {ctx:,}-token context"]
    return HeadroomModel(terms=tuple(terms), chunked_prefill_size=chunk, cuda_graph_max_bs=max_bs,
                         longest_request_tokens=ctx, notes=tuple(notes))


__all__ = ["HeadroomInputs", "HeadroomModel", "HeadroomTerm", "build", "compressed_cols",
           "decode_capture_bs", "default_chunked_prefill_size", "default_cuda_graph_max_bs",
           "indexer_rows_per_chunk", "mqa_row_bytes", "mqa_static_budget", "prefill_capture_bs"]
