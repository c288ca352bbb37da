"""``pg``: the sparse-MLA decode with a pipelined gather (sm_120-sized: 61-82 KB), an experiment.

``import dsv4_experimental.pg`` registers it (``DecodeConfig(variant="pg")``). It is not
shipped: on the H200 proxy of sm_120 it is 1.4-2.3x slower than ``local`` on every call that
reaches the bundled kernel (docs/kernels-notes.md, "issue 29"), although its gathered tiles
are multi-buffered as intended; its test keeps that structure compiling for sm_120.

Why: in ``pf`` and ``local`` each key tile's index load -> gather -> dequantize -> two MMAs
chain is serial. Compiled for ``GPUTarget("cuda", 120, 32)``, a tile loop whose gather address
comes from an index load *inside* the same iteration gets one shared-memory buffer and a full
``async_wait`` before every tile at any ``num_stages``. Here the next tile's indices are loaded
one iteration ahead and carried through the loop, so Triton's software pipeliner can keep
``num_stages - 1`` gathered tiles in flight (cp.async into a ring of shared-memory buffers)
while the current tile is multiplied (two buffers and ``async_wait`` 2 at ``num_stages=3``,
three and 4 at 4, Triton 3.9 and 3.6). Two details make the pipeliner take it: the carried index
load is done in 16-bit halves (a load of 32 bits or more a thread is pipelined itself, and its
latency then cannot fit the one iteration the carry allows, so nothing is pipelined), and the
two caches are reached from one base pointer with per-key offsets (a select between two base
pointers loses the alignment facts, and with them the 16-byte copies cp.async needs).

Layout choices that keep the ring small enough for 101,376 B:

* The SWA list and the extra list are one virtual list of positions ``[0, n_a + n_b)``: a tile
  may hold keys of both, each key choosing its cache, page size and page bytes by a select
  (no branch in the loop, which the pipeliner cannot cross).
* Each key's 448 FP8 bytes are gathered as ``[BT, 8, 64]`` bytes (chunk 7 masked, zero) and its
  64 BF16 rope values separately as ``[BT, 64]``: 648 B a key a stage (the rope is never
  widened to 512 columns). ``Q K^T`` is two products (nope part over 512 columns whose last 64
  are zero in K, rope part over 64), and so is ``P V``; the output takes columns ``< 448`` from
  the first accumulator and ``448..511`` from the second.
* Grid ``(head blocks, rows, splits)``, head blocks fastest: the programs of one row run side
  by side and share its gathered keys through L2, and so do adjacent rows of one request
  (a prefill chunk's rows overlap in their SWA windows and much of their top-k).

The epilogue writes the final output and the sink-exclusive natural-log LSE (one split) or
power-of-two-scaled fp16 partials and a base-2 LSE for ``sparse_decode._combine_kernel``.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from dsv4_kernels.sparse_decode import register_variant


@triton.jit
def _idx16(ptr, pos, mask):
    """int32 slots read as two 16-bit halves: loads narrower than 32 bits a thread are left
    alone by Triton's pipeliner, so this index load stays a plain load whose result the loop
    carries (pipelined, its latency would have to fit inside one iteration, which the
    scheduler cannot satisfy: it then pipelines nothing)."""
    h = ptr.to(tl.pointer_type(tl.int16), bitcast=True) + pos * 2
    lo = tl.load(h, mask=mask, other=-1).to(tl.int32) & 0xFFFF
    hi = tl.load(h + 1, mask=mask, other=-1).to(tl.int32)
    return (hi << 16) | lo


@triton.jit
def _pg_idx(a_row, b_row, p0, n_a, n_tot, BT: tl.constexpr):
    """Slots of positions ``[p0, p0 + BT)`` of the virtual list (-1 past ``n_tot``) and whether
    each comes from the SWA list."""
    offs = p0 + tl.arange(0, BT)
    in_a = offs < n_a
    ia = _idx16(a_row, offs, in_a)
    ib = _idx16(b_row, offs - n_a, (offs >= n_a) & (offs < n_tot))
    return tl.where(in_a, ia, ib), in_a


@triton.jit
def _pg_offsets(idx, in_a, a_ps, a_pb, b_ps, b_pb, b_delta):
    """Byte offsets from the SWA cache's first byte of each key's 576 data bytes and of its 8
    scale bytes (``b_delta``: the extra cache's first byte minus the SWA cache's; one base
    pointer with per-key offsets keeps the compiler's alignment facts, which a select between
    two base pointers loses, and with them the cp.async copies)."""
    safe = tl.maximum(idx, 0)
    ps = tl.where(in_a, a_ps, b_ps)
    page = safe // ps
    off = safe - page * ps
    pstart = page.to(tl.int64) * tl.where(in_a, a_pb, b_pb) + tl.where(in_a, 0, b_delta)
    # page bytes are multiples of 16 (the launcher checks), 576 = 16 x 36, and the scale block
    # starts at ps x 576: told to the compiler, so the gathers are 16- and 8-byte copies (the
    # pipeliner turns only copies of 4 bytes or more into cp.async)
    base = tl.multiple_of(pstart + off * 576, 16)
    return base, tl.multiple_of(pstart + ps * 576 + off * 8, 8)


@triton.jit
def _pg_scales(a_u8, idx, in_a, a_ps, a_pb, b_ps, b_pb, b_delta):
    """The 7 UE8M0 scale bytes of each key (byte 8 masked): a plain load the loop carries a
    tile ahead (its mask makes it a one-byte load, which the pipeliner leaves alone)."""
    c = tl.arange(0, 8)
    _, sbase = _pg_offsets(idx, in_a, a_ps, a_pb, b_ps, b_pb, b_delta)
    return tl.load(a_u8 + sbase[:, None] + c[None, :], mask=(idx >= 0)[:, None] & (c < 7)[None, :],
                   other=0)


@triton.jit
def _pg_store(acc_n, acc_r, m_i, l_i, heads, hmask, r, sp, bidx, sink_ptr, o_ptr, stride_or,
              stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, H, s_q, HAS_SINK: tl.constexpr,
              NSPLIT: tl.constexpr, SCALED: tl.constexpr):
    """Final output + LSE (one split) or a split's partial, as ``sparse_decode._store_full``
    writes them, from the two accumulators (nope columns < 448, rope columns 448..511)."""
    dd = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    has = l_i > 0.0
    safe_l = tl.where(has, l_i, 1.0)
    f = 1.0 / safe_l
    lse2 = tl.where(has, m_i + tl.math.log2(safe_l), float("-inf"))
    nmask = hmask[:, None] & (dd < 448)[None, :]
    if NSPLIT == 1:
        lse = lse2 * 0.6931471805599453
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
            f = f / (1.0 + tl.exp(sink - lse))
        f = tl.where(has, f, 0.0)
        lse = tl.where(has, lse, float("inf"))
        row = o_ptr + r.to(tl.int64) * stride_or + heads[:, None] * stride_oh
        tl.store(row + dd[None, :], (acc_n * f[:, None]).to(o_ptr.dtype.element_ty), mask=nmask)
        tl.store(row + 448 + dr[None, :], (acc_r * f[:, None]).to(o_ptr.dtype.element_ty),
                 mask=hmask[:, None])
        tl.store(lse_ptr + bidx * H * s_q + heads * s_q + (r - bidx * s_q), lse, mask=hmask)
    else:
        prow = (r * NSPLIT + sp).to(tl.int64) * H
        if SCALED:  # see _store_full: a power of two brings each head's maximum into (0.5, 1]
            amax = tl.maximum(tl.max(tl.abs(acc_n), axis=1), tl.max(tl.abs(acc_r), axis=1)) * f
            k = tl.ceil(tl.math.log2(tl.where(amax > 0.0, amax, 1.0)))
            k = tl.minimum(tl.maximum(k, -126.0), 126.0)
            f = f * tl.math.exp2(-k)
            tl.store(ks_ptr + prow + heads, k, mask=hmask)
        prow_o = op_ptr + (prow + heads[:, None]) * 512
        tl.store(prow_o + dd[None, :], (acc_n * f[:, None]).to(op_ptr.dtype.element_ty),
                 mask=nmask)
        tl.store(prow_o + 448 + dr[None, :], (acc_r * f[:, None]).to(op_ptr.dtype.element_ty),
                 mask=hmask[:, None])
        tl.store(lp_ptr + prow + heads, lse2, mask=hmask)


@triton.jit
def _sparse_decode_pg_kernel(
    q_ptr, stride_qr, stride_qh,
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_delta, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr,
    H, s_q, qk_scale,
    A_HAS_LEN: tl.constexpr, HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr, NSPLIT: tl.constexpr,
    BH: tl.constexpr, BT: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr,
    SCALED: tl.constexpr, ks_ptr,
):
    hb = tl.program_id(0)
    r = tl.program_id(1)
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
    dd = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    q_row = q_ptr + r.to(tl.int64) * stride_qr + heads[:, None] * stride_qh
    # K's nope tile is zero in columns 448..511, so Q's rope there adds nothing to Q K^T
    q_n = tl.load(q_row + dd[None, :], mask=hmask[:, None], other=0.0).to(DT)
    q_r = tl.load(q_row + 448 + dr[None, :], mask=hmask[:, None], other=0.0).to(DT)

    n_a = a_topk
    if A_HAS_LEN:
        n_a = tl.minimum(tl.load(a_len + bidx), a_topk)
    n_a = tl.maximum(n_a, 0)
    n_b = 0
    if HAS_B:
        n_b = b_topk
        if B_HAS_LEN:
            n_b = tl.minimum(tl.load(b_len + bidx), b_topk)
        n_b = tl.maximum(n_b, 0)
    n_tot = n_a + n_b
    per = tl.cdiv(tl.cdiv(n_tot, BT), NSPLIT)
    lo = sp * per
    hi = tl.minimum(lo + per, tl.cdiv(n_tot, BT))

    a_row = a_idx + r.to(tl.int64) * stride_ar
    b_row = b_idx + r.to(tl.int64) * stride_br
    col = tl.arange(0, 8)[:, None] * 64 + tl.arange(0, 64)[None, :]  # [8, 64]
    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc_n = tl.zeros([BH, 512], tl.float32)
    acc_r = tl.zeros([BH, 64], tl.float32)
    idx, in_a = _pg_idx(a_row, b_row, lo * BT, n_a, n_tot, BT)
    scr = _pg_scales(a_u8, idx, in_a, a_ps, a_pb, b_ps, b_pb, b_delta)
    for t in tl.range(lo, hi, num_stages=STAGES):
        # the next tile's slots and scale bytes, loop-carried: what lets the pipeliner issue
        # this tile's gather stages ahead (an index load in the same iteration as its gather
        # pins the gathered tile to one buffer and a full wait)
        nidx, nin_a = _pg_idx(a_row, b_row, (t + 1) * BT, n_a, n_tot, BT)
        nscr = _pg_scales(a_u8, nidx, nin_a, a_ps, a_pb, b_ps, b_pb, b_delta)
        valid = idx >= 0
        base, _ = _pg_offsets(idx, in_a, a_ps, a_pb, b_ps, b_pb, b_delta)
        raw = tl.load(a_u8 + base[:, None, None] + col[None, :, :],
                      mask=valid[:, None, None] & (col < 448)[None], other=0)
        rope = tl.load(a_bf16 + tl.multiple_of(base // 2 + 224, 8)[:, None] + dr[None, :],
                       mask=valid[:, None], other=0.0)
        # UE8M0: the byte is the fp32 exponent field; a power of two, so the product is exact
        # in bf16 too (no fp32 [BT, 512] intermediate)
        sc = (scr.to(tl.int32) << 23).to(tl.float32, bitcast=True).to(DT)
        k_n = tl.reshape(raw.to(tl.float8e4nv, bitcast=True).to(DT) * sc[:, :, None], (BT, 512))
        k_r = rope.to(DT)
        s = tl.dot(q_n, tl.trans(k_n), input_precision=PREC)
        s = tl.dot(q_r, tl.trans(k_r), s, input_precision=PREC)
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pd = p.to(DT)
        acc_n = tl.dot(pd, k_n, acc_n * alpha[:, None], input_precision=PREC)
        acc_r = tl.dot(pd, k_r, acc_r * alpha[:, None], input_precision=PREC)
        m_i = m_new
        idx = nidx
        in_a = nin_a
        scr = nscr

    _pg_store(acc_n, acc_r, m_i, l_i, heads, hmask, r, sp, bidx, sink_ptr, o_ptr, stride_or,
              stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, H, s_q, HAS_SINK, NSPLIT, SCALED)


def _launch_pg(launch: Any, x: dict[str, Any]) -> None:
    """Launch ``pg`` for ``x["q2"]``'s rows (the ``sparse_decode._Launch`` fields give the
    tiles)."""
    q2, a, bk, o2 = x["q2"], x["a"], x["bk"], x["o2"]
    for t in (q2, a.u8, bk.u8):
        if t.data_ptr() % 16:
            raise ValueError("variant 'pg' tells the compiler its copies are 16-byte aligned: "
                             "the query and cache tensors must be 16-byte aligned")
    if a.pb % 16 or bk.pb % 16:
        raise ValueError(f"variant 'pg' needs page bytes that are multiples of 16, got "
                         f"{a.pb} and {bk.pb}")
    rows, nsplit = q2.shape[0], x["nsplit"]
    grid = (triton.cdiv(launch.h, launch.block_h), rows, nsplit)
    _sparse_decode_pg_kernel[grid](
        q2, q2.stride(0), q2.stride(1),
        a.u8, a.bf, a.idx, a.idx.stride(1), x["a_len"], a.topk, a.ps, a.pb,
        bk.u8.data_ptr() - a.u8.data_ptr(), bk.idx, bk.idx.stride(1), x["b_len"], bk.topk,
        bk.ps, bk.pb, x["sink"], o2, o2.stride(0), o2.stride(1), x["lse"], x["o_part"],
        x["l_part"], launch.h, launch.s_q, launch.qk_scale, **x["flags"], **x["heads"],
        **x["scale"], STAGES=launch.num_stages, num_warps=launch.num_warps,
    )


register_variant("pg", (32, 3, 8), True, _launch_pg)
