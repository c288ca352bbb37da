"""The ``wg`` sparse-MLA decode variant: a Gluon kernel for sm_90 (Hopper) with explicit layouts.

Why a second language: every ``tl.dot`` form of the fused kernel hands a dot that feeds another
dot to all eight warps along M (``warpsPerCTA = [8, 1]``). With M = 64 heads, both warpgroups
then compute the same ``Q K^T`` (notes v6), and Triton gives no way to stream a *gathered*
tile through shared memory ahead of the products. Gluon (``triton.experimental.gluon``, shipped
with Triton 3.6) exposes what the plain language hides, so this kernel states it:

* ``Q K^T`` in an ``NVMMADistributedLayout`` with ``warps_per_cta = [4, 2]``: warpgroup 0 scores
  the first half of the tile's keys and warpgroup 1 the second half (wgmma m64nBT/2), no
  duplicate work; ``P V`` in the same warp grid gives each warpgroup 256 of the 512 output
  columns (m64n256), so the [64, 512] fp32 accumulator costs 128 registers per thread.
* The gather is asynchronous: the raw bytes of the next tiles (FP8 nope, UE8M0 scales, BF16
  rope) are copied global -> shared with ``cp.async`` into ``STAGES`` raw stages while the
  current tile is dequantized and multiplied, so the gather latency that dominated every
  register-level variant overlaps the tensor work. Indices are loaded one more tile ahead into
  registers, so no load of the loop waits on memory except through ``cp.async.wait_group``.
* Per tile: dequantize its bytes once (FP8 x 2^(e-127) -> bf16) into a [BT, 512] swizzled
  tile that serves as K for ``Q K^T`` (a transposed view) and as V for ``P V``, online softmax
  in base 2, P through shared memory to both warpgroups. Two K buffers do not fit next to Q and
  the raw stages, so the default (pipelined) schedule overlaps through registers instead:
  tile t + 1 is dequantized into registers while tile t's ``P V`` runs asynchronously on the
  tensor cores, and stored into the one K buffer once that product is done; the next gather is
  issued while ``Q K^T`` runs. ``PIPE=False`` keeps the sequential schedule (wait, dequantize,
  store, products) for comparison. notes v8-v9 have the measurements.

Everything else (key ranges, adaptive split-K, the split-partial format, the combine, output and
LSE conventions) is the Triton variants' (``sparse_decode.py``); results agree with them up to
rounding. Shared memory at BT 64: Q 64 KB + K 64 KB + P 8 KB + two raw stages of 41 KB = 218 KB,
so this variant needs an H100/H200-class part (227 KB per block) and wgmma; sm_120 keeps ``pf``.
"""

from __future__ import annotations

from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from dsv4_kernels.decode_common import _Keys
from dsv4_kernels.decode_common import _keys_of as _tl_keys_of
from dsv4_kernels.decode_common import _model1_slots as _tl_model1_slots
from dsv4_kernels.decode_common import _split_range as _tl_split_range
from dsv4_kernels.sparse_decode import register_variant

# The Triton variants' split-K cut, cache choice and MODEL1 slot offsets, compiled as Gluon
# (code without layouts, so the same body serves both languages).
_split_range = gluon.jit(_tl_split_range.fn)
_keys_of = gluon.jit(_tl_keys_of.fn)
_model1_slots = gluon.jit(_tl_model1_slots.fn)
# Gluon is experimental and renames things between releases: Triton 3.6 (what the lent H200's
# torch 2.11 ships) calls the cp.async copy async_copy_global_to_shared, later releases
# async_load with the same arguments.
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# Likewise its CTA barrier: thread_barrier (3.6) or barrier (later).
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# ... and a shared-memory view of another dtype: _reinterpret (3.6) or reinterpret (later).
_NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def _wg_load_idx(a_row, n_a, b_row, n_b, t, tiles_a, hi, BT: gl.constexpr,
                 ROWS: gl.constexpr):
    """Indices of tile ``t`` ([BT] in layout ``ROWS``; -1 where invalid or past the list or
    the split)."""
    return _tile_idx(a_row, n_a, b_row, n_b, t, tiles_a, hi, gl.arange(0, BT, layout=ROWS), BT)


@gluon.jit
def _tile_idx(a_row, n_a, b_row, n_b, t, tiles_a, hi, rows, BT: gl.constexpr):
    """Indices of keys ``rows`` of tile ``t`` in whichever list the tile belongs to (-1 where
    invalid or past the list or the split); ``ws`` loads them a quarter tile at a time."""
    if t < tiles_a:
        offs = t * BT + rows
        idx = gl.load(a_row + offs, mask=(offs < n_a) & (t < hi), other=-1)
    else:
        offs = (t - tiles_a) * BT + rows
        idx = gl.load(b_row + offs, mask=(offs < n_b) & (t < hi), other=-1)
    return idx


@gluon.jit
def _wg_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, idx,
              raw_s, rope_s, sc_s, ok_s, BT: gl.constexpr, GL: gl.constexpr,
              L3: gl.constexpr, SCL: gl.constexpr):
    """Start the asynchronous copy of tile ``t``'s raw bytes into one stage of shared memory:
    the FP8 nope as [BT, 8, 64] (chunk 7 zero-filled), the [BT, 64] BF16 rope and the [BT, 8]
    scale bytes, zero-filled for invalid keys, plus a validity byte per key (a plain store,
    ordered by the barrier that precedes the stage's use). One copy per buffer: Triton's
    barrier analysis cannot tell slices of one buffer apart and would fence each chunk."""
    u8, bf, ps, pb = _keys_of(t < tiles_a, a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb)
    base, sbase = _model1_slots(idx, ps, pb)
    valid = idx >= 0
    # nope: [BT, 8, 64] bytes, chunk 7 masked off
    b3 = gl.convert_layout(base, gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    v3 = gl.convert_layout(valid, gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    c3 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    d3 = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    col = gl.expand_dims(gl.expand_dims(c3 * 64, 0), 2) + gl.expand_dims(gl.expand_dims(d3, 0), 1)
    ptr = u8 + gl.expand_dims(gl.expand_dims(b3, 1), 2) + col
    m3 = gl.expand_dims(gl.expand_dims(v3, 1), 2) & (col < 448)
    _async_load(raw_s, ptr, mask=m3)
    # rope: 64 bf16 values at byte 448
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, GL))
    rptr = bf + gl.expand_dims(base // 2 + 224, 1) + gl.expand_dims(d, 0)
    _async_load(rope_s, rptr, mask=gl.expand_dims(valid, 1))
    s_valid = gl.convert_layout(valid, gl.SliceLayout(1, SCL))
    s_base = gl.convert_layout(sbase, gl.SliceLayout(1, SCL))
    cs = gl.arange(0, 8, layout=gl.SliceLayout(0, SCL))
    sptr = u8 + gl.expand_dims(s_base, 1) + gl.expand_dims(cs, 0)
    _async_load(sc_s, sptr, mask=gl.expand_dims(s_valid, 1))
    ok_s.store(valid.to(gl.int8))


@gluon.jit
def _wg_dequant_regs(raw_s, rope_s, sc_s, BT: gl.constexpr, L3: gl.constexpr):
    """One stage's raw bytes -> the bf16 [BT, 512] K=V tile in registers: FP8 x 2^(e-127)
    for chunks 0..6, the rope as chunk 7. A power-of-two scale makes the product exact."""
    raw = raw_s.load(L3).to(gl.float8e4nv, bitcast=True).to(gl.float32)
    e = sc_s.load(gl.SliceLayout(2, L3)).to(gl.int32)
    scale = gl.expand_dims((e << 23).to(gl.float32, bitcast=True), 2)
    rope = gl.expand_dims(rope_s.load(gl.SliceLayout(1, L3)).to(gl.float32), 1)
    c3 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    is_rope = gl.expand_dims(gl.expand_dims(c3 == 7, 0), 2)
    k3 = gl.where(is_rope, rope, raw * scale).to(gl.bfloat16)
    return gl.reshape(k3, [BT, 512])


@gluon.jit
def _wg_dequant(raw_s, rope_s, sc_s, k_s, BT: gl.constexpr, L3: gl.constexpr):
    """``_wg_dequant_regs`` stored as the K tile in one store (one barrier, see _wg_issue)."""
    k_s.store(_wg_dequant_regs(raw_s, rope_s, sc_s, BT, L3))


@gluon.jit
def _wg_softmax_pv(s, valid, m_i, l_i, acc, qk_scale, p_s, k_s, O_L: gl.constexpr):
    """One tile's online softmax (base 2) on the scores ``s``, P into shared memory for both
    warpgroups, and ``P V`` issued asynchronously on the rescaled accumulator: returns its
    token (wait on it for the accumulator) and the new running max and sum."""
    s = gl.where(gl.expand_dims(valid, 0), s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - gl.expand_dims(m_use, 1))
    l_i = l_i * alpha + gl.sum(p, axis=1)
    p_s.store(p.to(gl.bfloat16))
    fence_async_shared()
    _cta_barrier()
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O_L)), 1)
    return warpgroup_mma(p_s, k_s, acc, is_async=True), m_new, l_i


@gluon.jit
def _wg_store_rows(ptr, row_off, hmask, x, buf):
    """Store a [64, 512] tile of rows ``row_off[h] + column``. 16-bit tiles go through shared
    memory (``buf``, the free Q buffer): the wgmma accumulator layout gives each thread pairs of
    adjacent columns, i.e. 4-byte stores, while the reloaded tile is written 16 bytes a thread."""
    if ptr.dtype.element_ty.primitive_bitwidth == 16:
        OUT_L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
        if _NEW_REINTERPRET:
            view = buf.reinterpret(ptr.dtype.element_ty, [64, 512], buf.type.layout)
        else:
            view = buf._reinterpret(ptr.dtype.element_ty, [64, 512], buf.type.layout)
        view.store(x.to(ptr.dtype.element_ty))
        _cta_barrier()
        y = view.load(OUT_L)
        ro = gl.convert_layout(row_off, gl.SliceLayout(1, OUT_L))
        hm = gl.convert_layout(hmask, gl.SliceLayout(1, OUT_L))
        cols = gl.arange(0, 512, layout=gl.SliceLayout(0, OUT_L))
        gl.store(ptr + gl.expand_dims(ro, 1) + gl.expand_dims(cols, 0), y,
                 mask=gl.expand_dims(hm, 1))
    else:
        dd = gl.arange(0, 512, layout=gl.SliceLayout(0, x.type.layout))
        gl.store(ptr + gl.expand_dims(row_off, 1) + gl.expand_dims(dd, 0),
                 x.to(ptr.dtype.element_ty), mask=gl.expand_dims(hmask, 1))


@gluon.jit
def _wg_rows(m_i, l_i, O_L: gl.constexpr):
    """Per row, in O_L's row slice: the reciprocal of the row sum (1 without keys), the base-2
    LSE (-inf without keys) and whether the row had keys. The epilogues multiply each row by
    one factor rather than dividing every element: a full-range fp32 division costs four
    instructions an element, which the one warp per scheduler running the epilogue issues
    back to back (notes v13)."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_L))
    m_o = gl.convert_layout(m_i, gl.SliceLayout(1, O_L))
    has = l_o > 0.0
    safe_l = gl.where(has, l_o, 1.0)
    return 1.0 / safe_l, gl.where(has, m_o + gl.log2(safe_l), float("-inf")), has


@gluon.jit
def _wg_scale(acc, inv):
    """The fp16 partial's row exponent k = ceil(log2 max |row|) (clamped to [-126, 126]) of the
    normalized rows ``acc * inv``, and the one factor ``inv * 2^-k`` that both normalizes and
    scales them (``_store_full`` in sparse_decode.py). Scaling by a positive factor keeps the
    order of magnitudes, so the maximum is taken on ``acc`` once."""
    amax = gl.max(gl.abs(acc), axis=1) * inv
    k = gl.ceil(gl.log2(gl.where(amax > 0.0, amax, 1.0)))
    k = gl.minimum(gl.maximum(k, -126.0), 126.0)
    return k, inv * gl.exp2(-k)


@gluon.jit
def _wg_epilogue(acc, m_i, l_i, r, hb, sp, bidx, H, s_q, sink_ptr, o_ptr, stride_or, stride_oh,
                 lse_ptr, op_ptr, lp_ptr, ks_ptr, q_s, O_L: gl.constexpr,
                 HAS_SINK: gl.constexpr, NSPLIT: gl.constexpr, SCALED: gl.constexpr):
    """Normalize the [64, 512] accumulator and store it (as _store_full in sparse_decode.py):
    the output and LSE with one split, else the split's scaled partial, exponent and base-2
    LSE for the combine. ``q_s`` is the free Q buffer, used to stage 16-byte stores."""
    heads = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, O_L))
    hmask = heads < H
    inv, lse2, has = _wg_rows(m_i, l_i, O_L)
    if NSPLIT == 1:
        lse = lse2 * 0.6931471805599453
        if HAS_SINK:
            sink = gl.load(sink_ptr + heads, mask=hmask, other=0.0).to(gl.float32)
            inv = inv / (1.0 + gl.exp(sink - lse))
        # a row without keys has a zero accumulator (every P was 0 against finite values)
        o = acc * gl.expand_dims(gl.where(has, inv, 0.0), 1)
        lse = gl.where(has, lse, float("inf"))
        _wg_store_rows(o_ptr, r.to(gl.int64) * stride_or + heads * stride_oh, hmask, o, q_s)
        gl.store(lse_ptr + bidx * H * s_q + heads * s_q + (r - bidx * s_q), lse, mask=hmask)
    else:
        prow = (r * NSPLIT + sp).to(gl.int64) * H
        if SCALED:
            k, inv = _wg_scale(acc, inv)
            gl.store(ks_ptr + prow + heads, k, mask=hmask)
        o = acc * gl.expand_dims(inv, 1)
        _wg_store_rows(op_ptr, (prow + heads) * 512, hmask, o, q_s)
        gl.store(lp_ptr + prow + heads, lse2, mask=hmask)


@gluon.jit
def _sparse_decode_wg_kernel(
    q_ptr, stride_qr, stride_qh,
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_u8, b_bf16, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr, ks_ptr,
    H, s_q, qk_scale,
    A_HAS_LEN: gl.constexpr, HAS_B: gl.constexpr, B_HAS_LEN: gl.constexpr,
    HAS_SINK: gl.constexpr, NSPLIT: gl.constexpr, SCALED: gl.constexpr,
    BT: gl.constexpr, STAGES: gl.constexpr, PIPE: gl.constexpr,
):
    """One program: a row, 64 heads (masked beyond ``H``), one split of the row's key tiles.
    Eight warps in a [4, 2] warp grid; see the module docstring for the schedule."""
    BH: gl.constexpr = 64
    gl.static_assert(gl.num_warps() == 8, "the [4, 2] warp grid needs num_warps=8")
    r = gl.program_id(0)
    hb = gl.program_id(1)
    sp = gl.program_id(2)
    bidx = r // s_q

    # Register layouts. GL: a [BT, 64] gather / dequant chunk, 16 contiguous bytes per thread
    # (one cp.async each); rows are spread exactly as in SCL, so converting the per-key
    # vectors between the two moves no data.
    GL: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    # L3: a [BT, 8, 64] tile of raw bytes (8 chunks of 64 columns), 16 contiguous bytes per
    # thread and chunk. (A warp over one key's 512 contiguous bytes, [1, 8, 4] threads, avoids
    # bank conflicts but measured slower: 41.1 vs 36.7 µs at B=64 / top-k 512, notes v8.)
    L3: gl.constexpr = gl.BlockedLayout([BT // 32, 4, 16], [4, 2, 4], [8, 1, 1], [2, 1, 0])
    SCL: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])
    ROWS: gl.constexpr = gl.SliceLayout(1, GL)
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BT // 2, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 256, 16])
    # Shared memory.
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH, 512], gl.bfloat16)
    K_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, 512], gl.bfloat16)
    P_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH, BT], gl.bfloat16)
    # Multi-buffered allocations take the layout of one buffer (rank one less).
    RAW_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    OK_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    q_s = gl.allocate_shared_memory(gl.bfloat16, [BH, 512], Q_SL)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [BT, 512], K_SL)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [BH, BT], P_SL)
    raw_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 8, 64],
                                      gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    rope_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, 64], RAW_SL)
    sc_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 8], RAW_SL)
    ok_s = gl.allocate_shared_memory(gl.int8, [STAGES, BT], OK_SL)

    a_row = a_idx + r.to(gl.int64) * stride_ar
    b_row = b_idx + r.to(gl.int64) * stride_br
    # Queries: one asynchronous copy, committed with the first tile's bytes.
    qh = hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, QL))
    qd = gl.arange(0, 512, layout=gl.SliceLayout(0, QL))
    q_rows = q_ptr + r.to(gl.int64) * stride_qr + qh * stride_qh
    _async_load(
        q_s, gl.expand_dims(q_rows, 1) + gl.expand_dims(qd, 0),
        mask=gl.expand_dims(qh < H, 1))
    # The row's lengths (read on the device) and this split's share [lo, hi) of its tiles.
    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp, A_HAS_LEN,
                                             HAS_B, B_HAS_LEN, NSPLIT, BT)

    m_i = gl.full([BH], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
    l_i = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, S_L))
    acc = gl.zeros([BH, 512], gl.float32, layout=O_L)
    s_zero = gl.zeros([BH, BT], gl.float32, layout=S_L)
    if PIPE:
        # Pipelined schedule: tile t + 1 is dequantized into registers while tile t's P V runs
        # on the tensor cores (the wgmma is asynchronous), and stored into the one K buffer once
        # that product is done. Raw stages are refilled STAGES tiles ahead.
        for j in gl.static_range(STAGES):
            idx = _wg_load_idx(a_row, n_a, b_row, n_b, lo + j, tiles_a, hi, BT, ROWS)
            _wg_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo + j, tiles_a, idx,
                      raw_s.index(j), rope_s.index(j), sc_s.index(j), ok_s.index(j), BT,
                      GL, L3, SCL)
            async_copy.commit_group()
        idx_next = _wg_load_idx(a_row, n_a, b_row, n_b, lo + STAGES, tiles_a, hi, BT, ROWS)
        async_copy.wait_group(STAGES - 1)
        _cta_barrier()
        k_s.store(_wg_dequant_regs(raw_s.index(0), rope_s.index(0), sc_s.index(0), BT, L3))
        valid = ok_s.index(0).load(gl.SliceLayout(0, S_L)) != 0
        for t in range(lo, hi):
            i = t - lo
            st = i % STAGES
            fence_async_shared()  # the K tile's generic stores -> wgmma's async-proxy reads
            _cta_barrier()  # ... by every thread; stage st (tile t) is consumed
            s_tok = warpgroup_mma(q_s, k_s.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            # While Q K^T runs: refill stage st (tile t's bytes are in registers or K already)
            # with tile t + STAGES, and load the indices of the one after.
            nxt = t + STAGES
            if nxt < hi:
                _wg_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, nxt, tiles_a,
                          idx_next, raw_s.index(st), rope_s.index(st), sc_s.index(st),
                          ok_s.index(st), BT, GL, L3, SCL)
            async_copy.commit_group()
            idx_next = _wg_load_idx(a_row, n_a, b_row, n_b, nxt + 1, tiles_a, hi, BT, ROWS)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            o_tok, m_i, l_i = _wg_softmax_pv(s, valid, m_i, l_i, acc, qk_scale, p_s, k_s, O_L)
            if t + 1 < hi:
                st1 = (i + 1) % STAGES
                async_copy.wait_group(STAGES - 1)  # this thread's copies of tile t + 1
                _cta_barrier()  # ... and every other thread's
                k_nxt = _wg_dequant_regs(raw_s.index(st1), rope_s.index(st1), sc_s.index(st1),
                                         BT, L3)
                valid = ok_s.index(st1).load(gl.SliceLayout(0, S_L)) != 0
                acc = warpgroup_mma_wait(0, deps=(o_tok,))
                _cta_barrier()  # both warpgroups are done reading k_s
                k_s.store(k_nxt)
            else:
                acc = warpgroup_mma_wait(0, deps=(o_tok,))
    else:
        # Sequential schedule: per tile, wait for its bytes, dequantize, Q K^T, softmax, P V.
        for j in gl.static_range(STAGES - 1):
            idx = _wg_load_idx(a_row, n_a, b_row, n_b, lo + j, tiles_a, hi, BT, ROWS)
            _wg_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo + j, tiles_a, idx,
                      raw_s.index(j), rope_s.index(j), sc_s.index(j), ok_s.index(j), BT,
                      GL, L3, SCL)
            async_copy.commit_group()
        idx_next = _wg_load_idx(a_row, n_a, b_row, n_b, lo + STAGES - 1, tiles_a, hi, BT, ROWS)
        for t in range(lo, hi):
            i = t - lo
            # Issue tile t + STAGES - 1 into the stage tile t - 1 used (every thread is past
            # its dequantization: the barrier before tile t - 1's products).
            nxt = t + STAGES - 1
            st_n = (i + STAGES - 1) % STAGES
            if nxt < hi:
                _wg_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, nxt, tiles_a,
                          idx_next, raw_s.index(st_n), rope_s.index(st_n), sc_s.index(st_n),
                          ok_s.index(st_n), BT, GL, L3, SCL)
            async_copy.commit_group()
            idx_next = _wg_load_idx(a_row, n_a, b_row, n_b, nxt + 1, tiles_a, hi, BT, ROWS)

            st = i % STAGES
            async_copy.wait_group(STAGES - 1)  # this thread's copies of tile t have landed
            _cta_barrier()  # ... and every other thread's
            _wg_dequant(raw_s.index(st), rope_s.index(st), sc_s.index(st), k_s, BT, L3)
            fence_async_shared()  # generic-proxy stores -> wgmma's async-proxy reads
            _cta_barrier()

            s_tok = warpgroup_mma(q_s, k_s.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            valid = ok_s.index(st).load(gl.SliceLayout(0, S_L)) != 0
            o_tok, m_i, l_i = _wg_softmax_pv(s, valid, m_i, l_i, acc, qk_scale, p_s, k_s, O_L)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            _cta_barrier()  # both warpgroups are done with k_s and p_s before they change
    async_copy.wait_group(0)

    _wg_epilogue(acc, m_i, l_i, r, hb, sp, bidx, H, s_q, sink_ptr, o_ptr, stride_or, stride_oh,
                 lse_ptr, op_ptr, lp_ptr, ks_ptr, q_s, O_L, HAS_SINK, NSPLIT, SCALED)


def launch_wg(q2: torch.Tensor, a: _Keys, bk: _Keys, a_len: torch.Tensor, b_len: torch.Tensor,
              sink: torch.Tensor, o2: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor,
              l_part: torch.Tensor, k_part: torch.Tensor, h: int, s_q: int, qk_scale: float,
              flags: dict[str, bool], has_sink: bool, nsplit: int, scaled: bool, block_t: int,
              stages: int, pipeline: bool = True) -> None:
    """Launch the kernel over ``rows x cdiv(h, 64) x nsplit`` programs (``sparse_decode``'s
    ``_Launch`` prepares every argument, the partial buffers and the combine)."""
    rows = q2.shape[0]
    grid = (rows, (h + 63) // 64, nsplit)
    _sparse_decode_wg_kernel[grid](
        q2, q2.stride(0), q2.stride(1),
        a.u8, a.bf, a.idx, a.idx.stride(1), a_len, a.topk, a.ps, a.pb,
        bk.u8, bk.bf, bk.idx, bk.idx.stride(1), b_len, bk.topk, bk.ps, bk.pb,
        sink, o2, o2.stride(0), o2.stride(1), lse, o_part, l_part, k_part,
        h, s_q, qk_scale, **flags, HAS_SINK=has_sink, NSPLIT=nsplit, SCALED=scaled,
        BT=block_t, STAGES=stages, PIPE=pipeline, num_warps=8,
    )


# --- registration as an experiment (``DecodeConfig(variant="wg")``) -----------------------------
# Moved out of the shipped package: SGLang 0.5.23's hook points that reach dsv4_kernels are its
# sm_120 fallbacks only, so on sm_90 this kernel serves no request (FlashMLA does). Side by side
# on an H200 with FlashMLA see docs/kernels-notes.md ("issue 29").

# "wg" at BT 64 / 2 raw stages: 217.6 KB (Q 64 + K 64 + P 8 + two stages of raw bytes 2 x
# 40.6 KB), Triton 3.6 and 3.9, sm_90.
WG_SMEM = 218 * 1024
# Raw-byte stages of wg that fit 227 KB next to Q, the K tile and P (Triton 3.6, sm_90:
# 217.6 KB at BT 64 / 2 stages, 177.8 KB at BT 32 / 4 stages).
WG_MAX_STAGES = {64: 2, 32: 4}
WG_TILES = (64, 2, 8)


def gluon_refusal(q: torch.Tensor, caches: tuple[torch.Tensor, ...], page_bytes: tuple[int, ...],
                  block_t: int, stages: int, warps: int, variant: str = "wg") -> str | None:
    """Why the Gluon ``wg`` (or ``ws``) kernel cannot run these inputs, or None when it can.
    The checks on the inputs come first, so that they give their own reason on any device."""
    from dsv4_kernels._runtime import device_arch, device_max_shared, interpreting

    if variant == "ws":
        from .ws_decode import WS_SMEM, WS_TILES

        if (block_t, stages, warps) != WS_TILES:
            return ("variant 'ws' takes only block_t 64, num_stages 3 (its ring of quarter "
                    "tiles) and 8 consumer warps (what fits 227 KB of shared memory); got "
                    f"block_t {block_t}, num_stages {stages}, num_warps {warps}")
    elif block_t not in WG_MAX_STAGES or not 2 <= stages <= WG_MAX_STAGES[block_t] \
            or warps != 8:
        return (f"variant 'wg' takes block_t 64 with num_stages 2, or block_t 32 with "
                f"num_stages 2-4, and 8 warps (what fits 227 KB of shared memory); got "
                f"block_t {block_t}, num_stages {stages}, num_warps {warps}")
    if any(pb % 16 for pb in page_bytes) or any(t.data_ptr() % 16 for t in (q, *caches)):
        return (f"variant '{variant}' copies keys in 16-byte pieces, so page bytes "
                f"({list(page_bytes)}) "
                "must be multiples of 16 (SGLang's padding of pages to 576 bytes gives that) "
                "and the cache and query tensors 16-byte aligned")
    if interpreting() or q.device.type != "cuda":
        return (f"variant '{variant}' is a Gluon kernel for sm_90 GPUs; the Triton interpreter "
                "cannot run it (use local, pf, full or dsplit)")
    arch = device_arch(q)
    ws_ok = hasattr(gl, "warp_specialize")
    if arch != 90 or (variant == "ws" and not ws_ok):
        return (f"variant '{variant}' needs wgmma (sm_90) and Triton's Gluon"
                f"{' with warp specialization' if variant == 'ws' else ''}; this device is "
                f"sm_{arch}")
    if variant == "ws":
        from .ws_decode import WS_SMEM

        if device_max_shared(q) < WS_SMEM:
            return (f"variant 'ws' needs {WS_SMEM} bytes of shared memory per block; this "
                    f"device offers {device_max_shared(q)}")
    return None


def _launch_registered(launch: Any, x: dict[str, Any]) -> None:
    a, bk = x["a"], x["bk"]
    refusal = gluon_refusal(x["q2"], (a.u8, bk.u8), (a.pb, bk.pb), launch.block_t,
                            launch.num_stages, launch.num_warps, "wg")
    if refusal:
        raise ValueError(refusal)
    launch_wg(x["q2"], a, bk, x["a_len"], x["b_len"], x["sink"], x["o2"], x["lse"],
              x["o_part"], x["l_part"], x["k_part"], launch.h, launch.s_q, launch.qk_scale,
              x["flags"], launch.sink is not None, x["nsplit"], x["scale"]["SCALED"],
              launch.block_t, launch.num_stages, launch.cfg.pipeline)


register_variant("wg", WG_TILES, True, _launch_registered, block_h=64)
