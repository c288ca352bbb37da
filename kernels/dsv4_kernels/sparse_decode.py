"""Sparse-MLA decode over the MODEL1 FP8 KV cache (DeepSeek-V4), in Triton.

Why this exists: SGLang 0.5.23's sm_120 fallback (``flash_mla_sm120_triton``) runs one program
per (request, head) on CUDA cores, dequantizing every KV row once per head; its split-K peer
(``dsv4/triton_sparse_decode``) shares few heads per tile. Here one program owns a row and a
block of up to 64 heads, so each gathered KV tile is loaded and dequantized once for all of
them, and both products (``Q K^T`` and ``P V``) run on tensor cores through ``tl.dot``.

Design (see ``../shared/research/kernels.md`` sections 1.2, 5.3, 6):

* Keys are the SWA index list followed by the "extra" (compressed) index list, one
  concatenated range processed in one launch, as FlashMLA schedules it.
* Each row's valid lengths are read on the device; the range is cut into ``NSPLIT`` equal
  shares of the row's *valid* tiles (adaptive split-K), so short rows cost little and idle
  splits exit at once. The grid depends only on static shapes: capture-safe, no host sync.
* Online softmax in base 2; splits write fp32 partial O and LSE that a combine kernel merges
  with a log-sum-exp; one split writes the result directly.
* Output convention of FlashMLA: ``out [B, s_q, H, 512]`` bf16, ``lse [B, H, s_q]`` fp32 natural
  log that *excludes* the sink; the sink scales the output by ``1 / (1 + exp(sink - lse))``;
  rows without keys give ``out = 0`` and ``lse = +inf``.
* Tiles: ``BH`` heads x ``BT`` tokens x 512. The dequantized K tile doubles as V.
* Four shipped variants (:class:`DecodeConfig`), picked by :func:`choose_variant` from static
  shapes and the device's shared memory: ``pf`` and ``local`` on sm_120 (the deploy target,
  the only part the SGLang hook routes here), ``dsplit``/``local``/``full`` elsewhere; pieces
  all variants share in ``decode_common.py``. Variants no dispatch picks live in
  ``kernels/experimental`` (the sm_90 Gluon kernels ``wg`` and ``ws`` among them: no SGLang
  entry point on sm_90 reaches this package) and plug in through :func:`register_variant`.
  Measurements: docs/kernels-notes.md.

Past 400 lines (about 1,250): the four Triton variants (``dsplit``, ``full``, ``pf``, ``local``)
with their tile helpers, the combine kernel, then the host side (configs, dispatch, launch). The
host side is the seam to split along, left for a change that reruns the kernels on a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from ._runtime import device_arch, device_max_shared, device_sms, interpreting
from .decode_common import LOG2E, _Keys, _keys_of, _model1_slots, _split_range, page_log2
from .layout import BYTES_PER_TOKEN, HEAD_DIM, flat_bytes, model1_geometry


@triton.jit
def _nope_chunk(u8_ptr, base, sbase, valid, C: tl.constexpr, DT: tl.constexpr):
    """Columns [64C, 64C+64) of a gathered tile: FP8 E4M3 times its UE8M0 scale, as DT."""
    d = tl.arange(0, 64)
    raw = tl.load(u8_ptr + base[:, None] + (C * 64 + d)[None, :], mask=valid[:, None], other=0)
    e = tl.load(u8_ptr + sbase + C, mask=valid, other=0)
    # UE8M0: the byte is the fp32 exponent field, so shifting it into place decodes 2^(e-127);
    # a power of two makes the product exact in bf16 as well as fp32.
    scale = (e.to(tl.int32) << 23).to(tl.float32, bitcast=True).to(DT)
    return raw.to(tl.float8e4nv, bitcast=True).to(DT) * scale[:, None]


@triton.jit
def _rope_chunk(bf16_ptr, base, valid, DT: tl.constexpr):
    """Columns [448, 512) of a gathered tile: the 64 BF16 rope values (bytes 448..575)."""
    d = tl.arange(0, 64)
    return tl.load(bf16_ptr + (base // 2 + 224)[:, None] + d[None, :], mask=valid[:, None],
                   other=0.0).to(DT)


@triton.jit
def _kv_chunk(u8_ptr, bf16_ptr, base, sbase, valid, c, DT: tl.constexpr):
    """Chunk ``c`` (a runtime value, 0..7) of a gathered tile: FP8 chunk or the rope chunk."""
    if c < 7:
        x = _nope_chunk(u8_ptr, base, sbase, valid, c, DT)
    else:
        x = _rope_chunk(bf16_ptr, base, valid, DT)
    return x


@triton.jit
def _attend_tile(
    u8_ptr, bf16_ptr, idx_row_ptr, t_start, n_valid, page_size, page_bytes,
    q0, q1, q2, q3, q4, q5, q6, q7, m_i, l_i, a0, a1, a2, a3, c0, qk_scale,
    BT: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """Gather BT tokens and run one online-softmax step for BH heads on half of the V columns.

    ``Q K^T`` needs all 512 columns, streamed as eight 64-wide chunks (seven FP8 chunks with
    their own scale, then the BF16 rope chunk) so that no [BT, 512] gather with per-element
    64-bit addresses is ever live; this program then accumulates ``P V`` only for chunks
    ``c0 .. c0+3`` (re-read from L1), which halves the fp32 accumulator. Both changes remove the
    register spills of the first version (notes v1, v2).
    """
    offs_t = t_start + tl.arange(0, BT)
    in_range = offs_t < n_valid
    idx = tl.load(idx_row_ptr + offs_t, mask=in_range, other=-1)
    valid = in_range & (idx >= 0)
    base, sbase = _model1_slots(idx, page_size, page_bytes)
    s = tl.dot(q0, tl.trans(_nope_chunk(u8_ptr, base, sbase, valid, 0, DT)),
               input_precision=PREC)
    s = tl.dot(q1, tl.trans(_nope_chunk(u8_ptr, base, sbase, valid, 1, DT)), s,
               input_precision=PREC)
    s = tl.dot(q2, tl.trans(_nope_chunk(u8_ptr, base, sbase, valid, 2, DT)), s,
               input_precision=PREC)
    s = tl.dot(q3, tl.trans(_nope_chunk(u8_ptr, base, sbase, valid, 3, DT)), s,
               input_precision=PREC)
    s = tl.dot(q4, tl.trans(_nope_chunk(u8_ptr, base, sbase, valid, 4, DT)), s,
               input_precision=PREC)
    s = tl.dot(q5, tl.trans(_nope_chunk(u8_ptr, base, sbase, valid, 5, DT)), s,
               input_precision=PREC)
    s = tl.dot(q6, tl.trans(_nope_chunk(u8_ptr, base, sbase, valid, 6, DT)), s,
               input_precision=PREC)
    s = tl.dot(q7, tl.trans(_rope_chunk(bf16_ptr, base, valid, DT)), s, input_precision=PREC)
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pd = p.to(DT)
    a0 = tl.dot(pd, _kv_chunk(u8_ptr, bf16_ptr, base, sbase, valid, c0, DT),
                a0 * alpha[:, None], input_precision=PREC)
    a1 = tl.dot(pd, _kv_chunk(u8_ptr, bf16_ptr, base, sbase, valid, c0 + 1, DT),
                a1 * alpha[:, None], input_precision=PREC)
    a2 = tl.dot(pd, _kv_chunk(u8_ptr, bf16_ptr, base, sbase, valid, c0 + 2, DT),
                a2 * alpha[:, None], input_precision=PREC)
    a3 = tl.dot(pd, _kv_chunk(u8_ptr, bf16_ptr, base, sbase, valid, c0 + 3, DT),
                a3 * alpha[:, None], input_precision=PREC)
    return m_new, l_i, a0, a1, a2, a3


@triton.jit
def _store_chunk(ptr, row_off, heads, hmask, stride_h, C: tl.constexpr, x):
    d = tl.arange(0, 64)
    tl.store(ptr + row_off + heads[:, None] * stride_h + (C * 64 + d)[None, :],
             x.to(ptr.dtype.element_ty), mask=hmask[:, None])


@triton.jit
def _load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, C: tl.constexpr, DT: tl.constexpr):
    d = tl.arange(0, 64)
    return tl.load(q_ptr + row_off + heads[:, None] * stride_qh + (C * 64 + d)[None, :],
                   mask=hmask[:, None], other=0.0).to(DT)


@triton.jit
def _load_q_full(q_ptr, row_off, heads, hmask, stride_qh, DT: tl.constexpr):
    """A row's queries for ``heads`` as one [BH, 512] tile (full-width variants)."""
    dd = tl.arange(0, 512)
    return tl.load(q_ptr + row_off + heads[:, None] * stride_qh + dd[None, :],
                   mask=hmask[:, None], other=0.0).to(DT)


@triton.jit
def _load_q_chunks(q_ptr, row_off, heads, hmask, stride_qh, DT: tl.constexpr):
    """A row's queries for ``heads`` as eight [BH, 64] column chunks (seven nope, one rope)."""
    return (_load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, 0, DT),
            _load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, 1, DT),
            _load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, 2, DT),
            _load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, 3, DT),
            _load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, 4, DT),
            _load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, 5, DT),
            _load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, 6, DT),
            _load_q_chunk(q_ptr, row_off, heads, hmask, stride_qh, 7, DT))


@triton.jit
def _store_full(acc, m_i, l_i, heads, hmask, r, sp, bidx, sink_ptr, o_ptr, stride_or, stride_oh,
                lse_ptr, op_ptr, lp_ptr, ks_ptr, H, s_q, HAS_SINK: tl.constexpr,
                NSPLIT: tl.constexpr, SCALED: tl.constexpr):
    """Write a [BH, 512] result: final output and sink-exclusive LSE (one split), or the split's
    normalized partial and base-2 LSE for the combine. Partials take ``op_ptr``'s dtype (see
    ``DecodeConfig.partials``). ``SCALED``: each head's partial is divided by a power of two
    that brings its largest magnitude into (0.5, 1] before the (fp16) store, and the exponent
    goes to ``ks_ptr``: fp16's 11-bit significand without its 65504 ceiling."""
    dd = tl.arange(0, 512)
    has = l_i > 0.0
    safe_l = tl.where(has, l_i, 1.0)
    # one factor a row, not a division an element: a full-range fp32 division is four
    # instructions an element (notes v13)
    f = 1.0 / safe_l
    lse2 = tl.where(has, m_i + tl.math.log2(safe_l), float("-inf"))
    if NSPLIT == 1:
        lse = lse2 * 0.6931471805599453
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
            f = f / (1.0 + tl.exp(sink - lse))
        # a row without keys has a zero accumulator (every P was 0 against finite values)
        o = acc * tl.where(has, f, 0.0)[:, None]
        lse = tl.where(has, lse, float("inf"))
        tl.store(o_ptr + r.to(tl.int64) * stride_or + heads[:, None] * stride_oh + dd[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=hmask[:, None])
        tl.store(lse_ptr + bidx * H * s_q + heads * s_q + (r - bidx * s_q), lse, mask=hmask)
    else:
        prow = (r * NSPLIT + sp).to(tl.int64) * H
        if SCALED:
            # the normalized rows' maximum, taken on acc (a positive factor keeps the order)
            amax = tl.max(tl.abs(acc), axis=1) * f
            # k = 0 for an all-zero head (log2 1); clamped so that 2^-k stays a normal fp32
            # number. A power of two: the scaling adds no rounding beyond exp2's own, which is
            # far below fp16's.
            k = tl.ceil(tl.math.log2(tl.where(amax > 0.0, amax, 1.0)))
            k = tl.minimum(tl.maximum(k, -126.0), 126.0)
            f = f * tl.math.exp2(-k)
            tl.store(ks_ptr + prow + heads, k, mask=hmask)
        o = acc * f[:, None]
        tl.store(op_ptr + (prow + heads[:, None]) * 512 + dd[None, :],
                 o.to(op_ptr.dtype.element_ty), mask=hmask[:, None])
        tl.store(lp_ptr + prow + heads, lse2, mask=hmask)


@triton.jit
def _sparse_decode_dsplit_kernel(
    q_ptr, stride_qr, stride_qh,
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_u8, b_bf16, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr,
    H, s_q, qk_scale,
    A_HAS_LEN: tl.constexpr, HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr, NSPLIT: tl.constexpr,
    BH: tl.constexpr, BT: tl.constexpr, DOT_F32: tl.constexpr,
):
    r = tl.program_id(0)
    hb = tl.program_id(1) // 2
    half = tl.program_id(1) % 2  # which 256 output columns this program accumulates
    c0 = half * 4
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
    a_row = a_idx + r.to(tl.int64) * stride_ar
    for t in range(lo, tl.minimum(hi, tiles_a)):
        m_i, l_i, a0, a1, a2, a3 = _attend_tile(
            a_u8, a_bf16, a_row, t * BT, n_a, a_ps, a_pb, q0, q1, q2, q3, q4, q5, q6, q7,
            m_i, l_i, a0, a1, a2, a3, c0, qk_scale, BT, DT, PREC)
    if HAS_B:
        b_row = b_idx + r.to(tl.int64) * stride_br
        for t in range(tl.maximum(lo, tiles_a), hi):
            m_i, l_i, a0, a1, a2, a3 = _attend_tile(
                b_u8, b_bf16, b_row, (t - tiles_a) * BT, n_b, b_ps, b_pb,
                q0, q1, q2, q3, q4, q5, q6, q7, m_i, l_i, a0, a1, a2, a3, c0, qk_scale,
                BT, DT, PREC)

    has = l_i > 0.0
    safe_l = tl.where(has, l_i, 1.0)
    lse2 = tl.where(has, m_i + tl.math.log2(safe_l), float("-inf"))
    if NSPLIT == 1:
        lse = lse2 * 0.6931471805599453
        f = 1.0 / safe_l
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
            f = f * (1.0 / (1.0 + tl.exp(sink - lse)))
        f = tl.where(has, f, 0.0)[:, None]
        lse = tl.where(has, lse, float("inf"))
        o_row = r.to(tl.int64) * stride_or
        _store_chunk(o_ptr, o_row + c0 * 64, heads, hmask, stride_oh, 0, a0 * f)
        _store_chunk(o_ptr, o_row + c0 * 64, heads, hmask, stride_oh, 1, a1 * f)
        _store_chunk(o_ptr, o_row + c0 * 64, heads, hmask, stride_oh, 2, a2 * f)
        _store_chunk(o_ptr, o_row + c0 * 64, heads, hmask, stride_oh, 3, a3 * f)
        tl.store(lse_ptr + bidx * H * s_q + heads * s_q + (r - bidx * s_q), lse,
                 mask=hmask & ((heads * 0 + half) == 0))
    else:
        prow = (r * NSPLIT + sp).to(tl.int64) * H * 512
        f = (1.0 / safe_l)[:, None]
        _store_chunk(op_ptr, prow + c0 * 64, heads, hmask, 512, 0, a0 * f)
        _store_chunk(op_ptr, prow + c0 * 64, heads, hmask, 512, 1, a1 * f)
        _store_chunk(op_ptr, prow + c0 * 64, heads, hmask, 512, 2, a2 * f)
        _store_chunk(op_ptr, prow + c0 * 64, heads, hmask, 512, 3, a3 * f)
        tl.store(lp_ptr + (r * NSPLIT + sp).to(tl.int64) * H + heads, lse2,
                 mask=hmask & ((heads * 0 + half) == 0))


@triton.jit
def _load_kv_tile(
    u8_ptr,
    bf16_ptr,
    idx_row_ptr,
    t_start,
    n_valid,
    page_size,
    page_bytes,
    BT: tl.constexpr,
    DT: tl.constexpr,
):
    """Gather and dequantize BT tokens of a MODEL1 cache into a [BT, 512] tile of dtype DT."""
    offs_t = t_start + tl.arange(0, BT)
    in_range = offs_t < n_valid
    idx = tl.load(idx_row_ptr + offs_t, mask=in_range, other=-1)
    valid = in_range & (idx >= 0)
    base, sbase = _model1_slots(idx, page_size, page_bytes)
    c = tl.arange(0, 8)
    d = tl.arange(0, 64)
    col = c[:, None] * 64 + d[None, :]  # [8, 64]: chunks 0..6 fp8 nope, chunk 7 bf16 rope
    is_nope = col < 448
    v3 = valid[:, None, None]
    raw = tl.load(u8_ptr + base[:, None, None] + col[None, :, :], mask=v3 & is_nope[None], other=0)
    nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    sc_raw = tl.load(u8_ptr + sbase[:, None] + c[None, :], mask=valid[:, None] & (c < 7)[None, :],
                     other=0)
    # UE8M0: the byte is the fp32 exponent field, so shifting it into place decodes 2^(e-127).
    sc = (sc_raw.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    rope_elem = base // 2 - 224  # bf16 element index of column 448 is base/2 + 224
    rope = tl.load(bf16_ptr + rope_elem[:, None, None] + col[None, :, :],
                   mask=v3 & (col >= 448)[None], other=0.0).to(tl.float32)
    k3 = tl.where(is_nope[None], nope * sc[:, :, None], rope)
    k = tl.reshape(k3, (BT, 512)).to(DT)
    return k, valid


@triton.jit
def _attend_full_tile(q, k, valid, m_i, l_i, acc, qk_scale, DT: tl.constexpr,
                      PREC: tl.constexpr):
    """One online-softmax step (base 2) of the BH query heads against a [BT, 512] K=V tile."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DT), k, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _sparse_decode_full_kernel(
    q_ptr, stride_qr, stride_qh,
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_u8, b_bf16, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr,
    H, s_q, qk_scale,
    A_HAS_LEN: tl.constexpr, HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr, NSPLIT: tl.constexpr,
    BH: tl.constexpr, BT: tl.constexpr, DOT_F32: tl.constexpr,
    SCALED: tl.constexpr, ks_ptr,
):
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

    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp,
                                             A_HAS_LEN, HAS_B, B_HAS_LEN, NSPLIT, BT)

    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, 512], tl.float32)
    a_row = a_idx + r.to(tl.int64) * stride_ar
    for t in range(lo, tl.minimum(hi, tiles_a)):
        k, valid = _load_kv_tile(a_u8, a_bf16, a_row, t * BT, n_a, a_ps, a_pb, BT, DT)
        m_i, l_i, acc = _attend_full_tile(q, k, valid, m_i, l_i, acc, qk_scale, DT, PREC)
    if HAS_B:
        b_row = b_idx + r.to(tl.int64) * stride_br
        for t in range(tl.maximum(lo, tiles_a), hi):
            k, valid = _load_kv_tile(b_u8, b_bf16, b_row, (t - tiles_a) * BT, n_b, b_ps, b_pb,
                                     BT, DT)
            m_i, l_i, acc = _attend_full_tile(q, k, valid, m_i, l_i, acc, qk_scale, DT, PREC)

    _store_full(acc, m_i, l_i, heads, hmask, r, sp, bidx, sink_ptr, o_ptr, stride_or, stride_oh,
                lse_ptr, op_ptr, lp_ptr, ks_ptr, H, s_q, HAS_SINK, NSPLIT, SCALED)


@triton.jit
def _pf_load_idx(a_row, b_row, t, tiles_a, n_a, n_b, hi, BT: tl.constexpr):
    """Indices of tile ``t`` of the concatenated SWA + extra range (-1 past the valid end)."""
    offs = tl.arange(0, BT)
    if t < tiles_a:
        pos = t * BT + offs
        idx = tl.load(a_row + pos, mask=pos < tl.where(t < hi, n_a, 0), other=-1)
    else:
        pos = (t - tiles_a) * BT + offs
        idx = tl.load(b_row + pos, mask=pos < tl.where(t < hi, n_b, 0), other=-1)
    return idx


@triton.jit
def _pf_gather(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, idx,
               BT: tl.constexpr):
    """Issue the loads of one MODEL1 tile: FP8 bytes, scale bytes and BF16 rope (raw, unconverted).

    Returned tensors are consumed one loop iteration later, so their memory latency overlaps the
    matrix products of the current tile (a register double buffer; notes v4).
    """
    u8, bf, ps, pb = _keys_of(t < tiles_a, a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb)
    valid = idx >= 0
    base, sbase = _model1_slots(idx, ps, pb)
    c = tl.arange(0, 8)
    d = tl.arange(0, 64)
    col = c[:, None] * 64 + d[None, :]
    v3 = valid[:, None, None]
    raw = tl.load(u8 + base[:, None, None] + col[None, :, :], mask=v3 & (col < 448)[None], other=0)
    scr = tl.load(u8 + sbase[:, None] + c[None, :], mask=valid[:, None] & (c < 7)[None, :], other=0)
    rope = tl.load(bf + (base // 2 - 224)[:, None, None] + col[None, :, :],
                   mask=v3 & (col >= 448)[None], other=0.0)
    return raw, scr, rope


@triton.jit
def _pf_dequant(raw, scr, rope, BT: tl.constexpr, DT: tl.constexpr):
    """[BT, 512] K=V tile from the raw loads: FP8 x 2^(e-127) for columns < 448, rope after."""
    sc = (scr.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sc[:, :, None]
    # chunk 7 of ``raw`` and chunks 0-6 of ``rope`` were loaded masked as zeros
    k3 = nope + rope.to(tl.float32)
    return tl.reshape(k3, (BT, 512)).to(DT)


@triton.jit
def _sparse_decode_pf_kernel(
    q_ptr, stride_qr, stride_qh,
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_u8, b_bf16, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr,
    H, s_q, qk_scale,
    A_HAS_LEN: tl.constexpr, HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr, NSPLIT: tl.constexpr,
    BH: tl.constexpr, BT: tl.constexpr, DOT_F32: tl.constexpr, PREFETCH: tl.constexpr,
    SCALED: tl.constexpr, ks_ptr,
):
    """Full-width variant with one tile of loads in flight ahead of the matrix products.

    One loop walks the concatenated SWA + extra tiles, choosing the cache per tile, so the
    next tile's indices and raw bytes can be requested while the current tile is multiplied.
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

    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp,
                                             A_HAS_LEN, HAS_B, B_HAS_LEN, NSPLIT, BT)

    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, 512], tl.float32)
    a_row = a_idx + r.to(tl.int64) * stride_ar
    b_row = b_idx + r.to(tl.int64) * stride_br
    if PREFETCH:
        idx = _pf_load_idx(a_row, b_row, lo, tiles_a, n_a, n_b, hi, BT)
        raw, scr, rope = _pf_gather(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo,
                                    tiles_a, idx, BT)
        idx = _pf_load_idx(a_row, b_row, lo + 1, tiles_a, n_a, n_b, hi, BT)
        for t in range(lo, hi):
            k = _pf_dequant(raw, scr, rope, BT, DT)
            raw, scr, rope = _pf_gather(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb,
                                        t + 1, tiles_a, idx, BT)
            idx = _pf_load_idx(a_row, b_row, t + 2, tiles_a, n_a, n_b, hi, BT)
            # The score mask lives in the MMA layout; re-reading this tile's indices (L1-hot)
            # is cheaper than carrying them across iterations in that layout (spills).
            v_cur = _pf_load_idx(a_row, b_row, t, tiles_a, n_a, n_b, hi, BT) >= 0
            m_i, l_i, acc = _attend_full_tile(q, k, v_cur, m_i, l_i, acc, qk_scale, DT, PREC)
    else:
        for t in range(lo, hi):
            idx = _pf_load_idx(a_row, b_row, t, tiles_a, n_a, n_b, hi, BT)
            raw, scr, rope = _pf_gather(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t,
                                        tiles_a, idx, BT)
            k = _pf_dequant(raw, scr, rope, BT, DT)
            m_i, l_i, acc = _attend_full_tile(q, k, idx >= 0, m_i, l_i, acc, qk_scale, DT, PREC)

    _store_full(acc, m_i, l_i, heads, hmask, r, sp, bidx, sink_ptr, o_ptr, stride_or, stride_oh,
                lse_ptr, op_ptr, lp_ptr, ks_ptr, H, s_q, HAS_SINK, NSPLIT, SCALED)


@triton.jit
def _stage_gather(u8, bf, i_row, loc, n, ps, pb, BG: tl.constexpr, LOAD_EV: tl.constexpr):
    """Issue the loads of keys ``[loc, loc + BG)`` of one index list: raw FP8 bytes [BG, 8, 64]
    (chunk 7 masked off), their scale bytes [BG, 8] and the BF16 rope [BG, 64], unconverted.
    Keys past ``n`` or with index -1 load as zeros and come back with ``valid = False``."""
    offs = loc + tl.arange(0, BG)
    idx = tl.load(i_row + offs, mask=offs < n, other=-1)
    valid = idx >= 0
    base, sbase = _model1_slots(idx, ps, pb)
    c = tl.arange(0, 8)
    d = tl.arange(0, 64)
    col = c[:, None] * 64 + d[None, :]
    raw = tl.load(u8 + base[:, None, None] + col[None, :, :],
                  mask=valid[:, None, None] & (col < 448)[None], other=0, eviction_policy=LOAD_EV)
    scr = tl.load(u8 + sbase[:, None] + c[None, :], mask=valid[:, None] & (c < 7)[None, :],
                  other=0)
    rope = tl.load(bf + (base // 2 + 224)[:, None] + d[None, :], mask=valid[:, None],
                   other=0.0, eviction_policy=LOAD_EV)
    return raw, scr, rope, valid


@triton.jit
def _stage_put(raw, scr, rope, valid, kv_dst, ok_dst, BG: tl.constexpr, STORE_EV: tl.constexpr):
    """Write gathered keys dequantized (bf16, or fp32 under the interpreter) as contiguous rows
    of 512 at ``kv_dst`` (FP8 x 2^(e-127) for columns < 448, rope after) and a validity byte
    each at ``ok_dst``; invalid keys were loaded as zeros, so they become zero rows."""
    c = tl.arange(0, 8)
    d = tl.arange(0, 64)
    col = c[:, None] * 64 + d[None, :]
    nope_col = (col < 448)[None]
    sc = (scr.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sc[:, :, None]
    dst = kv_dst + tl.arange(0, BG).to(tl.int64) * 512
    tl.store(dst[:, None, None] + col[None, :, :], nope.to(kv_dst.dtype.element_ty),
             mask=nope_col, eviction_policy=STORE_EV)
    tl.store(dst[:, None] + 448 + d[None, :], rope.to(kv_dst.dtype.element_ty),
             eviction_policy=STORE_EV)
    tl.store(ok_dst + tl.arange(0, BG), valid.to(tl.int8))


@triton.jit
def _stage_tile(a_u8, a_bf16, a_row, n_a, a_ps, a_pb, b_u8, b_bf16, b_row, n_b, b_ps, b_pb,
                t, tiles_a, g0, BT: tl.constexpr, BG: tl.constexpr, LOAD_EV: tl.constexpr):
    """:func:`_stage_gather` for keys ``[g0, g0 + BG)`` of tile ``t`` of the concatenated range
    (SWA tiles, then the extra ones); a tile past the end loads nothing."""
    u8, bf, ps, pb = _keys_of(t < tiles_a, a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb)
    if t < tiles_a:
        i_row = a_row
        loc = t * BT
        n = n_a
    else:
        i_row = b_row
        loc = (t - tiles_a) * BT
        n = n_b
    return _stage_gather(u8, bf, i_row, loc + g0, n, ps, pb, BG, LOAD_EV)


@triton.jit
def _sparse_decode_local_kernel(
    q_ptr, stride_qr, stride_qh,
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_u8, b_bf16, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    kv_ptr, ok_ptr,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr,
    H, s_q, qk_scale,
    A_HAS_LEN: tl.constexpr, HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr, NSPLIT: tl.constexpr,
    BH: tl.constexpr, BT: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr,
    ROUND: tl.constexpr, BG: tl.constexpr, LOAD_EV: tl.constexpr, STORE_EV: tl.constexpr,
    SCALED: tl.constexpr, ks_ptr,
):
    """``staged`` in one launch: each program stages its own keys into a private slot of
    ``ROUND`` tiles, then attends over them, round after round.

    Why: in two launches the 42 MB scratch of B=64 / top-k 512 is written in full before it is
    read, so it falls out of L2 (hit rate 30%, notes v5) and costs DRAM twice. Here a slot
    is read back by the program that wrote it a few microseconds earlier, and all slots in flight
    together take programs x ROUND x BT x 1 KB of L2. The barriers order one program's stores
    before its pipelined reads, and its reads before the next round overwrites the slot.
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
    slot = ((r * tl.num_programs(1) + hb) * NSPLIT + sp).to(tl.int64) * (ROUND * BT)
    kv_slot = kv_ptr + slot * 512
    ok_slot = ok_ptr + slot
    heads = hb * BH + tl.arange(0, BH)
    hmask = heads < H
    q = _load_q_full(q_ptr, r.to(tl.int64) * stride_qr, heads, hmask, stride_qh, DT)
    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp,
                                             A_HAS_LEN, HAS_B, B_HAS_LEN, NSPLIT, BT)
    a_row = a_idx + r.to(tl.int64) * stride_ar
    b_row = b_idx + r.to(tl.int64) * stride_br
    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, 512], tl.float32)
    offs_t = tl.arange(0, BT)
    dd = tl.arange(0, 512)
    for c0 in range(lo, hi, ROUND):
        c1 = tl.minimum(c0 + ROUND, hi)
        for t in range(c0, c1):
            at = (t - c0) * BT
            for g in tl.static_range(BT // BG):
                raw, scr, rope, valid = _stage_tile(
                    a_u8, a_bf16, a_row, n_a, a_ps, a_pb, b_u8, b_bf16, b_row, n_b, b_ps, b_pb,
                    t, tiles_a, g * BG, BT, BG, LOAD_EV)
                _stage_put(raw, scr, rope, valid, kv_slot + (at + g * BG) * 512,
                           ok_slot + at + g * BG, BG, STORE_EV)
        tl.debug_barrier()  # every thread's slot stores precede the reads below
        for t in tl.range(0, c1 - c0, num_stages=STAGES):
            k = tl.load(kv_slot + (t * BT + offs_t)[:, None] * 512 + dd[None, :],
                        eviction_policy=LOAD_EV).to(DT)
            valid = tl.load(ok_slot + t * BT + offs_t) != 0
            m_i, l_i, acc = _attend_full_tile(q, k, valid, m_i, l_i, acc, qk_scale, DT, PREC)
        tl.debug_barrier()  # the next round overwrites the slot only after every read

    _store_full(acc, m_i, l_i, heads, hmask, r, sp, bidx, sink_ptr, o_ptr, stride_or, stride_oh,
                lse_ptr, op_ptr, lp_ptr, ks_ptr, H, s_q, HAS_SINK, NSPLIT, SCALED)


@triton.jit
def _combine_kernel(
    op_ptr, lp_ptr, ks_ptr, sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, H, s_q,
    HAS_SINK: tl.constexpr, NSPLIT: tl.constexpr, BH: tl.constexpr, DC: tl.constexpr,
    SCALED: tl.constexpr,
):
    """Merge split partials of (row, head block, column block) with a log-sum-exp (base 2)."""
    r = tl.program_id(0)
    hb = tl.program_id(1)
    cb = tl.program_id(2)
    bidx = r // s_q
    heads = hb * BH + tl.arange(0, BH)
    hmask = heads < H
    dd = cb * DC + tl.arange(0, DC)
    if HAS_SINK:  # loaded first: ptxas otherwise issues it after the weights' exp2 (SASS)
        sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
    gmax = tl.full([BH], float("-inf"), tl.float32)
    # static_range: the splits' loads are independent, so unrolled they are all in flight at
    # once instead of one memory latency per split (NSPLIT <= 16).
    for s in tl.static_range(NSPLIT):
        lp = tl.load(lp_ptr + (r * NSPLIT + s).to(tl.int64) * H + heads, mask=hmask,
                     other=float("-inf"))
        gmax = tl.maximum(gmax, lp)
    gm = tl.where(gmax == float("-inf"), 0.0, gmax)
    tot = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, DC], tl.float32)
    for s in tl.static_range(NSPLIT):
        prow = (r * NSPLIT + s).to(tl.int64) * H
        lp = tl.load(lp_ptr + prow + heads, mask=hmask, other=float("-inf"))
        w = tl.math.exp2(lp - gm)
        tot += w
        o = tl.load(op_ptr + (prow + heads[:, None]) * 512 + dd[None, :], mask=hmask[:, None],
                    other=0.0).to(tl.float32)
        if SCALED:  # undo the store's power-of-two scale inside the weight
            w = w * tl.math.exp2(tl.load(ks_ptr + prow + heads, mask=hmask, other=0.0))
        acc += w[:, None] * o
    has = tot > 0.0
    safe = tl.where(has, tot, 1.0)
    lse = (tl.math.log2(safe) + gm) * 0.6931471805599453
    f = 1.0 / safe  # one factor a row (_store_full says why)
    if HAS_SINK:
        f = f / (1.0 + tl.exp(sink - lse))
    out = acc * tl.where(has, f, 0.0)[:, None]
    lse = tl.where(has, lse, float("inf"))
    tl.store(o_ptr + r.to(tl.int64) * stride_or + heads[:, None] * stride_oh + dd[None, :],
             out.to(o_ptr.dtype.element_ty), mask=hmask[:, None])
    tl.store(lse_ptr + bidx * H * s_q + heads * s_q + (r - bidx * s_q), lse,
             mask=hmask & ((heads * 0 + cb) == 0))


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Kernel variant and tiles. ``None`` fields are chosen from static shapes (``block_h``: at
    most 64 heads a program, 32 on 99 KB parts: :data:`SMALL_SMEM_BLOCK_H`).

    ``variant`` (the shipped ones; :func:`choose_variant` says which device takes which):
    ``"pf"`` (one program per row x head block, one loop over SWA + extra tiles with the next
    tile's indices and bytes loaded a step ahead; the only variant that fits sm_120's 99 KB),
    ``"dsplit"`` (two programs per row x head block, each accumulating 256 of the 512 output
    columns after a shared ``Q K^T``: for a handful of rows on large-shared-memory parts),
    ``"full"`` (pf's product without the prefetch, one [BT, 512] gather per tile; parts with
    160-200 KB), ``"local"`` (each program dequantizes ``stage_round`` tiles into a private
    L2-resident slot and attends over them with pipelined tile loads; sm_120 beyond a handful
    of programs, and parts of 200 KB or more). Experiments registered with
    :func:`register_variant` (``kernels/experimental``: ``wg``, ``ws``, ``pg``, ...) are
    accepted by name too.

    ``partials``: how split outputs travel to the combine. ``"fp16"`` (default where the
    variant's epilogue computes a per-head scale: :data:`SCALED_VARIANTS`) stores each head's
    partial scaled by a power of two into fp16 plus the exponent; ``"fp32"`` (default for
    dsplit) costs twice the bytes; ``"bf16"`` is a sweep knob only (its 8-bit significand fails
    the reference tolerance when splits nearly cancel).

    Sweep knobs (results do not depend on them beyond rounding): ``prefetch`` (pf),
    ``stage_block`` (keys per staging gather; local: one tile), ``stage_warps`` (experiments),
    ``stage_round`` (local: tiles per stage-then-attend round, default 2), ``l2_hints`` (stream
    the cache past L2 and keep the scratch in it), ``pipeline`` and ``pair`` (read by the
    experiments ``wg`` and ``ws``).
    """

    block_h: int | None = None
    block_t: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    nsplit: int | None = None
    variant: str | None = None
    prefetch: bool = True
    partials: str | None = None
    stage_block: int | None = None
    l2_hints: bool = True
    stage_warps: int = 4
    stage_round: int | None = None
    pipeline: bool = True
    pair: bool | None = None


DEFAULT_CONFIG = DecodeConfig()
# Default tiles per shipped variant: block_t, num_stages, num_warps (H200 sweeps,
# notes).
_VARIANT_TILES = {"full": (64, 1, 8), "dsplit": (32, 2, 8), "pf": (16, 1, 8),
                  "local": (64, 2, 8)}
# "full" at BT 64 needs 128 KB of shared memory on sm_90 and 192 KB on sm_120 (compiled with
# Triton 3.6 and 3.9); pf at BT 16 needs 82 KB on sm_120 with fp16 or fp32 partials (Triton
# 3.6; 80 KB on sm_90 with 16-bit partials, 128 KB with fp32 ones) and dsplit at BT 32 ~98 KB
# on sm_120.
_FULL_SMEM = 160 * 1024
# Heads a program on parts below _FULL_SMEM (sm_120's 99 KB), where pf runs. Compiled for sm_120
# with the pinned Triton (the CPU gate, kernels/tests/test_kernels_sm120_gate.py): at BH 64 /
# BT 16 / 8 warps pf needs 83,968 B of shared memory and 255 registers and spills 144 B a
# thread with split partials; at BH 32 it needs 50,176 B and 210 registers and at BH 16
# 33,280 B and 141, and neither spills (BT 32 or 4 warps spill 0.4-5.7 KB). H200 proxy of
# sm_120 (TRITON_OVERRIDE_ARCH=sm89, tools/sm120_proxy.py, notes "sm_120"): BH 16 leads where
# programs are few (B=1: 16.1 / 21.2 µs at top-k 512 / 1024 against 19.3 / 26.2 at BH 32),
# BH 32 elsewhere (B=8: 27.6 / 40.8 against 33.2 / 52.2).
SMALL_SMEM_BLOCK_H = 32
SMALL_SMEM_FEW_PROGRAMS = 4  # rows x head blocks of 32 up to which pf at BH 16 is taken
# Beyond those, sm_120 takes local at BH 32 / BT 32 / 2 stages / 8 warps: 67,584 B, 208
# registers, no spills on sm_120; on the proxy 108.5 / 188.0 µs at B=64 (top-k 512 / 1024)
# against 143.2 / 251.6 for pf at BH 32 and 113.1 / 191.6 for pf at BH 64 (which spills on
# sm_120); B=8 27.2 / 38.4 against 27.6 / 41.2 (tools/sm120_proxy.py, notes "sm_120").
SMALL_SMEM_LOCAL_BT = 32
# "local" at BT 64 / 2 stages: 192 KB (Q 64 KB + two 64 KB tiles) + scratch,
# Triton 3.6, sm_90.
_STAGED_SMEM = 200 * 1024
# Partial formats, and the variants whose epilogue (_store_full) can scale fp16 partials.
PARTIALS = ("fp32", "bf16", "fp16")
SCALED_VARIANTS = frozenset({"full", "pf", "local"})


@dataclasses.dataclass(frozen=True)
class Registered:
    """An experimental variant (``kernels/experimental``): its default tiles, whether its
    epilogue scales fp16 partials, and ``launch(launch, args)``, called with the
    :class:`_Launch` and a dict of the prepared launch arguments (see ``_Launch.rows``); it
    returns True when it merged the splits itself (no combine launch). ``block_h``: heads a
    program when the kernel has a fixed M (the wgmma grid's 64), else None."""

    tiles: tuple[int, int, int]
    scaled: bool
    launch: Callable[[Any, dict[str, Any]], bool | None]
    block_h: int | None = None


_REGISTERED: dict[str, Registered] = {}


def register_variant(name: str, tiles: tuple[int, int, int], scaled: bool,
                     launch: Callable[[Any, dict[str, Any]], bool | None],
                     block_h: int | None = None) -> None:
    """Make ``DecodeConfig(variant=name)`` run an experimental kernel (for benches and tests;
    the dispatcher never picks a registered variant, and the self-test never runs one)."""
    if name in _VARIANT_TILES:
        raise ValueError(f"{name!r} is a shipped variant; pick another name")
    _REGISTERED[name] = Registered(tiles, scaled, launch, block_h)


def _tiles(variant: str) -> tuple[int, int, int]:
    if variant in _VARIANT_TILES:
        return _VARIANT_TILES[variant]
    if variant in _REGISTERED:
        return _REGISTERED[variant].tiles
    raise ValueError(f"variant must be one of {sorted(_VARIANT_TILES)} (or a registered "
                     f"experiment: {sorted(_REGISTERED)}), got {variant!r}")


def _scaled(variant: str) -> bool:
    return variant in SCALED_VARIANTS or (variant in _REGISTERED and _REGISTERED[variant].scaled)


def available_variants(max_shared: int, arch: int | None = None) -> tuple[str, ...]:
    """Variants whose default tiles fit a device with ``max_shared`` bytes per block (``arch``,
    compute capability as 90, 120, ...: no shipped variant depends on it any more)."""
    del arch
    if max_shared >= _STAGED_SMEM:
        return ("full", "dsplit", "pf", "local")
    if max_shared >= _FULL_SMEM:
        return ("full", "dsplit", "pf")
    return ("dsplit", "pf")


def choose_variant(rows: int, head_blocks: int, sms: int, max_shared: int,
                   arch: int | None = None, pow2_pages: bool = True,
                   heads: int | None = None) -> tuple[str, int | None]:
    """Variant and block_t (None: the variant's default) from static shapes only (``heads``:
    the query heads, else ``head_blocks`` x 32; heads a program: :func:`pf_block_h`).
    ``arch`` and ``pow2_pages`` are accepted for the callers' sake; no shipped variant depends
    on them since the sm_90 Gluon kernels moved to ``kernels/experimental``.

    | device (opt-in shared memory per block)     | programs (rows x head blocks) | variant  |
    |---------------------------------------------|-------------------------------|----------|
    | < 160 KB (sm_120 RTX PRO 6000, sm_89)       | <= 4 of 32 heads              | pf, BH 16|
    | < 160 KB                                    | otherwise                     | local 32 |
    | >= 160 KB                                   | <= 4                          | dsplit 64|
    | >= 200 KB (sm_90, sm_100)                   | otherwise                     | local    |
    | 160-200 KB                                  | otherwise                     | full     |

    The H200 measurements behind each row are in docs/kernels-notes.md. ``local`` allocates a
    transient scratch of rows x splits x 2 tiles x 64 KB from the caller's allocator (the graph
    pool under capture).
    """
    del arch, pow2_pages
    if max_shared < _FULL_SMEM:
        few = _few_programs(rows, heads if heads is not None else head_blocks * 32)
        return ("pf", None) if few else ("local", SMALL_SMEM_LOCAL_BT)
    if rows * head_blocks <= 4:
        return "dsplit", 64
    return ("local" if max_shared >= _STAGED_SMEM else "full"), None


def pf_block_h(h: int, max_shared: int, want: int | None = None, rows: int | None = None) -> int:
    """Heads a program: ``want``, else 64, or below 160 KB of shared memory (sm_120)
    :data:`SMALL_SMEM_BLOCK_H`, and 16 when ``rows`` x head blocks of that size are at most
    :data:`SMALL_SMEM_FEW_PROGRAMS`; cut to the head count's power of two (at least 16, the
    MMA's M)."""
    cap = want or 64
    if not want and max_shared < _FULL_SMEM:
        cap = 16 if rows is not None and _few_programs(rows, h) else SMALL_SMEM_BLOCK_H
    return min(cap, max(16, triton.next_power_of_2(h)))


def _few_programs(rows: int, h: int) -> bool:
    """sm_120's small-grid case: at most SMALL_SMEM_FEW_PROGRAMS programs of 32 heads."""
    return rows * triton.cdiv(h, SMALL_SMEM_BLOCK_H) <= SMALL_SMEM_FEW_PROGRAMS


def dispatch_configs(max_shared: int, arch: int | None) -> tuple[DecodeConfig, ...]:
    """The configuration of every pick :func:`choose_variant` can make on a device, tiles as
    the launcher then sets them: what the self-test checks (with its own split counts)."""
    if max_shared < _FULL_SMEM:
        return (DecodeConfig(variant="pf", block_h=16),
                DecodeConfig(variant="local", block_h=SMALL_SMEM_BLOCK_H,
                             block_t=SMALL_SMEM_LOCAL_BT))
    return tuple(DecodeConfig(variant=v, block_t=64 if v == "dsplit" else None)
                 for v in dispatch_variants(max_shared, arch))


def dispatch_variants(max_shared: int, arch: int | None) -> tuple[str, ...]:
    """Every variant :func:`choose_variant` can pick on a device: what the self-test checks and
    the compile gate compiles (``arch``: accepted for the callers' sake)."""
    del arch
    if max_shared < _FULL_SMEM:
        return ("pf", "local")
    return ("dsplit", "local" if max_shared >= _STAGED_SMEM else "full")


def choose_nsplit(rows: int, head_blocks: int, max_tiles: int, sms: int,
                  small_smem: bool = False) -> int:
    """Splits per row so that rows x head blocks x splits roughly fills the GPU once.

    Uses static values only (batch, heads, the static top-k widths, SM count), so a CUDA graph
    captured for a batch size keeps a valid grid; the per-row share is re-cut on the device
    from the real lengths. ``small_smem`` (sm_120's dispatch): where one wave of programs
    would fill at most half the SMs, about two waves, keeping at least
    :data:`SMALL_SMEM_MIN_TILES` tiles a split. On the H200 proxy of sm_120 (8 real heads of
    a padded 64, B=64, local BH 16 / BT 32): 51.7 / 77.2 µs at 4 splits against 61.4 / 97.6 at
    the one-wave 2 and 60.3 / 85.9 at 8 (top-k 512 / 1024; tools/sm120_calls.py, notes
    "issue 29").
    """
    programs = max(1, rows * head_blocks)
    want = max(1, round(sms / programs))
    if small_smem and 2 * programs <= sms:
        want = max(want, min(round(2 * sms / programs), max_tiles // SMALL_SMEM_MIN_TILES))
    # Cap: every split adds an fp32 partial of H x 512 per row that the combine must read back.
    return int(max(1, min(want, max_tiles, 16)))


SMALL_SMEM_MIN_TILES = 4


def _as_cache_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    _, page_size, page_bytes = model1_geometry(cache)
    flat = flat_bytes(cache, page_bytes)
    return flat, flat.view(torch.bfloat16), page_size, page_bytes


def _check_indices(name: str, idx: torch.Tensor, b: int, s_q: int) -> torch.Tensor:
    if idx.dtype != torch.int32:
        raise ValueError(f"{name} must be int32 slots, got {idx.dtype}")
    if idx.dim() == 2:
        idx = idx.unsqueeze(1)
    if idx.dim() != 3 or idx.shape[0] != b or idx.shape[1] != s_q:
        raise ValueError(f"{name} must be [B={b}, s_q={s_q}, topk], got {tuple(idx.shape)}")
    if idx.stride(-1) != 1:
        idx = idx.contiguous()
    return idx


def sparse_mla_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
    real_heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode: ``(out [B, s_q, H, 512] bf16, lse [B, H, s_q] fp32)``.

    ``q`` is ``[B, s_q, H, 512]`` (or ``[B, H, 512]``); ``indices``/``extra_indices`` are int32
    physical slots (``page * page_size + offset``, -1 = invalid) ``[B, s_q, topk]``;
    ``topk_length``/``extra_topk_length`` are ``[B]`` int32 valid prefixes (``None`` = all).
    ``real_heads``: only heads ``[0, real_heads)`` of ``q`` hold queries (the rest is padding,
    as SGLang pads a rank's heads to 64 for its decode kernels); only those are computed, and
    the padded heads get what a head without keys gets: output 0, LSE +inf.
    """
    cfg = config or DEFAULT_CONFIG
    if q.dim() == 3:
        q = q.unsqueeze(1)
    if q.dim() != 4 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"q must be [B, s_q, H, {HEAD_DIM}], got {tuple(q.shape)}")
    b, s_q, h, _ = q.shape
    if real_heads is not None and not 1 <= real_heads <= h:
        raise ValueError(f"real_heads must be in [1, {h}] (the query's heads), got {real_heads}")
    hc = h if real_heads is None else real_heads  # the heads computed
    if q.stride(-1) != 1 or q.stride(1) != h * q.stride(2):
        q = q.contiguous()
    rows = b * s_q
    indices = _check_indices("indices", indices, b, s_q)
    a_u8, a_bf, a_ps, a_pb = _as_cache_views(k_cache)
    has_b = extra_k_cache is not None and extra_indices is not None
    if has_b:
        assert extra_k_cache is not None and extra_indices is not None
        extra_indices = _check_indices("extra_indices", extra_indices, b, s_q)
        b_u8, b_bf, b_ps, b_pb = _as_cache_views(extra_k_cache)
        b_topk = extra_indices.shape[-1]
    else:
        b_u8, b_bf, b_ps, b_pb, b_topk = a_u8, a_bf, a_ps, a_pb, 0
        extra_indices = indices
    if attn_sink is not None and attn_sink.numel() < hc:
        raise ValueError(f"attn_sink needs >= {hc} values (one per head), got {attn_sink.numel()}")
    for name, ln in (("topk_length", topk_length), ("extra_topk_length", extra_topk_length)):
        if ln is not None and (ln.dtype != torch.int32 or ln.numel() < b):
            raise ValueError(f"{name} must be int32 with >= {b} entries, got {ln.dtype} "
                             f"{tuple(ln.shape)}")

    max_shared = device_max_shared(q)
    block_h = pf_block_h(hc, max_shared, cfg.block_h, rows)
    head_blocks = triton.cdiv(hc, block_h)
    sms = device_sms(q)
    # Static choice from shapes and shared memory (choose_variant: 99 KB parts take pf or
    # local; larger ones dsplit for a handful of rows and local or full otherwise).
    pow2_pages = all(page_log2(ps) >= 0 for ps in (a_ps, b_ps))
    auto_variant, auto_bt = choose_variant(rows, head_blocks, sms, max_shared,
                                           device_arch(q), pow2_pages, heads=hc)
    variant = cfg.variant or auto_variant
    tiles = _tiles(variant)
    block_t = cfg.block_t or (auto_bt if variant == auto_variant and auto_bt else
                              tiles[0])
    num_stages = cfg.num_stages or tiles[1]
    num_warps = cfg.num_warps or tiles[2]
    col_blocks = 2 if variant == "dsplit" else 1
    fixed_bh = _REGISTERED[variant].block_h if variant in _REGISTERED else None
    if fixed_bh:  # an experiment with a fixed M (wgmma's 64); heads beyond h are masked
        block_h = fixed_bh
        head_blocks = triton.cdiv(hc, block_h)
    max_tiles = triton.cdiv(indices.shape[-1], block_t) + triton.cdiv(b_topk, block_t)

    out = torch.empty(b, s_q, h, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(b, h, s_q, dtype=torch.float32, device=q.device)
    q2 = q.view(rows, h, HEAD_DIM) if q.is_contiguous() else q.reshape(rows, h, HEAD_DIM)
    o2 = out.view(rows, h, HEAD_DIM)
    lists = (_Keys(a_u8, a_bf, indices, topk_length, indices.shape[-1], a_ps, a_pb),
             _Keys(b_u8, b_bf, extra_indices, extra_topk_length, b_topk, b_ps, b_pb))
    launch = _Launch(variant, has_b, attn_sink, hc, s_q, float(sm_scale) * LOG2E, block_h,
                     block_t, num_warps, num_stages, col_blocks, cfg)
    nsplit = cfg.nsplit or choose_nsplit(rows, head_blocks * col_blocks, max(1, max_tiles), sms,
                                         small_smem=max_shared < _FULL_SMEM)
    if hc == h:
        launch.rows(q2, lists[0], lists[1], o2, lse, nsplit)
        return out, lse
    # the kernels index the LSE as [B, heads computed, s_q] and the outputs by their strides
    lse_c = torch.empty(b, hc, s_q, dtype=torch.float32, device=q.device)
    launch.rows(q2, lists[0], lists[1], o2, lse_c, nsplit)
    out[:, :, hc:].zero_()
    lse[:, :hc].copy_(lse_c)
    lse[:, hc:].fill_(float("inf"))
    return out, lse


def _stage_buffers(keys: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for ``keys`` dequantized keys (rows of 512; fp32 under the interpreter, which
    cannot do bf16 arithmetic) and their validity bytes."""
    kv = torch.empty(keys * HEAD_DIM, dtype=torch.float32 if interpreting() else torch.bfloat16,
                     device=dev)
    return kv, torch.empty(keys, dtype=torch.int8, device=dev)


@dataclasses.dataclass(frozen=True)
class _Launch:
    """Everything but the rows: launches one variant (and the combine) for a run of rows."""

    variant: str
    has_b: bool
    sink: torch.Tensor | None
    h: int
    s_q: int
    qk_scale: float
    block_h: int
    block_t: int
    num_warps: int
    num_stages: int
    col_blocks: int
    cfg: DecodeConfig

    def _stage_block(self, default: int) -> int:
        """Keys per staging gather (``stage_block``, else ``default``); it must divide the tile."""
        bg = self.cfg.stage_block or default
        if bg > self.block_t or self.block_t % bg:
            raise ValueError(f"stage_block ({bg}) must divide block_t ({self.block_t})")
        return bg

    def _partials(self) -> str:
        """The split-partial format (``DecodeConfig.partials``), checked against the variant."""
        fmt = self.cfg.partials
        if fmt is None:
            return "fp16" if _scaled(self.variant) else "fp32"
        if fmt not in PARTIALS:
            raise ValueError(f"partials must be one of {list(PARTIALS)}, got {fmt!r}")
        if fmt == "fp16" and not _scaled(self.variant):
            raise ValueError(f"partials='fp16' needs a per-head scale that the {self.variant!r} "
                             f"epilogue does not compute (it has {sorted(SCALED_VARIANTS)}); "
                             "use 'fp32' or leave it None")
        return fmt

    def rows(self, q2: torch.Tensor, a: _Keys, bk: _Keys, o2: torch.Tensor, lse: torch.Tensor,
             nsplit: int) -> None:
        rows, h = q2.shape[0], self.h
        dev = q2.device
        fmt = self._partials()
        scaled = nsplit > 1 and fmt == "fp16"
        if nsplit > 1:
            o_part = torch.empty(rows * nsplit * h * HEAD_DIM, device=dev,
                                 dtype={"fp32": torch.float32, "bf16": torch.bfloat16,
                                        "fp16": torch.float16}[fmt])
            l_part = torch.empty(rows * nsplit * h, dtype=torch.float32, device=dev)
            k_part = torch.empty(rows * nsplit * h, dtype=torch.float32, device=dev) \
                if scaled else l_part
        else:
            o_part = l_part = k_part = lse  # unused placeholders
        scale = dict(SCALED=scaled, ks_ptr=k_part)
        dummy = lse
        sink = self.sink if self.sink is not None else dummy
        a_len = a.length if a.length is not None else dummy
        b_len = bk.length if bk.length is not None else dummy
        flags = dict(A_HAS_LEN=a.length is not None, HAS_B=self.has_b,
                     B_HAS_LEN=self.has_b and bk.length is not None)
        heads = dict(HAS_SINK=self.sink is not None, NSPLIT=nsplit, BH=self.block_h,
                     BT=self.block_t, DOT_F32=interpreting())
        head_blocks = triton.cdiv(h, self.block_h)
        bt = self.block_t
        ev = self.cfg.l2_hints and not interpreting()
        merged = False  # an experiment (ws) may merge a pair of splits itself
        if self.variant == "local":
            bg = self._stage_block(bt)
            max_tiles = triton.cdiv(a.topk, bt) + triton.cdiv(bk.topk, bt)
            want = 2 if self.cfg.stage_round is None else self.cfg.stage_round
            if want < 1:
                raise ValueError(f"stage_round must be >= 1 tile per round, got {want}")
            rnd = min(want, triton.cdiv(max_tiles, nsplit))
            kv, ok = _stage_buffers(rows * head_blocks * nsplit * rnd * bt, dev)
            _sparse_decode_local_kernel[(rows, head_blocks, nsplit)](
                q2, q2.stride(0), q2.stride(1),
                a.u8, a.bf, a.idx, a.idx.stride(1), a_len, a.topk, a.ps, a.pb,
                bk.u8, bk.bf, bk.idx, bk.idx.stride(1), b_len, bk.topk, bk.ps, bk.pb,
                kv, ok, sink, o2, o2.stride(0), o2.stride(1), lse, o_part, l_part,
                h, self.s_q, self.qk_scale, **flags, **heads, **scale,
                STAGES=self.num_stages, ROUND=rnd, BG=bg,
                LOAD_EV="evict_first" if ev else "", STORE_EV="evict_last" if ev else "",
                num_warps=self.num_warps,
            )
        elif self.variant in _REGISTERED:
            merged = bool(_REGISTERED[self.variant].launch(self, dict(
                q2=q2, a=a, bk=bk, o2=o2, lse=lse, o_part=o_part, l_part=l_part, k_part=k_part,
                scale=scale, sink=sink, a_len=a_len, b_len=b_len, flags=flags, heads=heads,
                head_blocks=head_blocks, nsplit=nsplit, ev=ev)))
        else:
            kernel = {"dsplit": _sparse_decode_dsplit_kernel, "full": _sparse_decode_full_kernel,
                      "pf": _sparse_decode_pf_kernel}[self.variant]
            extra: dict[str, object] = {}
            if self.variant == "pf":
                extra["PREFETCH"] = self.cfg.prefetch
            if _scaled(self.variant):
                extra.update(scale)
            kernel[(rows, self.col_blocks * head_blocks, nsplit)](
                q2, q2.stride(0), q2.stride(1),
                a.u8, a.bf, a.idx, a.idx.stride(1), a_len, a.topk, a.ps, a.pb,
                bk.u8, bk.bf, bk.idx, bk.idx.stride(1), b_len, bk.topk, bk.ps, bk.pb,
                sink, o2, o2.stride(0), o2.stride(1), lse, o_part, l_part,
                h, self.s_q, self.qk_scale, **flags, **heads,
                num_warps=self.num_warps, num_stages=self.num_stages, **extra,
            )
        if nsplit > 1 and not merged:
            bhc = combine_block_h(rows, h)
            _combine_kernel[(rows, triton.cdiv(h, bhc), 4)](
                o_part, l_part, k_part, sink, o2, o2.stride(0), o2.stride(1), lse, h, self.s_q,
                HAS_SINK=self.sink is not None, NSPLIT=nsplit, BH=bhc, DC=128, SCALED=scaled,
                num_warps=4,
            )


def combine_block_h(rows: int, h: int) -> int:
    """Heads per program of the split combine (each program merges 128 columns, 4 warps).

    At 8 heads a thread holds one 16-byte piece per split, and ptxas (Triton 3.6, sm_90) issues
    every load of the program before its first exp2: one memory round trip. At 16 heads it
    places the second half of the loads after the first half's arithmetic. Same-run H200 sweep
    (notes v10, ``tools/combine_sweep.py``): 8 heads is faster for small grids (B=8 / top-k
    1024: 20.9 against 22.4 µs; B=1: 18.0 against 18.6), 16 for large ones, whose 2048 programs
    at 8 heads cost more than the round trip saves (B=64 / top-k 512: 33.8 against 33.1).
    """
    return 8 if rows * triton.cdiv(h, 8) * 4 <= 1024 else 16


def roofline_bytes_flops(b: int, h: int, topk_total: int) -> tuple[float, float]:
    """Unique bytes (KV + Q + O + indices) and FLOPs of one decode step (kernels.md section 4)."""
    kv = b * topk_total * BYTES_PER_TOKEN
    qo = b * h * HEAD_DIM * 2 * 2
    idx = b * topk_total * 4
    flops = 2.0 * b * h * topk_total * (HEAD_DIM + HEAD_DIM)
    return float(kv + qo + idx), flops


__all__ = [
    "PARTIALS",
    "SCALED_VARIANTS",
    "SMALL_SMEM_BLOCK_H",
    "DecodeConfig",
    "available_variants",
    "choose_nsplit",
    "choose_variant",
    "combine_block_h",
    "dispatch_configs",
    "dispatch_variants",
    "pf_block_h",
    "register_variant",
    "roofline_bytes_flops",
    "sparse_mla_decode",
]
