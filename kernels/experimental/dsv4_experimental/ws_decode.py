"""The ``ws`` sparse-MLA decode variant: ``wg`` with a producer warpgroup (sm_90, Gluon).

Why: in ``wg`` the same eight warps gather, dequantize and run the products, with one K
buffer, so the dequantization sits on the critical path (ptxas schedules most of it after the
wait of ``P V``: notes v10). Here ``gl.warp_specialize`` splits the program, as
FlashMLA does, and two K buffers let the two halves run concurrently:

* a **producer** warpgroup (4 warps, 128 registers a thread) fills the K buffers in turn, a
  quarter tile (16 keys) at a time. The FP8 bytes of the next three quarters are in flight in
  a ring of three shared-memory stages (``cp.async``); a quarter is read into registers, its
  stage refilled at once, and it is converted (``cvt.rn.f16x2.e4m3x2`` times the power-of-two
  scale, exact) into the K buffer. The tile's bf16 ropes are copied straight into the K
  buffer. The ring is chunk-major ([chunk, key, 64 bytes]) so that a warp's accesses fill whole
  128-byte bank lines, in the ring and in the swizzled K tile alike;
* two **consumer** warpgroups (the default partition, 8 warps, 184 registers) run ``wg``'s
  ``Q K^T``, online softmax and ``P V`` on each full buffer and release it after ``P V``.

A full / empty mbarrier pair per K buffer hands tiles over. Each partition reads the row's
lengths and cuts its split itself, so the producer starts without waiting for a hand-over,
and the consumers copy Q after that cut, so that 64 KB of Q per program do not queue ahead of
the producer's first index and key loads (notes v11 has the measurements of each choice).

With exactly two splits (B=64 on an H200), a row's two programs run as one cluster of two CTAs
and merge their halves of the output in the kernel (``_pair_epilogue``), which saves the
combine launch: 30.3-30.6 against 32.4 µs at B=64 / top-k 512 (notes v12).

Shared memory at BT 64: Q 64 KB + two K tiles 128 KB + P 8 KB + the ring 21.4 KB = 222 KB.
Key ranges, split-K, partials, combine and outputs are ``wg``'s (``sparse_decode.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.runtime import driver

from dsv4_kernels.decode_common import _Keys, page_log2
from dsv4_kernels.sparse_decode import register_variant

from .wg_decode import (
    _NEW_REINTERPRET,
    _async_load,
    _cta_barrier,
    _model1_slots,
    _split_range,
    _tile_idx,
    _wg_epilogue,
    _wg_rows,
    _wg_scale,
    _wg_softmax_pv,
)

# The producer's registers: the consumers need 184 (their [64, 512] fp32 accumulator is 128;
# below 184 ptxas spills around the products, Triton 3.6, sm_90), and (8 warps x 184 + 4 warps
# x 128) x 32 threads = 63.5 K of the SM's 64 K registers.
_PRODUCER_REGS = gl.constexpr(128)
_PRODUCER_WARPS = gl.constexpr(4)  # for the jit code
_NPRODUCER = 4  # the same, for the layout helpers
# Keys per quarter tile, and the ring's stages (the ring is what fits next to Q, two K tiles
# and P in 227 KB: three stages of 7.3 KB).
_NQT = 16  # for the layout helpers
_QT = gl.constexpr(_NQT)  # for the jit code
_RING = gl.constexpr(3)


@gluon.constexpr_function
def _ring_layout(nc: int, elems: int) -> gl.BlockedLayout:
    """Producer layout of a chunk-major ring stage [nc, 16 keys, 64 bytes] (``elems`` = 8
    bytes or 2 int32 words a thread and chunk): eight lanes cover one key's 64-byte chunk and
    each warp four consecutive keys, so a warp's accesses are contiguous in the ring (keys 64
    bytes apart) and fill whole 128-byte rows of the swizzled K tile: no bank conflicts either
    way (a key-major ring measured 2-way conflicts on both, notes v11). Keys spread over
    lanes and warps as in ``_idx_layout``, so no data moves between warps."""
    return gl.BlockedLayout([int(nc), 1, int(elems)], [1, 4, 8], [1, _NPRODUCER, 1], [2, 1, 0])


@gluon.constexpr_function
def _key_layout() -> gl.BlockedLayout:
    """Producer layout of [16 keys, 8 ..] per-key rows (scales, ropes): keys over 4 lanes and
    the 4 warps, as in ``_ring_layout``."""
    return gl.BlockedLayout([1, 8], [_NQT // _NPRODUCER, 32 * _NPRODUCER // _NQT],
                            [_NPRODUCER, 1], [1, 0])


@gluon.constexpr_function
def _idx_layout() -> gl.SliceLayout:
    """Producer layout of a quarter tile's 16 indices."""
    return gl.SliceLayout(1, _key_layout())


@gluon.jit
def _e4m3x4_to_f16(w):
    """Four FP8 E4M3 values packed in an int32 (lowest byte first) -> four f16 (exact)."""
    return gl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        .reg .b32 p, q;
        mov.b32 {lo, hi}, $4;
        cvt.rn.f16x2.e4m3x2 p, lo;
        cvt.rn.f16x2.e4m3x2 q, hi;
        mov.b32 {$0, $1}, p;
        mov.b32 {$2, $3}, q;
        }""",
        "=h,=h,=h,=h,r", [w], dtype=(gl.float16, gl.float16, gl.float16, gl.float16),
        is_pure=True, pack=1)


@gluon.jit
def _cluster_arrive(RELEASE: gl.constexpr):
    """This thread's arrival at the cluster barrier (PTX ``barrier.cluster.arrive``; Gluon 3.6
    has no wrapper). ``RELEASE``: the thread's earlier global stores become visible to the
    cluster's threads that pass the matching wait."""
    if RELEASE:
        gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; mov.u32 $0, 0;",
                                  "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("barrier.cluster.arrive.relaxed.aligned; mov.u32 $0, 0;",
                                  "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cluster_wait():
    """Wait until every thread of the cluster has arrived (acquire: their released stores are
    visible after it)."""
    gl.inline_asm_elementwise("barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cluster_size():
    """CTAs in this program's cluster: 2 when the host launched it as a pair, else 1."""
    return gl.inline_asm_elementwise("mov.u32 $0, %cluster_nctarank;", "=r", [],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _load_idx(a_row, n_a, b_row, n_b, t, tiles_a, hi, h0, BT: gl.constexpr):
    """Indices of keys [h0, h0 + 16) of tile ``t`` (-1 where invalid, past the list or the
    split)."""
    return _tile_idx(a_row, n_a, b_row, n_b, t, tiles_a, hi,
                     h0 + gl.arange(0, _QT, layout=_idx_layout()), BT)


@gluon.jit
def _slots(idx, ps, pb, LOG2: gl.constexpr):
    """``_model1_slots`` with a shift and a mask for pages of 2^LOG2 tokens (LOG2 >= 0): a
    division by a runtime page size puts a reciprocal on the issue path (seen with ncu)."""
    if LOG2 >= 0:
        safe = gl.maximum(idx, 0).to(gl.int64)
        page = safe >> LOG2
        off = safe & ((1 << LOG2) - 1)
        return page * pb + off * 576, page * pb + ps * 576 + off * 8
    else:
        return _model1_slots(idx, ps, pb)


@gluon.jit
def _slots_of(kv, t, tiles_a, idx, A_LOG2: gl.constexpr, B_LOG2: gl.constexpr):
    """The cache tile ``t`` belongs to (its bytes and bf16 view) and the byte offsets of the
    keys' data and scales in it. ``kv``: both caches' (bytes, bf16 view, tokens per page,
    bytes per page)."""
    a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb = kv
    if t < tiles_a:
        base, sbase = _slots(idx, a_ps, a_pb, A_LOG2)
        u8 = a_u8
        bf = a_bf16
    else:
        base, sbase = _slots(idx, b_ps, b_pb, B_LOG2)
        u8 = b_u8
        bf = b_bf16
    return base, sbase, u8, bf


@gluon.jit
def _ring_copy(u8, base, valid, dst, C0: gl.constexpr, NC: gl.constexpr):
    """cp.async of chunks C0 .. C0 + NC - 1 (64 bytes each) of every key into the stage
    ``dst`` [NC, 16, 64]; zero-filled for invalid keys."""
    L: gl.constexpr = _ring_layout(NC, 8)
    b3 = gl.convert_layout(base, gl.SliceLayout(0, gl.SliceLayout(2, L)))
    v3 = gl.convert_layout(valid, gl.SliceLayout(0, gl.SliceLayout(2, L)))
    c3 = gl.arange(0, NC, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
    d3 = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    col = gl.expand_dims(gl.expand_dims((C0 + c3) * 64, 1), 2) + gl.expand_dims(
        gl.expand_dims(d3, 0), 1)
    # (col >= 0 and the like below are always true: they give the mask the pointers' shape)
    _async_load(dst, u8 + gl.expand_dims(gl.expand_dims(b3, 0), 2) + col,
                mask=gl.expand_dims(gl.expand_dims(v3, 0), 2) & (col >= 0))


@gluon.jit
def _ring_issue(kv, t, tiles_a, idx, r4, r2, r1, rs, A_LOG2: gl.constexpr,
                B_LOG2: gl.constexpr):
    """Start a quarter tile's FP8 bytes (chunks 0-3, 4-5 and 6, in three buffers: the 448
    bytes are not a power of two) and scale bytes into one ring stage."""
    base, sbase, u8, _ = _slots_of(kv, t, tiles_a, idx, A_LOG2, B_LOG2)
    valid = idx >= 0
    _ring_copy(u8, base, valid, r4, 0, 4)
    _ring_copy(u8, base, valid, r2, 4, 2)
    _ring_copy(u8, base, valid, r1, 6, 1)
    SL: gl.constexpr = _key_layout()
    s_valid = gl.convert_layout(valid, gl.SliceLayout(1, SL))
    s_base = gl.convert_layout(sbase, gl.SliceLayout(1, SL))
    cs = gl.arange(0, 8, layout=gl.SliceLayout(0, SL))
    _async_load(rs, u8 + gl.expand_dims(s_base, 1) + gl.expand_dims(cs, 0),
                mask=gl.expand_dims(s_valid, 1) & (gl.expand_dims(cs, 0) < 8))


@gluon.jit
def _rope_issue(kv, t, tiles_a, idx, dst, A_LOG2: gl.constexpr, B_LOG2: gl.constexpr):
    """cp.async of a quarter tile's bf16 ropes straight into its rows of a free K buffer (the
    ring has no room for them)."""
    base, _, _, bf = _slots_of(kv, t, tiles_a, idx, A_LOG2, B_LOG2)
    RL: gl.constexpr = _key_layout()
    rb = gl.convert_layout(base, gl.SliceLayout(1, RL))
    rv = gl.convert_layout(idx >= 0, gl.SliceLayout(1, RL))
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, RL))
    _async_load(dst, bf + gl.expand_dims(rb // 2 + 224, 1) + gl.expand_dims(d, 0),
                mask=gl.expand_dims(rv, 1) & (gl.expand_dims(d, 0) < 64))


@gluon.jit
def _ring_words(buf, sc, C0: gl.constexpr, NC: gl.constexpr):
    """A stage's FP8 bytes as int32 words [16, NC, 16] (keys first, for the K rows) and their
    scale bytes [16, NC], in registers."""
    L: gl.constexpr = _ring_layout(NC, 2)
    if _NEW_REINTERPRET:
        w = buf.reinterpret(gl.int32, [NC, _QT, 16], buf.type.layout)
    else:
        w = buf._reinterpret(gl.int32, [NC, _QT, 16], buf.type.layout)
    words = gl.permute(w.load(L), (1, 0, 2))
    e = sc.slice(C0, NC, dim=1).load(gl.SliceLayout(2, words.type.layout))
    return words, e


@gluon.jit
def _store_chunks(dst, words, sc, NC: gl.constexpr):
    """FP8 words x 2^(e-127) -> bf16 [16, NC * 64] into ``dst``. A power-of-two scale makes
    the product exact, as in ``wg``."""
    scale = gl.expand_dims((sc.to(gl.int32) << 23).to(gl.float32, bitcast=True), 2)
    x0, x1, x2, x3 = _e4m3x4_to_f16(words)
    y0 = (x0.to(gl.float32) * scale).to(gl.bfloat16)
    y1 = (x1.to(gl.float32) * scale).to(gl.bfloat16)
    y2 = (x2.to(gl.float32) * scale).to(gl.bfloat16)
    y3 = (x3.to(gl.float32) * scale).to(gl.bfloat16)
    # join stacks on a new last axis: [.., 16, 2 (y0 | y2), 2 (first | second pair)] flattens
    # to bytes 0, 1, 2, 3 of each word.
    y = gl.join(gl.join(y0, y2), gl.join(y1, y3))
    dst.store(gl.reshape(y, [_QT, NC * 64]))


@gluon.jit
def _producer(k_s, ok_s, full, empty, r4_s, r2_s, r1_s, rs_s, a_u8, a_bf16, a_ps, a_pb, b_u8,
              b_bf16, b_ps, b_pb, a_row, b_row, a_len, a_topk, b_len, b_topk, bidx, sp,
              BT: gl.constexpr, A_LOG2: gl.constexpr, B_LOG2: gl.constexpr,
              A_HAS_LEN: gl.constexpr, HAS_B: gl.constexpr, B_HAS_LEN: gl.constexpr,
              NSPLIT: gl.constexpr, PAIR: gl.constexpr):
    """Fill the two K buffers in turn, a quarter tile at a time: while quarter j is converted,
    quarters j + 1 .. j + 3 are in flight in the ring (with the tile's ropes, about 29 KB;
    registers hold no loads across iterations, where moving them would wait for them)."""
    gl.static_assert(BT == 4 * _QT, "a tile is four quarters")
    gl.static_assert(_RING == 3, "quarter j + 3 refills the stage quarter j used")
    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp, A_HAS_LEN,
                                             HAS_B, B_HAS_LEN, NSPLIT, BT)
    kv = (a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb)
    # indices of this tile (c) and the next (n), each as four quarters
    c0 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 0, BT)
    c1 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, _QT, BT)
    c2 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 2 * _QT, BT)
    c3 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 3 * _QT, BT)
    n0 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 0, BT)
    n1 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, _QT, BT)
    n2 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 2 * _QT, BT)
    n3 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 3 * _QT, BT)
    if lo < hi:
        _ring_issue(kv, lo, tiles_a, c0, r4_s.index(0), r2_s.index(0), r1_s.index(0),
                    rs_s.index(0), A_LOG2, B_LOG2)
        async_copy.commit_group()
        _ring_issue(kv, lo, tiles_a, c1, r4_s.index(1), r2_s.index(1), r1_s.index(1),
                    rs_s.index(1), A_LOG2, B_LOG2)
        async_copy.commit_group()
        _ring_issue(kv, lo, tiles_a, c2, r4_s.index(2), r2_s.index(2), r1_s.index(2),
                    rs_s.index(2), A_LOG2, B_LOG2)
        async_copy.commit_group()
    for t in range(lo, hi):
        i = t - lo
        b = i % 2
        k_b = k_s.index(b)
        ok_b = ok_s.index(b)
        # the tile after next's indices, a whole tile ahead of their use (loaded once a tile:
        # a rotation every quarter would move registers whose loads are still in flight)
        m0 = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, 0, BT)
        m1 = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, _QT, BT)
        m2 = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, 2 * _QT, BT)
        m3 = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, 3 * _QT, BT)
        for q in gl.static_range(4):
            st = (i * 4 + q) % _RING
            async_copy.wait_group(_RING - 1)  # this thread's copies of quarter (t, q)
            _cta_barrier()  # ... and every producer thread's
            sc = rs_s.index(st)
            w4, s4 = _ring_words(r4_s.index(st), sc, 0, 4)
            w2, s2 = _ring_words(r2_s.index(st), sc, 4, 2)
            w1, s1 = _ring_words(r1_s.index(st), sc, 6, 1)
            _cta_barrier()  # every producer thread has read stage st
            # refill it with quarter (t, q) + 3: (t, 3), then (t + 1, 0 .. 2)
            if q == 0:
                mbarrier.wait(empty.index(b), ((i // 2) & 1) ^ 1)  # passes on a fresh buffer
                _ring_issue(kv, t, tiles_a, c3, r4_s.index(st), r2_s.index(st), r1_s.index(st),
                            rs_s.index(st), A_LOG2, B_LOG2)
                # the tile's ropes go straight into the now free buffer, in the group that
                # quarter (t, 3) completes, so they have landed before the buffer is full
                rope = k_b.slice(448, 64, dim=1)
                _rope_issue(kv, t, tiles_a, c0, rope.slice(0, _QT), A_LOG2, B_LOG2)
                _rope_issue(kv, t, tiles_a, c1, rope.slice(_QT, _QT), A_LOG2, B_LOG2)
                _rope_issue(kv, t, tiles_a, c2, rope.slice(2 * _QT, _QT), A_LOG2, B_LOG2)
                _rope_issue(kv, t, tiles_a, c3, rope.slice(3 * _QT, _QT), A_LOG2, B_LOG2)
                valid = c0 >= 0
            else:
                if t + 1 < hi:
                    if q == 1:
                        nq = n0
                    elif q == 2:
                        nq = n1
                    else:
                        nq = n2
                    _ring_issue(kv, t + 1, tiles_a, nq, r4_s.index(st), r2_s.index(st),
                                r1_s.index(st), rs_s.index(st), A_LOG2, B_LOG2)
                if q == 1:
                    valid = c1 >= 0
                elif q == 2:
                    valid = c2 >= 0
                else:
                    valid = c3 >= 0
            async_copy.commit_group()  # (empty past the end: keeps the group count regular)
            k_q = k_b.slice(q * _QT, _QT, dim=0)
            _store_chunks(k_q.slice(0, 256, dim=1), w4, s4, 4)
            _store_chunks(k_q.slice(256, 128, dim=1), w2, s2, 2)
            _store_chunks(k_q.slice(384, 64, dim=1), w1, s1, 1)
            ok_b.slice(q * _QT, _QT).store(valid.to(gl.int8))
            if q == 3:
                fence_async_shared()  # generic stores -> the consumers' wgmma (async proxy)
                mbarrier.arrive(full.index(b))
        c0 = n0
        c1 = n1
        c2 = n2
        c3 = n3
        n0 = m0
        n1 = m1
        n2 = m2
        n3 = m3
    async_copy.wait_group(0)
    if PAIR:  # every thread of the cluster takes part in the consumers' barrier
        _cluster_arrive(False)
        _cluster_wait()


@gluon.jit
def _pair_epilogue(acc, m_i, l_i, r, hb, sp, bidx, H, s_q, sink_ptr, o_ptr, stride_or,
                   stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, q_s, O_L: gl.constexpr,
                   HAS_SINK: gl.constexpr):
    """The row's two splits, launched as one cluster of two CTAs, merge without the combine
    launch. Each stores the column half its partner merges (as a scaled fp16 partial, the
    combine's format) with its heads' LSE and exponent; both pass a cluster barrier; each then
    merges its own half, its values from shared memory and the partner's from L2, and stores
    the output: split 0 columns 0-255 (its first warpgroup's), split 1 columns 256-511."""
    heads = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, O_L))
    hmask = heads < H
    inv, lse2, _ = _wg_rows(m_i, l_i, O_L)
    k, f = _wg_scale(acc, inv)
    o = acc * gl.expand_dims(f, 1)
    prow = (r * 2 + sp).to(gl.int64) * H
    gl.store(ks_ptr + prow + heads, k, mask=hmask)
    gl.store(lp_ptr + prow + heads, lse2, mask=hmask)
    # the fp16 tile, staged in the free Q buffer (as in _wg_store_rows): both halves are read
    # back from it 16 bytes a thread
    if _NEW_REINTERPRET:
        view = q_s.reinterpret(gl.float16, [64, 512], q_s.type.layout)
    else:
        view = q_s._reinterpret(gl.float16, [64, 512], q_s.type.layout)
    view.store(o.to(gl.float16))
    _cta_barrier()
    qrow = (r * 2 + 1 - sp).to(gl.int64) * H
    if sp == 0:
        _pair_merge(view, lse2, k, r, hb, bidx, H, s_q, prow, qrow, sink_ptr, o_ptr, stride_or,
                    stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, 0, HAS_SINK)
    else:
        _pair_merge(view, lse2, k, r, hb, bidx, H, s_q, prow, qrow, sink_ptr, o_ptr, stride_or,
                    stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, 256, HAS_SINK)


@gluon.jit
def _pair_merge(view, lse2, k, r, hb, bidx, H, s_q, prow, qrow, sink_ptr, o_ptr, stride_or,
                stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, KEEP: gl.constexpr,
                HAS_SINK: gl.constexpr):
    """``_pair_epilogue`` for the CTA that merges columns KEEP .. KEEP + 255 (KEEP = 0: split
    0). The weights are ``_combine_kernel``'s, folded into one factor a row and split; split
    0's term comes first in both CTAs, so results do not depend on which CTA merges or
    finishes first."""
    HL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    SEND: gl.constexpr = 256 - KEEP
    hh = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, HL))
    hv = hh < H
    hv2 = gl.expand_dims(hv, 1)
    cols = gl.arange(0, 256, layout=gl.SliceLayout(0, HL))
    sent = view.slice(SEND, 256, dim=1).load(HL)
    gl.store(op_ptr + (prow + gl.expand_dims(hh, 1)) * 512 + SEND + gl.expand_dims(cols, 0),
             sent, mask=hv2)
    if HAS_SINK:
        sink = gl.load(sink_ptr + hh, mask=hv, other=0.0).to(gl.float32)
    _cluster_arrive(True)  # release: the stores above (and the caller's), for the partner
    _cluster_wait()
    # .cg: read at L2, where the partner's stores are, whatever this SM's L1 holds
    lp_p = gl.load(lp_ptr + qrow + hh, mask=hv, other=float("-inf"), cache_modifier=".cg")
    k_p = gl.load(ks_ptr + qrow + hh, mask=hv, other=0.0, cache_modifier=".cg")
    peer = gl.load(op_ptr + (qrow + gl.expand_dims(hh, 1)) * 512 + KEEP
                   + gl.expand_dims(cols, 0), mask=hv2, other=0.0,
                   cache_modifier=".cg").to(gl.float32)
    own = view.slice(KEEP, 256, dim=1).load(HL).to(gl.float32)
    lp_s = gl.convert_layout(lse2, gl.SliceLayout(1, HL))
    k_s = gl.convert_layout(k, gl.SliceLayout(1, HL))
    if KEEP == 0:
        lp0, lp1, k0, k1, o0, o1 = lp_s, lp_p, k_s, k_p, own, peer
    else:
        lp0, lp1, k0, k1, o0, o1 = lp_p, lp_s, k_p, k_s, peer, own
    gmax = gl.maximum(lp0, lp1)
    gm = gl.where(gmax == float("-inf"), 0.0, gmax)
    w0 = gl.exp2(lp0 - gm)
    w1 = gl.exp2(lp1 - gm)
    tot = w0 + w1
    ok = tot > 0.0
    safe = gl.where(ok, tot, 1.0)
    lse = (gl.log2(safe) + gm) * 0.6931471805599453
    # one factor a row and split (weight, exponent, 1 / sum, sink), so each element costs a
    # multiply and a fused multiply-add (_wg_rows says why)
    inv = 1.0 / safe
    if HAS_SINK:
        inv = inv / (1.0 + gl.exp(sink - lse))
    inv = gl.where(ok, inv, 0.0)
    # NaN, loudly, if a launch path ever loses the cluster: the partner's half would be stale
    inv = gl.where(_cluster_size() == 2, inv, float("nan"))
    c0 = w0 * gl.exp2(k0) * inv
    c1 = w1 * gl.exp2(k1) * inv
    out = o0 * gl.expand_dims(c0, 1) + o1 * gl.expand_dims(c1, 1)
    gl.store(o_ptr + r.to(gl.int64) * stride_or + gl.expand_dims(hh * stride_oh, 1) + KEEP
             + gl.expand_dims(cols, 0), out.to(o_ptr.dtype.element_ty), mask=hv2)
    if KEEP == 0:
        lse = gl.where(ok, lse, float("inf"))
        gl.store(lse_ptr + bidx * H * s_q + hh * s_q + (r - bidx * s_q), lse, mask=hv)


@gluon.jit
def _consumer(q_s, k_s, p_s, ok_s, full, empty, q_ptr, stride_qr, stride_qh, qk_scale, r, hb,
              sp, bidx, H, s_q, sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr, lp_ptr,
              ks_ptr, a_len, a_topk, b_len, b_topk, BT: gl.constexpr, HAS_SINK: gl.constexpr,
              NSPLIT: gl.constexpr, SCALED: gl.constexpr, A_HAS_LEN: gl.constexpr,
              HAS_B: gl.constexpr, B_HAS_LEN: gl.constexpr, PAIR: gl.constexpr):
    """The split's cut, the Q copy, then ``wg``'s products and online softmax on each full K
    buffer, and its epilogue (``_pair_epilogue`` for a pair of splits)."""
    BH: gl.constexpr = 64
    _, _, _, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp, A_HAS_LEN, HAS_B,
                                   B_HAS_LEN, NSPLIT, BT)
    # Q after the cut: issued first, its 64 KB queued ahead of the producer's first loads
    # (0.5 us at B=64 / top-k 512, notes v11)
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0])
    qh = hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, QL))
    qd = gl.arange(0, 512, layout=gl.SliceLayout(0, QL))
    q_rows = q_ptr + r.to(gl.int64) * stride_qr + qh * stride_qh
    _async_load(q_s, gl.expand_dims(q_rows, 1) + gl.expand_dims(qd, 0),
                mask=gl.expand_dims(qh < H, 1))
    async_copy.commit_group()
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BT // 2, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 256, 16])
    m_i = gl.full([BH], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
    l_i = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, S_L))
    acc = gl.zeros([BH, 512], gl.float32, layout=O_L)
    s_zero = gl.zeros([BH, BT], gl.float32, layout=S_L)
    async_copy.wait_group(0)  # this thread's part of Q
    fence_async_shared()
    _cta_barrier()  # ... and every other consumer thread's
    for t in range(lo, hi):
        i = t - lo
        b = i % 2
        mbarrier.wait(full.index(b), (i // 2) & 1)
        k_b = k_s.index(b)
        s_tok = warpgroup_mma(q_s, k_b.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        valid = ok_s.index(b).load(gl.SliceLayout(0, S_L)) != 0
        o_tok, m_i, l_i = _wg_softmax_pv(s, valid, m_i, l_i, acc, qk_scale, p_s, k_b, O_L)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        mbarrier.arrive(empty.index(b))  # both warpgroups are past P V (barrier first)
    if PAIR:
        _pair_epilogue(acc, m_i, l_i, r, hb, sp, bidx, H, s_q, sink_ptr, o_ptr, stride_or,
                       stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, q_s, O_L, HAS_SINK)
    else:
        _wg_epilogue(acc, m_i, l_i, r, hb, sp, bidx, H, s_q, sink_ptr, o_ptr, stride_or,
                     stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, q_s, O_L, HAS_SINK, NSPLIT,
                     SCALED)


@gluon.jit
def _sparse_decode_ws_kernel(
    q_ptr, stride_qr, stride_qh,
    a_u8, a_bf16, a_idx, stride_ar, a_len, a_topk, a_ps, a_pb,
    b_u8, b_bf16, b_idx, stride_br, b_len, b_topk, b_ps, b_pb,
    sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
    op_ptr, lp_ptr, ks_ptr,
    H, s_q, qk_scale,
    A_HAS_LEN: gl.constexpr, HAS_B: gl.constexpr, B_HAS_LEN: gl.constexpr,
    HAS_SINK: gl.constexpr, NSPLIT: gl.constexpr, SCALED: gl.constexpr,
    BT: gl.constexpr, A_LOG2: gl.constexpr, B_LOG2: gl.constexpr, PAIR: gl.constexpr,
):
    """One program: a row, 64 heads (masked beyond ``H``), one split of the row's key tiles;
    eight consumer warps plus a four-warp producer (module docstring). ``A_LOG2`` / ``B_LOG2``:
    log2 of each cache's page size, or -1 where it is not a power of two. ``PAIR``: two splits
    launched as clusters of two CTAs (grid (split, row, head block)) that merge in the kernel."""
    BH: gl.constexpr = 64
    gl.static_assert(gl.num_warps() == 8, "the consumers' [4, 2] warp grid needs num_warps=8")
    gl.static_assert(not PAIR or (NSPLIT == 2 and SCALED), "a pair merges two scaled splits")
    if PAIR:  # the split is the cluster's CTA: the fastest grid axis
        sp = gl.program_id(0)
        r = gl.program_id(1)
        hb = gl.program_id(2)
    else:
        r = gl.program_id(0)
        hb = gl.program_id(1)
        sp = gl.program_id(2)
    bidx = r // s_q
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH, 512], gl.bfloat16)
    K_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, 512], gl.bfloat16)
    P_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH, BT], gl.bfloat16)
    R_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    q_s = gl.allocate_shared_memory(gl.bfloat16, [BH, 512], Q_SL)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, 512], K_SL)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [BH, BT], P_SL)
    ok_s = gl.allocate_shared_memory(gl.int8, [2, BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    r4_s = gl.allocate_shared_memory(gl.uint8, [_RING, 4, _QT, 64], R_SL)
    r2_s = gl.allocate_shared_memory(gl.uint8, [_RING, 2, _QT, 64], R_SL)
    r1_s = gl.allocate_shared_memory(gl.uint8, [_RING, 1, _QT, 64], R_SL)
    rs_s = gl.allocate_shared_memory(gl.uint8, [_RING, _QT, 8],
                                     gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(full.index(j), count=1)
        mbarrier.init(empty.index(j), count=1)
    a_row = a_idx + r.to(gl.int64) * stride_ar
    b_row = b_idx + r.to(gl.int64) * stride_br
    gl.warp_specialize(
        [(_consumer, (q_s, k_s, p_s, ok_s, full, empty, q_ptr, stride_qr, stride_qh, qk_scale,
                      r, hb, sp, bidx, H, s_q, sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr,
                      op_ptr, lp_ptr, ks_ptr, a_len, a_topk, b_len, b_topk, BT, HAS_SINK,
                      NSPLIT, SCALED, A_HAS_LEN, HAS_B, B_HAS_LEN, PAIR)),
         (_producer, (k_s, ok_s, full, empty, r4_s, r2_s, r1_s, rs_s, a_u8, a_bf16, a_ps, a_pb,
                      b_u8, b_bf16, b_ps, b_pb, a_row, b_row, a_len, a_topk, b_len, b_topk,
                      bidx, sp, BT, A_LOG2, B_LOG2, A_HAS_LEN, HAS_B, B_HAS_LEN, NSPLIT,
                      PAIR))],
        [_PRODUCER_WARPS], [_PRODUCER_REGS])


def _launch_pairs(grid: tuple[int, int, int], args: dict) -> bool:
    """Launch the ``PAIR`` kernel as clusters of two CTAs; False where this Triton cannot.

    The kernel is compiled as an ordinary one-CTA program: Gluon's ``num_ctas`` means multi-CTA
    layouts (triton-lang/triton#8587), under which a tensor not split over the cluster is
    replicated and its global stores kept for one CTA only (the PTX predicates them on the CTA
    rank; a CPU probe, notes v12). The cluster is asked for at launch only. Triton 3.6 and
    3.9 launchers read the CTAs per cluster from the kernel's packed metadata (num_warps,
    num_ctas, shared memory) and launch ``grid[0] x num_ctas`` CTAs along x in clusters of
    ``num_ctas``, so this hands them a copy with 2."""
    kernel = _sparse_decode_ws_kernel
    compiled = kernel.warmup(grid=grid, **args)  # compiles (or finds) it; launches nothing
    if hasattr(compiled, "result"):  # an asynchronous compile's future
        compiled = compiled.result()
    meta = getattr(compiled, "packed_metadata", None)
    if not (isinstance(meta, tuple) and len(meta) == 3 and meta[1] == 1):
        return False
    run = compiled.run  # loads the binary (sets .function) on first use
    stream = driver.active.get_current_stream(driver.active.get_current_device())
    values = [args[name] for name in kernel.arg_names]
    run(grid[0] // 2, grid[1], grid[2], stream, compiled.function, (meta[0], 2, meta[2]),
        compiled.launch_metadata(grid, stream, *values), None, None, *values)
    return True


def launch_ws(q2: torch.Tensor, a: _Keys, bk: _Keys, a_len: torch.Tensor, b_len: torch.Tensor,
              sink: torch.Tensor, o2: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor,
              l_part: torch.Tensor, k_part: torch.Tensor, h: int, s_q: int, qk_scale: float,
              flags: dict[str, bool], has_sink: bool, nsplit: int, scaled: bool,
              pair: bool = False) -> bool:
    """Launch over ``rows x cdiv(h, 64) x nsplit`` programs of 12 warps (as ``launch_wg``).
    ``pair`` (two scaled splits only): as clusters of two that merge the splits themselves.
    Returns whether the output is complete, i.e. whether no combine launch is needed."""
    rows = q2.shape[0]
    args = dict(
        q_ptr=q2, stride_qr=q2.stride(0), stride_qh=q2.stride(1),
        a_u8=a.u8, a_bf16=a.bf, a_idx=a.idx, stride_ar=a.idx.stride(1), a_len=a_len,
        a_topk=a.topk, a_ps=a.ps, a_pb=a.pb,
        b_u8=bk.u8, b_bf16=bk.bf, b_idx=bk.idx, stride_br=bk.idx.stride(1), b_len=b_len,
        b_topk=bk.topk, b_ps=bk.ps, b_pb=bk.pb,
        sink_ptr=sink, o_ptr=o2, stride_or=o2.stride(0), stride_oh=o2.stride(1), lse_ptr=lse,
        op_ptr=o_part, lp_ptr=l_part, ks_ptr=k_part, H=h, s_q=s_q, qk_scale=qk_scale,
        **flags, HAS_SINK=has_sink, NSPLIT=nsplit, SCALED=scaled, BT=4 * _QT,
        A_LOG2=page_log2(a.ps), B_LOG2=page_log2(bk.ps), num_warps=8,
    )
    # (the pair grid puts rows on y, whose CUDA limit is 65535)
    if pair and nsplit == 2 and scaled and rows <= 65535 and \
            _launch_pairs((2, rows, (h + 63) // 64), dict(args, PAIR=True)):
        return True
    _sparse_decode_ws_kernel[(rows, (h + 63) // 64, nsplit)](**args, PAIR=False)
    return nsplit == 1


# --- registration as an experiment (``DecodeConfig(variant="ws")``; see wg_decode's note) -------
# BT 64 and a ring of 3 quarter-tile stages, its only tiles: 222.0 KB (Q 64 + two K tiles 128 +
# P 8 + ring 21.4 KB) plus the 1 KB Triton reserves, Triton 3.6 and 3.9.
WS_SMEM = 227_364 + 1024
WS_TILES = (64, 3, 8)


def _launch_registered(launch: Any, x: dict[str, Any]) -> bool:
    from .wg_decode import gluon_refusal

    a, bk = x["a"], x["bk"]
    refusal = gluon_refusal(x["q2"], (a.u8, bk.u8), (a.pb, bk.pb), launch.block_t,
                            launch.num_stages, launch.num_warps, "ws")
    if refusal:
        raise ValueError(refusal)
    return launch_ws(x["q2"], a, bk, x["a_len"], x["b_len"], x["sink"], x["o2"], x["lse"],
                     x["o_part"], x["l_part"], x["k_part"], launch.h, launch.s_q,
                     launch.qk_scale, x["flags"], launch.sink is not None, x["nsplit"],
                     x["scale"]["SCALED"], pair=launch.cfg.pair is not False)


register_variant("ws", WS_TILES, True, _launch_registered, block_h=64)
