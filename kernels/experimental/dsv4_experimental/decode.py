"""Decode experiments: ``staged`` and ``gp``, registered with
``dsv4_kernels.sparse_decode.register_variant`` at import.

* ``staged``: every key of a row dequantized once into a whole-batch bf16 scratch by one launch
  (``_stage_kernel``), then an attention whose tile loads Triton pipelines into shared memory.
  ``local`` (shipped) does the same inside one launch and was faster on the H200 (B=64/512:
  52.5-54.0 vs 57.5-58.0 µs, notes v6).
* ``gp``: the fused gather in 64-column chunks, pipelined with cp.async; as fast as staged at
  B=64 without its scratch, never faster than wg/ws on sm_90, and 196 KB does not fit sm_120.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from dsv4_kernels.decode_common import _keys_of, _model1_slots, _split_range
from dsv4_kernels.sparse_decode import (
    _attend_full_tile,
    _load_q_chunks,
    _load_q_full,
    _stage_buffers,
    _stage_gather,
    _stage_put,
    _store_chunk,
    _store_full,
    register_variant,
)


@triton.jit
def _gp_chunk(raw, e, DT: tl.constexpr):
    """One FP8 chunk [BT, 64] times its UE8M0 scales [BT] (exact in bf16: a power of two)."""
    scale = (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    return (raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, None]).to(DT)


@triton.jit
def _gp_tile(u8, bf, i_row, t, n, ps, pb, q0, q1, q2, q3, q4, q5, q6, q7, m_i, l_i,
             a0, a1, a2, a3, a4, a5, a6, a7, qk_scale, BT: tl.constexpr, DT: tl.constexpr,
             PREC: tl.constexpr):
    """One tile of ``gp``: every load first (indices, then seven FP8 chunks, their scales and the
    rope), so the software pipeliner can issue them stages ahead; then eight 64-wide products
    per step, accumulated in eight [BH, 64] chunks."""
    offs = t * BT + tl.arange(0, BT)
    idx = tl.load(i_row + offs, mask=offs < n, other=-1)
    valid = idx >= 0
    base, sbase = _model1_slots(idx, ps, pb)
    d = tl.arange(0, 64)
    vm = valid[:, None]
    r0 = tl.load(u8 + base[:, None] + d[None, :], mask=vm, other=0)
    r1 = tl.load(u8 + base[:, None] + (64 + d)[None, :], mask=vm, other=0)
    r2 = tl.load(u8 + base[:, None] + (128 + d)[None, :], mask=vm, other=0)
    r3 = tl.load(u8 + base[:, None] + (192 + d)[None, :], mask=vm, other=0)
    r4 = tl.load(u8 + base[:, None] + (256 + d)[None, :], mask=vm, other=0)
    r5 = tl.load(u8 + base[:, None] + (320 + d)[None, :], mask=vm, other=0)
    r6 = tl.load(u8 + base[:, None] + (384 + d)[None, :], mask=vm, other=0)
    rope = tl.load(bf + (base // 2 + 224)[:, None] + d[None, :], mask=vm, other=0.0).to(DT)
    k0 = _gp_chunk(r0, tl.load(u8 + sbase, mask=valid, other=0), DT)
    k1 = _gp_chunk(r1, tl.load(u8 + sbase + 1, mask=valid, other=0), DT)
    k2 = _gp_chunk(r2, tl.load(u8 + sbase + 2, mask=valid, other=0), DT)
    k3 = _gp_chunk(r3, tl.load(u8 + sbase + 3, mask=valid, other=0), DT)
    k4 = _gp_chunk(r4, tl.load(u8 + sbase + 4, mask=valid, other=0), DT)
    k5 = _gp_chunk(r5, tl.load(u8 + sbase + 5, mask=valid, other=0), DT)
    k6 = _gp_chunk(r6, tl.load(u8 + sbase + 6, mask=valid, other=0), DT)
    s = tl.dot(q0, tl.trans(k0), input_precision=PREC)
    s = tl.dot(q1, tl.trans(k1), s, input_precision=PREC)
    s = tl.dot(q2, tl.trans(k2), s, input_precision=PREC)
    s = tl.dot(q3, tl.trans(k3), s, input_precision=PREC)
    s = tl.dot(q4, tl.trans(k4), s, input_precision=PREC)
    s = tl.dot(q5, tl.trans(k5), s, input_precision=PREC)
    s = tl.dot(q6, tl.trans(k6), s, input_precision=PREC)
    s = tl.dot(q7, tl.trans(rope), s, input_precision=PREC)
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pd = p.to(DT)
    a0 = tl.dot(pd, k0, a0 * alpha[:, None], input_precision=PREC)
    a1 = tl.dot(pd, k1, a1 * alpha[:, None], input_precision=PREC)
    a2 = tl.dot(pd, k2, a2 * alpha[:, None], input_precision=PREC)
    a3 = tl.dot(pd, k3, a3 * alpha[:, None], input_precision=PREC)
    a4 = tl.dot(pd, k4, a4 * alpha[:, None], input_precision=PREC)
    a5 = tl.dot(pd, k5, a5 * alpha[:, None], input_precision=PREC)
    a6 = tl.dot(pd, k6, a6 * alpha[:, None], input_precision=PREC)
    a7 = tl.dot(pd, rope, a7 * alpha[:, None], input_precision=PREC)
    return m_new, l_i, a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _sparse_decode_gp_kernel(
    q_ptr, stride_qr, stride_qh,
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_u8, b_bf16, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr,
    H, s_q, qk_scale,
    A_HAS_LEN: tl.constexpr, HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr, NSPLIT: tl.constexpr,
    BH: tl.constexpr, BT: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr,
):
    """Fused gather + attention in 64-column chunks, loads pipelined ``STAGES`` tiles ahead.

    Unlike ``full`` (one [BT, 8, 64] gather converted in registers), each chunk is a plain
    [BT, 64] gather that Triton can copy asynchronously into shared memory, then dequantize on
    the way to the tensor cores; no scratch buffer, only the cache's own bytes are read.
    """
    r = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    bidx = r // s_q
    if DOT_F32:
        DT: tl.constexpr = tl.float32
        PREC: tl.constexpr = "ieee"
    else:
        DT: tl.constexpr = tl.bfloat16
        PREC: tl.constexpr = "tf32"
    heads = hb * BH + tl.arange(0, BH)
    hmask = heads < H
    q0, q1, q2, q3, q4, q5, q6, q7 = _load_q_chunks(q_ptr, r.to(tl.int64) * stride_qr, heads,
                                                    hmask, stride_qh, DT)
    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp,
                                             A_HAS_LEN, HAS_B, B_HAS_LEN, NSPLIT, BT)
    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    a0 = tl.zeros([BH, 64], tl.float32)
    a1 = tl.zeros([BH, 64], tl.float32)
    a2 = tl.zeros([BH, 64], tl.float32)
    a3 = tl.zeros([BH, 64], tl.float32)
    a4 = tl.zeros([BH, 64], tl.float32)
    a5 = tl.zeros([BH, 64], tl.float32)
    a6 = tl.zeros([BH, 64], tl.float32)
    a7 = tl.zeros([BH, 64], tl.float32)
    a_row = a_idx + r.to(tl.int64) * stride_ar
    for t in tl.range(lo, tl.minimum(hi, tiles_a), num_stages=STAGES):
        m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7 = _gp_tile(
            a_u8, a_bf16, a_row, t, n_a, a_ps, a_pb, q0, q1, q2, q3, q4, q5, q6, q7, m_i, l_i,
            a0, a1, a2, a3, a4, a5, a6, a7, qk_scale, BT, DT, PREC)
    if HAS_B:
        b_row = b_idx + r.to(tl.int64) * stride_br
        for t in tl.range(tl.maximum(lo, tiles_a) - tiles_a, hi - tiles_a, num_stages=STAGES):
            m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7 = _gp_tile(
                b_u8, b_bf16, b_row, t, n_b, b_ps, b_pb, q0, q1, q2, q3, q4, q5, q6, q7, m_i,
                l_i, a0, a1, a2, a3, a4, a5, a6, a7, qk_scale, BT, DT, PREC)

    has = l_i > 0.0
    safe_l = tl.where(has, l_i, 1.0)
    lse2 = tl.where(has, m_i + tl.math.log2(safe_l), float("-inf"))
    f = 1.0 / safe_l
    if NSPLIT == 1:
        lse = lse2 * 0.6931471805599453
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
            f = f * (1.0 / (1.0 + tl.exp(sink - lse)))
        f = tl.where(has, f, 0.0)
        tl.store(lse_ptr + bidx * H * s_q + heads * s_q + (r - bidx * s_q),
                 tl.where(has, lse, float("inf")), mask=hmask)
        dst = o_ptr
        row = r.to(tl.int64) * stride_or
        sh = stride_oh
    else:
        prow = (r * NSPLIT + sp).to(tl.int64) * H
        tl.store(lp_ptr + prow + heads, lse2, mask=hmask)
        dst = op_ptr
        row = prow * 512
        sh = 512
    fc = f[:, None]
    _store_chunk(dst, row, heads, hmask, sh, 0, a0 * fc)
    _store_chunk(dst, row, heads, hmask, sh, 1, a1 * fc)
    _store_chunk(dst, row, heads, hmask, sh, 2, a2 * fc)
    _store_chunk(dst, row, heads, hmask, sh, 3, a3 * fc)
    _store_chunk(dst, row, heads, hmask, sh, 4, a4 * fc)
    _store_chunk(dst, row, heads, hmask, sh, 5, a5 * fc)
    _store_chunk(dst, row, heads, hmask, sh, 6, a6 * fc)
    _store_chunk(dst, row, heads, hmask, sh, 7, a7 * fc)


@triton.jit
def _stage_kernel(
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_u8, b_bf16, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    kv_ptr, ok_ptr, s_q, A_PAD, T_PAD,
    A_HAS_LEN: tl.constexpr, HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr,
    BT: tl.constexpr, BG: tl.constexpr, LOAD_EV: tl.constexpr, STORE_EV: tl.constexpr,
):
    """Phase 1 of ``staged``: gather and dequantize ``BG`` keys of one row, once, into the
    row's contiguous [T_PAD, 512] tile buffer (SWA keys at ``[0, A_PAD)``, extra keys after).

    Only blocks inside the tiles phase 2 will read (``cdiv(len, BT) * BT`` per list) are
    written; invalid or out-of-range keys there become zero rows with ``ok = 0``, so phase 2
    needs neither the indices nor a mask on its loads.
    """
    r = tl.program_id(0)
    j0 = tl.program_id(1) * BG
    bidx = r // s_q
    n_a, n_b, _tiles_a, _lo, _hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, 0,
                                                A_HAS_LEN, HAS_B, B_HAS_LEN, 1, BT)
    u8, bf, ps, pb = _keys_of(j0 < A_PAD, a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb)
    if j0 < A_PAD:
        i_row = a_idx + r.to(tl.int64) * stride_ar
        loc = j0
        n = n_a
    else:
        i_row = b_idx + r.to(tl.int64) * stride_br
        loc = j0 - A_PAD
        n = n_b
    if loc < tl.cdiv(n, BT) * BT:
        at = r.to(tl.int64) * T_PAD + j0
        raw, scr, rope, valid = _stage_gather(u8, bf, i_row, loc, n, ps, pb, BG, LOAD_EV)
        _stage_put(raw, scr, rope, valid, kv_ptr + at * 512, ok_ptr + at, BG, STORE_EV)


@triton.jit
def _sparse_decode_staged_kernel(
    q_ptr, stride_qr, stride_qh, kv_ptr, ok_ptr,
    a_len, a_topk, b_len, b_topk,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr,
    H, s_q, qk_scale, A_PAD, T_PAD,
    A_HAS_LEN: tl.constexpr, HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr, NSPLIT: tl.constexpr,
    BH: tl.constexpr, BT: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr,
    LOAD_EV: tl.constexpr,
    SCALED: tl.constexpr, ks_ptr,
):
    """Phase 2 of ``staged``: attention over the row's contiguous dequantized tiles.

    The tile loads carry no indices and no data-dependent addresses, so Triton's software
    pipeliner can stream them into shared memory ``STAGES`` tiles ahead (cp.async) and feed
    both products from there: no [BT, 512] tile passes through registers, which is what
    capped the fused kernels (255 registers and spills, notes v4).
    """
    r = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    bidx = r // s_q
    if DOT_F32:
        DT: tl.constexpr = tl.float32
        PREC: tl.constexpr = "ieee"
    else:
        DT: tl.constexpr = tl.bfloat16
        PREC: tl.constexpr = "tf32"
    heads = hb * BH + tl.arange(0, BH)
    hmask = heads < H
    q = _load_q_full(q_ptr, r.to(tl.int64) * stride_qr, heads, hmask, stride_qh, DT)
    _n_a, _n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp,
                                               A_HAS_LEN, HAS_B, B_HAS_LEN, NSPLIT, BT)
    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, 512], tl.float32)
    kv_row = kv_ptr + r.to(tl.int64) * T_PAD * 512
    ok_row = ok_ptr + r.to(tl.int64) * T_PAD
    offs_t = tl.arange(0, BT)
    dd = tl.arange(0, 512)
    for t in tl.range(lo, hi, num_stages=STAGES):
        pos = tl.where(t < tiles_a, t * BT, A_PAD + (t - tiles_a) * BT)
        k = tl.load(kv_row + (pos + offs_t)[:, None] * 512 + dd[None, :],
                    eviction_policy=LOAD_EV).to(DT)
        valid = tl.load(ok_row + pos + offs_t) != 0
        m_i, l_i, acc = _attend_full_tile(q, k, valid, m_i, l_i, acc, qk_scale, DT, PREC)

    _store_full(acc, m_i, l_i, heads, hmask, r, sp, bidx, sink_ptr, o_ptr, stride_or, stride_oh,
                lse_ptr, op_ptr, lp_ptr, ks_ptr, H, s_q, HAS_SINK, NSPLIT, SCALED)


def _launch_staged(launch: Any, x: dict[str, Any]) -> None:
    a, bk, bt = x["a"], x["bk"], launch.block_t
    rows = x["q2"].shape[0]
    bg = launch._stage_block(min(bt, 32))
    a_pad = triton.cdiv(a.topk, bt) * bt
    t_pad = a_pad + triton.cdiv(bk.topk, bt) * bt
    kv, ok = _stage_buffers(rows * t_pad, x["q2"].device)
    ev = x["ev"]
    _stage_kernel[(rows, t_pad // bg)](
        a.u8, a.bf, a.idx, a.idx.stride(1), x["a_len"], a.topk, a.ps, a.pb,
        bk.u8, bk.bf, bk.idx, bk.idx.stride(1), x["b_len"], bk.topk, bk.ps, bk.pb,
        kv, ok, launch.s_q, a_pad, t_pad, **x["flags"], BT=bt, BG=bg,
        LOAD_EV="evict_first" if ev else "", STORE_EV="evict_last" if ev else "",
        num_warps=launch.cfg.stage_warps,
    )
    q2, o2 = x["q2"], x["o2"]
    _sparse_decode_staged_kernel[(rows, x["head_blocks"], x["nsplit"])](
        q2, q2.stride(0), q2.stride(1), kv, ok, x["a_len"], a.topk, x["b_len"], bk.topk,
        x["sink"], o2, o2.stride(0), o2.stride(1), x["lse"], x["o_part"], x["l_part"],
        launch.h, launch.s_q, launch.qk_scale, a_pad, t_pad, **x["flags"], **x["heads"],
        **x["scale"], STAGES=launch.num_stages, LOAD_EV="evict_first" if ev else "",
        num_warps=launch.num_warps,
    )


def _launch_gp(launch: Any, x: dict[str, Any]) -> None:
    a, bk, q2, o2 = x["a"], x["bk"], x["q2"], x["o2"]
    _sparse_decode_gp_kernel[(q2.shape[0], x["head_blocks"], x["nsplit"])](
        q2, q2.stride(0), q2.stride(1),
        a.u8, a.bf, a.idx, a.idx.stride(1), x["a_len"], a.topk, a.ps, a.pb,
        bk.u8, bk.bf, bk.idx, bk.idx.stride(1), x["b_len"], bk.topk, bk.ps, bk.pb,
        x["sink"], o2, o2.stride(0), o2.stride(1), x["lse"], x["o_part"], x["l_part"],
        launch.h, launch.s_q, launch.qk_scale, **x["flags"], **x["heads"],
        num_warps=launch.num_warps, num_stages=launch.num_stages, STAGES=launch.num_stages,
    )


register_variant("staged", (64, 2, 8), True, _launch_staged)
register_variant("gp", (32, 3, 8), False, _launch_gp)
