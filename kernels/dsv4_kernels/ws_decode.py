"""The ``ws`` sparse-MLA decode variant: ``wg`` with a producer warpgroup (sm_90, Gluon).

Why: in ``wg`` the same eight warps gather, dequantize and run the products, with one K
buffer. The dequantization then sits on the critical path, because ptxas schedules most of its
arithmetic after the wait of ``P V`` (NOTES.md v10, run 48: 2.0 of 33 µs at B=64 / top-k 512).
Here the work is split between two kinds of warps (``gl.warp_specialize``), as FlashMLA does:

* a **producer** warpgroup (4 warps, 128 registers a thread) loads each tile's FP8 bytes into
  registers as int32 words, in two halves of BT/2 keys, converts them (FP8 x 2^(e-127), exact)
  and stores bf16 into one of **two K buffers**; an mbarrier pair per buffer (full / empty)
  hands the tile over;
* two **consumer** warpgroups (the default partition, 8 warps, 192 registers) run ``wg``'s
  products and online softmax on the full buffer and release it after ``P V``.

Shared memory: Q 64 KB + two K tiles 128 KB + P 8 KB = 200 KB, no raw stages (the producer
holds the bytes in registers). Key ranges, split-K, partials, combine, outputs: as ``wg``.
"""

from __future__ import annotations

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

from .sparse_decode import _Keys
from .wg_decode import (
    _NEW_REINTERPRET,
    _async_load,
    _cta_barrier,
    _keys_of,
    _model1_slots,
    _split_range,
    _wg_epilogue,
    _wg_issue,
    _wg_softmax_pv,
)

_PRODUCER_REGS = 128
_PRODUCER_WARPS = gl.constexpr(4)  # for the jit code
_NPRODUCER = 4  # the same, for the layout helpers


@gluon.constexpr_function
def _chunk_layout(keys: int, nc: int) -> gl.BlockedLayout:
    """Producer (``w`` warps) layout of ``nc`` 64-byte chunks of ``keys`` keys as int32
    words, [keys, nc, 16]: 16 contiguous bytes a thread and chunk (8 for one chunk). Every
    ``nc`` spreads the keys alike (four lanes, ``w`` warps), as ``_rope_layout`` does, so the
    per-key vectors move between them without data exchange."""
    w = _NPRODUCER
    kt = int(keys) // (4 * w)
    nc = int(nc)
    if nc == 1:
        return gl.BlockedLayout([kt, 1, 2], [4, 1, 8], [w, 1, 1], [2, 1, 0])
    return gl.BlockedLayout([kt, nc // 2, 4], [4, 2, 4], [w, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def _cm_layout(nc: int, elems: int) -> gl.BlockedLayout:
    """Producer layout of a chunk-major ring stage [nc, 16 keys, 64 bytes] (``elems`` = 8
    bytes or 2 int32 words a thread and chunk): eight lanes cover one key's 64-byte chunk and
    each warp four consecutive keys, so a warp's accesses are contiguous in the ring (keys 64
    bytes apart) and fill whole 128-byte rows of the swizzled K tile: no bank conflicts either
    way. Keys spread over lanes and warps as in the index layout, so no data moves between
    warps."""
    return gl.BlockedLayout([int(nc), 1, int(elems)], [1, 4, 8], [1, _NPRODUCER, 1], [2, 1, 0])


@gluon.constexpr_function
def _rope_layout(keys: int) -> gl.BlockedLayout:
    """Producer layout of [keys, 64] bf16 rope values: 16 bytes a thread."""
    w = _NPRODUCER
    return gl.BlockedLayout([int(keys) // (4 * w), 8], [4, 8], [w, 1], [1, 0])


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
def _load_idx(a_row, n_a, b_row, n_b, t, tiles_a, hi, h0, BT: gl.constexpr, HT: gl.constexpr,
              KL: gl.constexpr):
    """Indices of keys [h0, h0 + HT) of tile ``t`` (-1 where invalid, past the list or the
    split), in the per-key layout ``KL``."""
    rows = h0 + gl.arange(0, HT, layout=KL)
    if t < tiles_a:
        offs = t * BT + rows
        idx = gl.load(a_row + offs, mask=(offs < n_a) & (t < hi), other=-1)
    else:
        offs = (t - tiles_a) * BT + rows
        idx = gl.load(b_row + offs, mask=(offs < n_b) & (t < hi), other=-1)
    return idx


@gluon.jit
def _gather_chunks(u8, base, sbase, valid, C0: gl.constexpr, NC: gl.constexpr,
                   LW: gl.constexpr):
    """Chunks C0 .. C0 + NC - 1 of the FP8 nope as int32 words ([keys, NC, 16] in ``LW``,
    zero for invalid keys) and their scale bytes ([keys, NC]). Words keep four bytes in one
    register: a byte tensor takes a register per byte."""
    K1: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, LW))
    b3 = gl.convert_layout(base, K1)
    v3 = gl.convert_layout(valid, K1)
    c = C0 + gl.arange(0, NC, layout=gl.SliceLayout(0, gl.SliceLayout(2, LW)))
    w = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, LW)))
    rows = (u8 + b3).to(gl.pointer_type(gl.int32), bitcast=True)
    col = gl.expand_dims(gl.expand_dims(c * 16, 0), 2) + gl.expand_dims(gl.expand_dims(w, 0), 1)
    words = gl.load(gl.expand_dims(gl.expand_dims(rows, 1), 2) + col,
                    mask=gl.expand_dims(gl.expand_dims(v3, 1), 2), other=0)
    sb = gl.convert_layout(sbase, K1)
    sc = gl.load(u8 + gl.expand_dims(sb, 1) + gl.expand_dims(c, 0),
                 mask=gl.expand_dims(v3, 1), other=0)
    return words, sc


@gluon.jit
def _store_chunks(dst, words, sc, HT: gl.constexpr, NC: gl.constexpr, DIAG: gl.constexpr = 0):
    """FP8 words x 2^(e-127) -> bf16 [HT, NC * 64] into ``dst``. A power-of-two scale makes
    the product exact, as in ``wg``."""
    scale = gl.expand_dims((sc.to(gl.int32) << 23).to(gl.float32, bitcast=True), 2)
    x0, x1, x2, x3 = _e4m3x4_to_f16(words)
    if DIAG == 3:  # no arithmetic: the f16 bits stored as bf16 (wrong values)
        y0 = x0.to(gl.bfloat16, bitcast=True)
        y1 = x1.to(gl.bfloat16, bitcast=True)
        y2 = x2.to(gl.bfloat16, bitcast=True)
        y3 = x3.to(gl.bfloat16, bitcast=True)
    else:
        y0 = (x0.to(gl.float32) * scale).to(gl.bfloat16)
        y1 = (x1.to(gl.float32) * scale).to(gl.bfloat16)
        y2 = (x2.to(gl.float32) * scale).to(gl.bfloat16)
        y3 = (x3.to(gl.float32) * scale).to(gl.bfloat16)
    # join stacks on a new last axis: [.., 16, 2 (y0 | y2), 2 (first | second pair)] flattens
    # to bytes 0, 1, 2, 3 of each word.
    y = gl.join(gl.join(y0, y2), gl.join(y1, y3))
    dst.store(gl.reshape(y, [HT, NC * 64]))


@gluon.jit
def _gather_half(u8, bf, ps, pb, idx, HT: gl.constexpr, NC0: gl.constexpr):
    """Half a tile (``HT`` keys) into registers: chunks 0-3, 4-5 and 6 of the FP8 nope as
    words with their scale bytes, the bf16 rope, and each key's validity."""
    base, sbase = _model1_slots(idx, ps, pb)
    valid = idx >= 0
    w4, s4 = _gather_chunks(u8, base, sbase, valid, 0, NC0, _chunk_layout(HT, NC0))
    w2, s2 = _gather_chunks(u8, base, sbase, valid, NC0, 6 - NC0, _chunk_layout(HT, 6 - NC0))
    w1, s1 = _gather_chunks(u8, base, sbase, valid, 6, 1, _chunk_layout(HT, 1))
    RL: gl.constexpr = _rope_layout(HT)
    rb = gl.convert_layout(base, gl.SliceLayout(1, RL))
    rv = gl.convert_layout(valid, gl.SliceLayout(1, RL))
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, RL))
    rope = gl.load(bf + gl.expand_dims(rb // 2 + 224, 1) + gl.expand_dims(d, 0),
                   mask=gl.expand_dims(rv, 1), other=0.0)
    return w4, s4, w2, s2, w1, s1, rope, valid


@gluon.jit
def _store_half(k_h, ok_h, w4, s4, w2, s2, w1, s1, rope, valid, HT: gl.constexpr,
                NC0: gl.constexpr, DIAG: gl.constexpr = 0):
    """Dequantize half a tile into its rows of a K buffer, in disjoint column ranges."""
    _store_chunks(k_h.slice(0, NC0 * 64, dim=1), w4, s4, HT, NC0, DIAG)
    _store_chunks(k_h.slice(NC0 * 64, (6 - NC0) * 64, dim=1), w2, s2, HT, 6 - NC0, DIAG)
    _store_chunks(k_h.slice(384, 64, dim=1), w1, s1, HT, 1, DIAG)
    k_h.slice(448, 64, dim=1).store(rope)
    ok_h.store(valid.to(gl.int8))


@gluon.jit
def _gather_half_of(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, idx,
                    HT: gl.constexpr, NC0: gl.constexpr):
    """``_gather_half`` on the key list tile ``t`` belongs to."""
    u8, bf, ps, pb = _keys_of(t < tiles_a, a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb)
    return _gather_half(u8, bf, ps, pb, idx, HT, NC0)


@gluon.jit
def _producer(k_s, ok_s, full, empty, a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb,
              a_row, n_a, b_row, n_b, tiles_a, lo, hi, BT: gl.constexpr, DIAG: gl.constexpr):
    NC0: gl.constexpr = 4
    """Fill the two K buffers in turn: gather a tile (both halves in flight together, issued
    before waiting for the buffer, so the loads overlap the consumers' use of it), convert
    it in, and mark the buffer full."""
    HT: gl.constexpr = BT // 2
    KL: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, _chunk_layout(HT, 4)))
    for t in range(lo, hi):
        i = t - lo
        b = i % 2
        idx0 = _load_idx(a_row, n_a, b_row, n_b, t, tiles_a, hi, 0, BT, HT, KL)
        idx1 = _load_idx(a_row, n_a, b_row, n_b, t, tiles_a, hi, HT, BT, HT, KL)
        if DIAG == 2:  # no gather: every key invalid (masked loads, no memory traffic)
            idx0 = gl.full_like(idx0, -1)
            idx1 = gl.full_like(idx1, -1)
        x4, xs4, x2, xs2, x1, xs1, xr, xv = _gather_half_of(
            a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, idx0, HT, NC0)
        y4, ys4, y2, ys2, y1, ys1, yr, yv = _gather_half_of(
            a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, idx1, HT, NC0)
        mbarrier.wait(empty.index(b), ((i // 2) & 1) ^ 1)  # passes at once on a fresh buffer
        k_b = k_s.index(b)
        ok_b = ok_s.index(b)
        if DIAG == 1:  # no conversion: only the validity bytes
            ok_b.slice(0, HT).store(xv.to(gl.int8))
            ok_b.slice(HT, HT).store(yv.to(gl.int8) + (y4.sum() + x4.sum()).to(gl.int8) * 0)
        else:
            _store_half(k_b.slice(0, HT, dim=0), ok_b.slice(0, HT), x4, xs4, x2, xs2, x1, xs1,
                        xr, xv, HT, NC0, DIAG)
            _store_half(k_b.slice(HT, HT, dim=0), ok_b.slice(HT, HT), y4, ys4, y2, ys2, y1,
                        ys1, yr, yv, HT, NC0, DIAG)
        fence_async_shared()  # generic stores -> the consumers' wgmma (async proxy)
        mbarrier.arrive(full.index(b))


@gluon.jit
def _read_stage(raw_s, rope_s, sc_s, HT: gl.constexpr, NC0: gl.constexpr):
    """The staged half-tile's bytes -> registers, as ``_gather_half`` returns them (without
    the validity): FP8 words of chunks 0..NC0-1, NC0..5 and 6 with their scale bytes, and the
    bf16 rope."""
    if _NEW_REINTERPRET:
        words = raw_s.reinterpret(gl.int32, [HT, 8, 16], raw_s.type.layout)
    else:
        words = raw_s._reinterpret(gl.int32, [HT, 8, 16], raw_s.type.layout)
    L4: gl.constexpr = _chunk_layout(HT, NC0)
    L2: gl.constexpr = _chunk_layout(HT, 6 - NC0)
    L1: gl.constexpr = _chunk_layout(HT, 1)
    w4 = words.slice(0, NC0, dim=1).load(L4)
    s4 = sc_s.slice(0, NC0, dim=1).load(gl.SliceLayout(2, L4))
    w2 = words.slice(NC0, 6 - NC0, dim=1).load(L2)
    s2 = sc_s.slice(NC0, 6 - NC0, dim=1).load(gl.SliceLayout(2, L2))
    w1 = words.slice(6, 1, dim=1).load(L1)
    s1 = sc_s.slice(6, 1, dim=1).load(gl.SliceLayout(2, L1))
    rope = rope_s.load(_rope_layout(HT))
    return w4, s4, w2, s2, w1, s1, rope


@gluon.jit
def _staged_producer(k_s, ok_s, full, empty, raw_s, rope_s, sc_s, okx_s, a_u8, a_bf16, a_ps,
                     a_pb, b_u8, b_bf16, b_ps, b_pb, a_row, n_a, b_row, n_b, tiles_a, lo, hi,
                     BT: gl.constexpr, DIAG: gl.constexpr):
    """Fill the two K buffers in turn, half a tile at a time through one shared-memory stage:
    the next half's ``cp.async`` is issued as soon as the current half is in registers, so its
    latency overlaps this half's conversion (the register producer above waited for each
    tile's loads, then converted). Indices are loaded two halves ahead."""
    NC0: gl.constexpr = 4
    HT: gl.constexpr = BT // 2
    W: gl.constexpr = _PRODUCER_WARPS
    GLP: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [W, 1], [1, 0])
    L3P: gl.constexpr = gl.BlockedLayout([HT // (4 * W), 4, 16], [4, 2, 4], [W, 1, 1],
                                         [2, 1, 0])
    SCLP: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [W, 1], [1, 0])
    KL: gl.constexpr = gl.SliceLayout(1, GLP)
    cur = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 0, BT, HT, KL)
    if DIAG == 2:
        cur = gl.full_like(cur, -1)
    _wg_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo, tiles_a, cur, raw_s,
              rope_s, sc_s, okx_s, HT, GLP, L3P, SCLP)
    async_copy.commit_group()
    nxt = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, HT, BT, HT, KL)
    nn = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 0, BT, HT, KL)
    for t in range(lo, hi):
        i = t - lo
        b = i % 2
        k_b = k_s.index(b)
        ok_b = ok_s.index(b)
        for half in gl.static_range(2):
            async_copy.wait_group(0)  # this thread's copies of the staged half
            _cta_barrier()  # ... and every producer thread's
            w4, s4, w2, s2, w1, s1, rope = _read_stage(raw_s, rope_s, sc_s, HT, NC0)
            _cta_barrier()  # every producer thread has read the stage
            if DIAG == 2:
                nxt = gl.full_like(nxt, -1)
            if half == 0:
                _wg_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, nxt,
                          raw_s, rope_s, sc_s, okx_s, HT, GLP, L3P, SCLP)
            else:
                if t + 1 < hi:
                    _wg_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t + 1,
                              tiles_a, nxt, raw_s, rope_s, sc_s, okx_s, HT, GLP, L3P, SCLP)
            async_copy.commit_group()
            valid = cur >= 0
            cur = nxt
            nxt = nn
            if half == 0:
                nn = _load_idx(a_row, n_a, b_row, n_b, t + 1, tiles_a, hi, HT, BT, HT, KL)
            else:
                nn = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, 0, BT, HT, KL)
            if half == 0:
                mbarrier.wait(empty.index(b), ((i // 2) & 1) ^ 1)  # passes on a fresh buffer
            k_h = k_b.slice(half * HT, HT, dim=0)
            ok_h = ok_b.slice(half * HT, HT)
            if DIAG == 1:  # no conversion: only the validity bytes
                ok_h.store(valid.to(gl.int8) + (w4.sum() + w1.sum()).to(gl.int8) * 0)
            else:
                _store_half(k_h, ok_h, w4, s4, w2, s2, w1, s1, rope, valid, HT, NC0, DIAG)
        fence_async_shared()  # generic stores -> the consumers' wgmma (async proxy)
        mbarrier.arrive(full.index(b))
    async_copy.wait_group(0)


@gluon.jit
def _slots(idx, ps, pb, LOG2: gl.constexpr):
    """``_model1_slots`` with a shift and a mask for pages of 2^LOG2 tokens (LOG2 >= 0): the
    division by a runtime page size costs a reciprocal on the issue path (ncu, run 58)."""
    if LOG2 >= 0:
        safe = gl.maximum(idx, 0).to(gl.int64)
        page = safe >> LOG2
        off = safe & ((1 << LOG2) - 1)
        return page * pb + off * 576, page * pb + ps * 576 + off * 8
    else:
        return _model1_slots(idx, ps, pb)


@gluon.jit
def _addrs(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, idx,
           A_LOG2: gl.constexpr, B_LOG2: gl.constexpr, GLP: gl.constexpr, L3P: gl.constexpr,
           SCLP: gl.constexpr):
    """Pointers and masks of half a tile's raw bytes (see ``_wg_issue``), computed ahead of
    the issue so that nothing but the copies waits behind the stage's barrier."""
    if t < tiles_a:
        base, sbase = _slots(idx, a_ps, a_pb, A_LOG2)
        u8 = a_u8
        bf = a_bf16
    else:
        base, sbase = _slots(idx, b_ps, b_pb, B_LOG2)
        u8 = b_u8
        bf = b_bf16
    valid = idx >= 0
    b3 = gl.convert_layout(base, gl.SliceLayout(1, gl.SliceLayout(2, L3P)))
    v3 = gl.convert_layout(valid, gl.SliceLayout(1, gl.SliceLayout(2, L3P)))
    c3 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3P)))
    d3 = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3P)))
    col = gl.expand_dims(gl.expand_dims(c3 * 64, 0), 2) + gl.expand_dims(gl.expand_dims(d3, 0), 1)
    nptr = u8 + gl.expand_dims(gl.expand_dims(b3, 1), 2) + col
    nmask = gl.expand_dims(gl.expand_dims(v3, 1), 2) & (col < 448)
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, GLP))
    rptr = bf + gl.expand_dims(base // 2 + 224, 1) + gl.expand_dims(d, 0)
    rmask = gl.expand_dims(valid, 1) & (gl.expand_dims(d, 0) < 64)
    s_valid = gl.convert_layout(valid, gl.SliceLayout(1, SCLP))
    s_base = gl.convert_layout(sbase, gl.SliceLayout(1, SCLP))
    cs = gl.arange(0, 8, layout=gl.SliceLayout(0, SCLP))
    sptr = u8 + gl.expand_dims(s_base, 1) + gl.expand_dims(cs, 0)
    smask = gl.expand_dims(s_valid, 1) & (gl.expand_dims(cs, 0) < 8)
    return nptr, nmask, rptr, rmask, sptr, smask


@gluon.jit
def _issue_at(raw_s, rope_s, sc_s, nptr, nmask, rptr, rmask, sptr, smask):
    """The stage's three copies (one per buffer: see ``_wg_issue``), committed as one group."""
    _async_load(raw_s, nptr, mask=nmask)
    _async_load(rope_s, rptr, mask=rmask)
    _async_load(sc_s, sptr, mask=smask)
    async_copy.commit_group()


@gluon.jit
def _staged_producer2(k_s, ok_s, full, empty, raw_s, rope_s, sc_s, a_u8, a_bf16, a_ps, a_pb,
                      b_u8, b_bf16, b_ps, b_pb, a_row, n_a, b_row, n_b, tiles_a, lo, hi,
                      BT: gl.constexpr, A_LOG2: gl.constexpr, B_LOG2: gl.constexpr,
                      PRO: gl.constexpr):
    """``_staged_producer`` with the next half's addresses computed before the stage's wait
    and, with ``PRO``, the first tile's second half gathered into registers alongside the
    first half's copy, so the first tile waits one memory round trip instead of two."""
    NC0: gl.constexpr = 4
    HT: gl.constexpr = BT // 2
    W: gl.constexpr = _PRODUCER_WARPS
    GLP: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [W, 1], [1, 0])
    L3P: gl.constexpr = gl.BlockedLayout([HT // (4 * W), 4, 16], [4, 2, 4], [W, 1, 1],
                                         [2, 1, 0])
    SCLP: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [W, 1], [1, 0])
    KL: gl.constexpr = gl.SliceLayout(1, GLP)
    t0 = lo
    if PRO:
        cur = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 0, BT, HT, KL)
        reg_idx = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, HT, BT, HT, KL)
        nxt = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 0, BT, HT, KL)
        nn = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, HT, BT, HT, KL)
        if lo < hi:
            nptr, nmask, rptr, rmask, sptr, smask = _addrs(
                a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo, tiles_a, cur, A_LOG2,
                B_LOG2, GLP, L3P, SCLP)
            _issue_at(raw_s, rope_s, sc_s, nptr, nmask, rptr, rmask, sptr, smask)
            y4, ys4, y2, ys2, y1, ys1, yr, yv = _gather_half_of(
                a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo, tiles_a, reg_idx, HT,
                NC0)
            nptr, nmask, rptr, rmask, sptr, smask = _addrs(
                a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo + 1, tiles_a, nxt,
                A_LOG2, B_LOG2, GLP, L3P, SCLP)
            async_copy.wait_group(0)
            _cta_barrier()
            w4, s4, w2, s2, w1, s1, rope = _read_stage(raw_s, rope_s, sc_s, HT, NC0)
            _cta_barrier()
            if lo + 1 < hi:
                _issue_at(raw_s, rope_s, sc_s, nptr, nmask, rptr, rmask, sptr, smask)
            k_b = k_s.index(0)
            ok_b = ok_s.index(0)
            _store_half(k_b.slice(0, HT, dim=0), ok_b.slice(0, HT), w4, s4, w2, s2, w1, s1,
                        rope, cur >= 0, HT, NC0)
            _store_half(k_b.slice(HT, HT, dim=0), ok_b.slice(HT, HT), y4, ys4, y2, ys2, y1,
                        ys1, yr, yv, HT, NC0)
            fence_async_shared()
            mbarrier.arrive(full.index(0))
            cur = nxt
            nxt = nn
            nn = _load_idx(a_row, n_a, b_row, n_b, lo + 2, tiles_a, hi, 0, BT, HT, KL)
            t0 = lo + 1
    else:
        cur = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 0, BT, HT, KL)
        nptr, nmask, rptr, rmask, sptr, smask = _addrs(
            a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo, tiles_a, cur, A_LOG2,
            B_LOG2, GLP, L3P, SCLP)
        _issue_at(raw_s, rope_s, sc_s, nptr, nmask, rptr, rmask, sptr, smask)
        nxt = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, HT, BT, HT, KL)
        nn = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 0, BT, HT, KL)
    for t in range(t0, hi):
        i = t - lo
        b = i % 2
        k_b = k_s.index(b)
        ok_b = ok_s.index(b)
        for half in gl.static_range(2):
            # the staged half is (t, half); the next one is (t, 1) or (t + 1, 0)
            tn = t + half
            nptr, nmask, rptr, rmask, sptr, smask = _addrs(
                a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, tn, tiles_a, nxt, A_LOG2,
                B_LOG2, GLP, L3P, SCLP)
            async_copy.wait_group(0)  # this thread's copies of the staged half
            _cta_barrier()  # ... and every producer thread's
            w4, s4, w2, s2, w1, s1, rope = _read_stage(raw_s, rope_s, sc_s, HT, NC0)
            _cta_barrier()  # every producer thread has read the stage
            if tn < hi:
                _issue_at(raw_s, rope_s, sc_s, nptr, nmask, rptr, rmask, sptr, smask)
            valid = cur >= 0
            cur = nxt
            nxt = nn
            if half == 0:
                nn = _load_idx(a_row, n_a, b_row, n_b, t + 1, tiles_a, hi, HT, BT, HT, KL)
            else:
                nn = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, 0, BT, HT, KL)
            if half == 0:
                mbarrier.wait(empty.index(b), ((i // 2) & 1) ^ 1)  # passes on a fresh buffer
            _store_half(k_b.slice(half * HT, HT, dim=0), ok_b.slice(half * HT, HT), w4, s4,
                        w2, s2, w1, s1, rope, valid, HT, NC0)
        fence_async_shared()  # generic stores -> the consumers' wgmma (async proxy)
        mbarrier.arrive(full.index(b))
    async_copy.wait_group(0)


@gluon.jit
def _ring_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, idx, r4, r2,
                r1, rs, A_LOG2: gl.constexpr, B_LOG2: gl.constexpr, QT: gl.constexpr,
                GLQ: gl.constexpr, CM: gl.constexpr):
    """Start a quarter tile's FP8 bytes (chunks 0-3, 4-5, 6: no padding) and scale bytes
    into one ring stage. Invalid keys are zero-filled."""
    W: gl.constexpr = _PRODUCER_WARPS
    if t < tiles_a:
        base, sbase = _slots(idx, a_ps, a_pb, A_LOG2)
        u8 = a_u8
        bf = a_bf16
    else:
        base, sbase = _slots(idx, b_ps, b_pb, B_LOG2)
        u8 = b_u8
        bf = b_bf16
    valid = idx >= 0
    L4: gl.constexpr = gl.BlockedLayout([1, 2, 16], [QT // W, 2, 32 * W // QT // 2], [W, 1, 1],
                                        [2, 1, 0])
    L2: gl.constexpr = gl.BlockedLayout([1, 1, 16], [QT // W, 2, 32 * W // QT // 2], [W, 1, 1],
                                        [2, 1, 0])
    L1: gl.constexpr = gl.BlockedLayout([1, 1, 8], [QT // W, 1, 32 * W // QT], [W, 1, 1],
                                        [2, 1, 0])
    if CM:
        _ring_copy_cm(u8, base, valid, r4, 0, 4, _cm_layout(4, 8))
        _ring_copy_cm(u8, base, valid, r2, 4, 2, _cm_layout(2, 8))
        _ring_copy_cm(u8, base, valid, r1, 6, 1, _cm_layout(1, 8))
    else:
        _ring_copy(u8, base, valid, r4, 0, 4, L4)
        _ring_copy(u8, base, valid, r2, 4, 2, L2)
        _ring_copy(u8, base, valid, r1, 6, 1, L1)
    SL: gl.constexpr = gl.BlockedLayout([1, 8], [QT // W, 32 * W // QT], [W, 1], [1, 0])
    s_valid = gl.convert_layout(valid, gl.SliceLayout(1, SL))
    s_base = gl.convert_layout(sbase, gl.SliceLayout(1, SL))
    cs = gl.arange(0, 8, layout=gl.SliceLayout(0, SL))
    _async_load(rs, u8 + gl.expand_dims(s_base, 1) + gl.expand_dims(cs, 0),
                mask=gl.expand_dims(s_valid, 1) & (gl.expand_dims(cs, 0) < 8))


@gluon.jit
def _rope_issue(a_bf16, a_ps, a_pb, b_bf16, b_ps, b_pb, t, tiles_a, idx, dst,
                A_LOG2: gl.constexpr, B_LOG2: gl.constexpr, QT: gl.constexpr):
    """cp.async of a quarter tile's bf16 rope straight into its rows of a (free) K buffer."""
    W: gl.constexpr = _PRODUCER_WARPS
    if t < tiles_a:
        base, sbase = _slots(idx, a_ps, a_pb, A_LOG2)
        bf = a_bf16
    else:
        base, sbase = _slots(idx, b_ps, b_pb, B_LOG2)
        bf = b_bf16
    RL: gl.constexpr = gl.BlockedLayout([1, 8], [QT // W, 32 * W // QT], [W, 1], [1, 0])
    rb = gl.convert_layout(base, gl.SliceLayout(1, RL))
    rv = gl.convert_layout(idx >= 0, gl.SliceLayout(1, RL))
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, RL))
    _async_load(dst, bf + gl.expand_dims(rb // 2 + 224, 1) + gl.expand_dims(d, 0),
                mask=gl.expand_dims(rv, 1) & (gl.expand_dims(d, 0) < 64))


@gluon.jit
def _ring_copy(u8, base, valid, dst, C0: gl.constexpr, NC: gl.constexpr, L: gl.constexpr):
    """cp.async of chunks C0 .. C0 + NC - 1 (64 bytes each) of every key into ``dst``."""
    b3 = gl.convert_layout(base, gl.SliceLayout(1, gl.SliceLayout(2, L)))
    v3 = gl.convert_layout(valid, gl.SliceLayout(1, gl.SliceLayout(2, L)))
    c3 = gl.arange(0, NC, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    d3 = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    col = gl.expand_dims(gl.expand_dims((C0 + c3) * 64, 0), 2) + gl.expand_dims(
        gl.expand_dims(d3, 0), 1)
    _async_load(dst, u8 + gl.expand_dims(gl.expand_dims(b3, 1), 2) + col,
                mask=gl.expand_dims(gl.expand_dims(v3, 1), 2) & (col >= 0))


@gluon.jit
def _ring_copy_cm(u8, base, valid, dst, C0: gl.constexpr, NC: gl.constexpr, L: gl.constexpr):
    """``_ring_copy`` into a chunk-major stage [NC, keys, 64]."""
    b3 = gl.convert_layout(base, gl.SliceLayout(0, gl.SliceLayout(2, L)))
    v3 = gl.convert_layout(valid, gl.SliceLayout(0, gl.SliceLayout(2, L)))
    c3 = gl.arange(0, NC, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
    d3 = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    col = gl.expand_dims(gl.expand_dims((C0 + c3) * 64, 1), 2) + gl.expand_dims(
        gl.expand_dims(d3, 0), 1)
    _async_load(dst, u8 + gl.expand_dims(gl.expand_dims(b3, 0), 2) + col,
                mask=gl.expand_dims(gl.expand_dims(v3, 0), 2) & (col >= 0))


@gluon.jit
def _ring_words_cm(buf, sc, C0: gl.constexpr, NC: gl.constexpr, QT: gl.constexpr):
    """A chunk-major stage's words and scale bytes, as [QT, NC, 16] and [QT, NC]."""
    L: gl.constexpr = _cm_layout(NC, 2)
    if _NEW_REINTERPRET:
        w = buf.reinterpret(gl.int32, [NC, QT, 16], buf.type.layout)
    else:
        w = buf._reinterpret(gl.int32, [NC, QT, 16], buf.type.layout)
    words = gl.permute(w.load(L), (1, 0, 2))
    e = sc.slice(C0, NC, dim=1).load(gl.SliceLayout(2, words.type.layout))
    return words, e


@gluon.jit
def _ring_words(buf, NC: gl.constexpr, QT: gl.constexpr):
    """A ring stage's [QT, NC, 64] bytes as int32 words [QT, NC, 16] in ``_chunk_layout``."""
    if _NEW_REINTERPRET:
        w = buf.reinterpret(gl.int32, [QT, NC, 16], buf.type.layout)
    else:
        w = buf._reinterpret(gl.int32, [QT, NC, 16], buf.type.layout)
    return w.load(_chunk_layout(QT, NC))


@gluon.jit
def _ring_producer(k_s, ok_s, full, empty, r4_s, r2_s, r1_s, rs_s, a_u8, a_bf16, a_ps, a_pb,
                   b_u8, b_bf16, b_ps, b_pb, a_row, n_a, b_row, n_b, tiles_a, lo, hi,
                   BT: gl.constexpr, A_LOG2: gl.constexpr, B_LOG2: gl.constexpr,
                   RING: gl.constexpr, CM: gl.constexpr, pre=None):
    """Fill the two K buffers a quarter tile at a time through a ring of ``RING`` stages of
    FP8 bytes: ``RING`` quarters are in flight while one is converted, plus the tile's ropes,
    copied straight into its K buffer (about 29 KB in flight against 19 KB for the one
    half-tile stage above)."""
    NC0: gl.constexpr = 4
    QT: gl.constexpr = BT // 4
    W: gl.constexpr = _PRODUCER_WARPS
    KL: gl.constexpr = gl.SliceLayout(1, gl.BlockedLayout([1, 8], [QT // W, 32 * W // QT],
                                                          [W, 1], [1, 0]))
    gl.static_assert(RING == 3, "quarter j + 3 refills the stage quarter j used")
    if pre is None:
        c0 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 0, BT, QT, KL)
        c1 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, QT, BT, QT, KL)
        c2 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 2 * QT, BT, QT, KL)
        c3 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 3 * QT, BT, QT, KL)
        n0 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 0, BT, QT, KL)
        n1 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, QT, BT, QT, KL)
        n2 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 2 * QT, BT, QT, KL)
        n3 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 3 * QT, BT, QT, KL)
    else:
        c0, c1, c2, c3, n0, n1, n2, n3 = pre
    if lo < hi:
        _ring_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo, tiles_a, c0,
                    r4_s.index(0), r2_s.index(0), r1_s.index(0), rs_s.index(0), A_LOG2, B_LOG2,
                    QT, KL, CM)
        async_copy.commit_group()
        _ring_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo, tiles_a, c1,
                    r4_s.index(1), r2_s.index(1), r1_s.index(1), rs_s.index(1), A_LOG2, B_LOG2,
                    QT, KL, CM)
        async_copy.commit_group()
        _ring_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, lo, tiles_a, c2,
                    r4_s.index(2), r2_s.index(2), r1_s.index(2), rs_s.index(2), A_LOG2, B_LOG2,
                    QT, KL, CM)
        async_copy.commit_group()
    for t in range(lo, hi):
        i = t - lo
        b = i % 2
        k_b = k_s.index(b)
        ok_b = ok_s.index(b)
        # indices a tile ahead of their use (loaded once per tile: a rotation per quarter
        # would move registers whose loads are still in flight, which waits for them)
        m0 = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, 0, BT, QT, KL)
        m1 = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, QT, BT, QT, KL)
        m2 = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, 2 * QT, BT, QT, KL)
        m3 = _load_idx(a_row, n_a, b_row, n_b, t + 2, tiles_a, hi, 3 * QT, BT, QT, KL)
        for q in gl.static_range(4):
            st = (i * 4 + q) % RING
            async_copy.wait_group(RING - 1)  # this thread's copies of quarter (t, q)
            _cta_barrier()  # ... and every producer thread's
            sc = rs_s.index(st)
            if CM:
                w4, s4 = _ring_words_cm(r4_s.index(st), sc, 0, NC0, QT)
                w2, s2 = _ring_words_cm(r2_s.index(st), sc, NC0, 6 - NC0, QT)
                w1, s1 = _ring_words_cm(r1_s.index(st), sc, 6, 1, QT)
            else:
                w4 = _ring_words(r4_s.index(st), NC0, QT)
                w2 = _ring_words(r2_s.index(st), 6 - NC0, QT)
                w1 = _ring_words(r1_s.index(st), 1, QT)
                s4 = sc.slice(0, NC0, dim=1).load(gl.SliceLayout(2, _chunk_layout(QT, NC0)))
                s2 = sc.slice(NC0, 6 - NC0, dim=1).load(
                    gl.SliceLayout(2, _chunk_layout(QT, 6 - NC0)))
                s1 = sc.slice(6, 1, dim=1).load(gl.SliceLayout(2, _chunk_layout(QT, 1)))
            _cta_barrier()  # every producer thread has read stage st
            if q == 0:
                mbarrier.wait(empty.index(b), ((i // 2) & 1) ^ 1)  # passes on a fresh buffer
                _ring_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t, tiles_a, c3,
                            r4_s.index(st), r2_s.index(st), r1_s.index(st), rs_s.index(st),
                            A_LOG2, B_LOG2, QT, KL, CM)
                # the tile's ropes go straight into the free buffer, in the group that quarter
                # (t, 3) completes, so they have landed before the buffer is marked full
                _rope_issue(a_bf16, a_ps, a_pb, b_bf16, b_ps, b_pb, t, tiles_a, c0,
                            k_b.slice(0, QT, dim=0).slice(448, 64, dim=1), A_LOG2, B_LOG2, QT)
                _rope_issue(a_bf16, a_ps, a_pb, b_bf16, b_ps, b_pb, t, tiles_a, c1,
                            k_b.slice(QT, QT, dim=0).slice(448, 64, dim=1), A_LOG2, B_LOG2, QT)
                _rope_issue(a_bf16, a_ps, a_pb, b_bf16, b_ps, b_pb, t, tiles_a, c2,
                            k_b.slice(2 * QT, QT, dim=0).slice(448, 64, dim=1), A_LOG2, B_LOG2,
                            QT)
                _rope_issue(a_bf16, a_ps, a_pb, b_bf16, b_ps, b_pb, t, tiles_a, c3,
                            k_b.slice(3 * QT, QT, dim=0).slice(448, 64, dim=1), A_LOG2, B_LOG2,
                            QT)
                valid = c0 >= 0
            else:
                if t + 1 < hi:
                    if q == 1:
                        nq = n0
                    elif q == 2:
                        nq = n1
                    else:
                        nq = n2
                    _ring_issue(a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, t + 1,
                                tiles_a, nq, r4_s.index(st), r2_s.index(st), r1_s.index(st),
                                rs_s.index(st), A_LOG2, B_LOG2, QT, KL, CM)
                if q == 1:
                    valid = c1 >= 0
                elif q == 2:
                    valid = c2 >= 0
                else:
                    valid = c3 >= 0
            async_copy.commit_group()  # (empty past the end: keeps the group count regular)
            k_q = k_b.slice(q * QT, QT, dim=0)
            _store_chunks(k_q.slice(0, NC0 * 64, dim=1), w4, s4, QT, NC0)
            _store_chunks(k_q.slice(NC0 * 64, (6 - NC0) * 64, dim=1), w2, s2, QT, 6 - NC0)
            _store_chunks(k_q.slice(384, 64, dim=1), w1, s1, QT, 1)
            ok_b.slice(q * QT, QT).store(valid.to(gl.int8))
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


@gluon.jit
def _issue_q(q_s, q_ptr, stride_qr, stride_qh, r, hb, H):
    """The row's [64, 512] queries into ``q_s``: one asynchronous copy, its own group."""
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [gl.num_warps(), 1], [1, 0])
    qh = hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, QL))
    qd = gl.arange(0, 512, layout=gl.SliceLayout(0, QL))
    q_rows = q_ptr + r.to(gl.int64) * stride_qr + qh * stride_qh
    _async_load(q_s, gl.expand_dims(q_rows, 1) + gl.expand_dims(qd, 0),
                mask=gl.expand_dims(qh < H, 1))
    async_copy.commit_group()


@gluon.jit
def _ring_producer_self(k_s, ok_s, full, empty, r4_s, r2_s, r1_s, rs_s, a_u8, a_bf16, a_ps, a_pb,
                        b_u8, b_bf16, b_ps, b_pb, a_row, b_row, a_len, a_topk, b_len, b_topk,
                        bidx, sp, BT: gl.constexpr, A_LOG2: gl.constexpr, B_LOG2: gl.constexpr,
                        CM: gl.constexpr, A_HAS_LEN: gl.constexpr, HAS_B: gl.constexpr,
                        B_HAS_LEN: gl.constexpr, NSPLIT: gl.constexpr, SPEC: gl.constexpr):
    if not SPEC:
        n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp,
                                                 A_HAS_LEN, HAS_B, B_HAS_LEN, NSPLIT, BT)
        _ring_producer(k_s, ok_s, full, empty, r4_s, r2_s, r1_s, rs_s, a_u8, a_bf16, a_ps, a_pb,
                       b_u8, b_bf16, b_ps, b_pb, a_row, n_a, b_row, n_b, tiles_a, lo, hi, BT,
                       A_LOG2, B_LOG2, 3, CM)
        return
    QT: gl.constexpr = BT // 4
    W: gl.constexpr = _PRODUCER_WARPS
    KL: gl.constexpr = gl.SliceLayout(1, gl.BlockedLayout([1, 8], [QT // W, 32 * W // QT],
                                                          [W, 1], [1, 0]))
    # The first two tiles' indices, loaded as if both lists were full while the lengths load
    # (the cut is then the static one); kept when the real cut starts at the same tile with the
    # same SWA tile count, masked to the real lengths, else loaded again.
    ta_s = gl.cdiv(a_topk, BT)
    tot_s = ta_s
    if HAS_B:
        tot_s = ta_s + gl.cdiv(b_topk, BT)
    per_s = gl.cdiv(tot_s, NSPLIT)
    lo_s = sp * per_s
    hi_s = gl.minimum(lo_s + per_s, tot_s)
    c0 = _load_idx(a_row, a_topk, b_row, b_topk, lo_s, ta_s, hi_s, 0, BT, QT, KL)
    c1 = _load_idx(a_row, a_topk, b_row, b_topk, lo_s, ta_s, hi_s, QT, BT, QT, KL)
    c2 = _load_idx(a_row, a_topk, b_row, b_topk, lo_s, ta_s, hi_s, 2 * QT, BT, QT, KL)
    c3 = _load_idx(a_row, a_topk, b_row, b_topk, lo_s, ta_s, hi_s, 3 * QT, BT, QT, KL)
    n0 = _load_idx(a_row, a_topk, b_row, b_topk, lo_s + 1, ta_s, hi_s, 0, BT, QT, KL)
    n1 = _load_idx(a_row, a_topk, b_row, b_topk, lo_s + 1, ta_s, hi_s, QT, BT, QT, KL)
    n2 = _load_idx(a_row, a_topk, b_row, b_topk, lo_s + 1, ta_s, hi_s, 2 * QT, BT, QT, KL)
    n3 = _load_idx(a_row, a_topk, b_row, b_topk, lo_s + 1, ta_s, hi_s, 3 * QT, BT, QT, KL)
    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp, A_HAS_LEN,
                                             HAS_B, B_HAS_LEN, NSPLIT, BT)
    if (lo == lo_s) & (tiles_a == ta_s):
        c0 = _mask_idx(c0, lo, tiles_a, n_a, n_b, hi, 0, BT, QT, KL)
        c1 = _mask_idx(c1, lo, tiles_a, n_a, n_b, hi, QT, BT, QT, KL)
        c2 = _mask_idx(c2, lo, tiles_a, n_a, n_b, hi, 2 * QT, BT, QT, KL)
        c3 = _mask_idx(c3, lo, tiles_a, n_a, n_b, hi, 3 * QT, BT, QT, KL)
        n0 = _mask_idx(n0, lo + 1, tiles_a, n_a, n_b, hi, 0, BT, QT, KL)
        n1 = _mask_idx(n1, lo + 1, tiles_a, n_a, n_b, hi, QT, BT, QT, KL)
        n2 = _mask_idx(n2, lo + 1, tiles_a, n_a, n_b, hi, 2 * QT, BT, QT, KL)
        n3 = _mask_idx(n3, lo + 1, tiles_a, n_a, n_b, hi, 3 * QT, BT, QT, KL)
    else:
        c0 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 0, BT, QT, KL)
        c1 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, QT, BT, QT, KL)
        c2 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 2 * QT, BT, QT, KL)
        c3 = _load_idx(a_row, n_a, b_row, n_b, lo, tiles_a, hi, 3 * QT, BT, QT, KL)
        n0 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 0, BT, QT, KL)
        n1 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, QT, BT, QT, KL)
        n2 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 2 * QT, BT, QT, KL)
        n3 = _load_idx(a_row, n_a, b_row, n_b, lo + 1, tiles_a, hi, 3 * QT, BT, QT, KL)
    _ring_producer(k_s, ok_s, full, empty, r4_s, r2_s, r1_s, rs_s, a_u8, a_bf16, a_ps, a_pb,
                   b_u8, b_bf16, b_ps, b_pb, a_row, n_a, b_row, n_b, tiles_a, lo, hi, BT, A_LOG2,
                   B_LOG2, 3, CM, (c0, c1, c2, c3, n0, n1, n2, n3))


@gluon.jit
def _mask_idx(idx, t, tiles_a, n_a, n_b, hi, h0, BT: gl.constexpr, HT: gl.constexpr,
              KL: gl.constexpr):
    """``idx`` (keys [h0, h0 + HT) of tile ``t``) with -1 wherever ``_load_idx`` would mask."""
    rows = h0 + gl.arange(0, HT, layout=KL)
    if t < tiles_a:
        ok = (t * BT + rows) < n_a
    else:
        ok = ((t - tiles_a) * BT + rows) < n_b
    return gl.where(ok & (t < hi), idx, -1)


@gluon.jit
def _consumer_self(q_s, k_s, p_s, ok_s, full, empty, qk_scale, r, hb, sp, bidx, H, s_q,
                   sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr,
                   a_len, a_topk, b_len, b_topk, BT: gl.constexpr, HAS_SINK: gl.constexpr,
                   NSPLIT: gl.constexpr, SCALED: gl.constexpr, A_HAS_LEN: gl.constexpr,
                   HAS_B: gl.constexpr, B_HAS_LEN: gl.constexpr, q_ptr, stride_qr,
                   stride_qh, QLATE: gl.constexpr):
    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp, A_HAS_LEN,
                                             HAS_B, B_HAS_LEN, NSPLIT, BT)
    if QLATE:
        _issue_q(q_s, q_ptr, stride_qr, stride_qh, r, hb, H)
    _consumer(q_s, k_s, p_s, ok_s, full, empty, lo, hi, qk_scale, r, hb, sp, bidx, H, s_q,
              sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr, BT,
              HAS_SINK, NSPLIT, SCALED)


@gluon.jit
def _consumer(q_s, k_s, p_s, ok_s, full, empty, lo, hi, qk_scale, r, hb, sp, bidx, H, s_q,
              sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr, lp_ptr, ks_ptr,
              BT: gl.constexpr, HAS_SINK: gl.constexpr, NSPLIT: gl.constexpr,
              SCALED: gl.constexpr, CPIPE: gl.constexpr = False):
    """``wg``'s products and online softmax on each full K buffer, then its epilogue."""
    BH: gl.constexpr = 64
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
    if CPIPE:
        # Q K^T of tile t + 1 is queued on the tensor cores right behind P V of tile t, so
        # they run back to back; wgmma groups retire in order, so waiting for one outstanding
        # group is P V's completion (the buffer is released then) and for none, the scores.
        if lo < hi:
            mbarrier.wait(full.index(0), 0)
            s_tok = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
        else:
            s = s_zero
        for t in range(lo, hi):
            i = t - lo
            b = i % 2
            k_b = k_s.index(b)
            valid = ok_s.index(b).load(gl.SliceLayout(0, S_L)) != 0
            o_tok, m_i, l_i = _wg_softmax_pv(s, valid, m_i, l_i, acc, qk_scale, p_s, k_b, O_L)
            if t + 1 < hi:
                b1 = (i + 1) % 2
                mbarrier.wait(full.index(b1), ((i + 1) // 2) & 1)
                s_tok = warpgroup_mma(q_s, k_s.index(b1).permute((1, 0)), s_zero,
                                      use_acc=False, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(o_tok,))
                mbarrier.arrive(empty.index(b))
                s = warpgroup_mma_wait(0, deps=(s_tok,))
            else:
                acc = warpgroup_mma_wait(0, deps=(o_tok,))
                mbarrier.arrive(empty.index(b))
    else:
        for t in range(lo, hi):
            i = t - lo
            b = i % 2
            mbarrier.wait(full.index(b), (i // 2) & 1)
            k_b = k_s.index(b)
            s_tok = warpgroup_mma(q_s, k_b.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            valid = ok_s.index(b).load(gl.SliceLayout(0, S_L)) != 0
            o_tok, m_i, l_i = _wg_softmax_pv(s, valid, m_i, l_i, acc, qk_scale, p_s, k_b, O_L)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            mbarrier.arrive(empty.index(b))  # both warpgroups are past P V (barrier first)
    _wg_epilogue(acc, m_i, l_i, r, hb, sp, bidx, H, s_q, sink_ptr, o_ptr, stride_or, stride_oh,
                 lse_ptr, op_ptr, lp_ptr, ks_ptr, q_s, O_L, HAS_SINK, NSPLIT, SCALED)


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
    BT: gl.constexpr, PRODUCER_REGS: gl.constexpr, DIAG: gl.constexpr,
    STAGED: gl.constexpr, A_LOG2: gl.constexpr = -1, B_LOG2: gl.constexpr = -1,
    PRO: gl.constexpr = False, CM: gl.constexpr = True, CPIPE: gl.constexpr = False,
    SELF: gl.constexpr = False, QLATE: gl.constexpr = False, SPEC: gl.constexpr = True,
):
    """One program: a row, 64 heads (masked beyond ``H``), one split of the row's key tiles;
    eight consumer warps plus a four-warp producer (module docstring)."""
    BH: gl.constexpr = 64
    gl.static_assert(gl.num_warps() == 8, "the consumers' [4, 2] warp grid needs num_warps=8")
    r = gl.program_id(0)
    hb = gl.program_id(1)
    sp = gl.program_id(2)
    bidx = r // s_q
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH, 512], gl.bfloat16)
    K_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, 512], gl.bfloat16)
    P_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH, BT], gl.bfloat16)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [BH, 512], Q_SL)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, 512], K_SL)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [BH, BT], P_SL)
    ok_s = gl.allocate_shared_memory(gl.int8, [2, BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    HT: gl.constexpr = BT // 2
    if STAGED == 3:
        QT: gl.constexpr = BT // 4
        R_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        if CM:
            r4_s = gl.allocate_shared_memory(gl.uint8, [3, 4, QT, 64], R_SL)
            r2_s = gl.allocate_shared_memory(gl.uint8, [3, 2, QT, 64], R_SL)
            r1_s = gl.allocate_shared_memory(gl.uint8, [3, 1, QT, 64], R_SL)
        else:
            r4_s = gl.allocate_shared_memory(gl.uint8, [3, QT, 4, 64], R_SL)
            r2_s = gl.allocate_shared_memory(gl.uint8, [3, QT, 2, 64], R_SL)
            r1_s = gl.allocate_shared_memory(gl.uint8, [3, QT, 1, 64], R_SL)
        rs_s = gl.allocate_shared_memory(gl.uint8, [3, QT, 8],
                                         gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    elif STAGED:
        raw_s = gl.allocate_shared_memory(gl.uint8, [HT, 8, 64],
                                          gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        rope_s = gl.allocate_shared_memory(gl.bfloat16, [HT, 64],
                                           gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        sc_s = gl.allocate_shared_memory(gl.uint8, [HT, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        okx_s = gl.allocate_shared_memory(gl.int8, [HT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for j in gl.static_range(2):
        mbarrier.init(full.index(j), count=1)
        mbarrier.init(empty.index(j), count=1)

    # Queries: one asynchronous copy by the consumers, waited for in their partition.
    if not QLATE:
        _issue_q(q_s, q_ptr, stride_qr, stride_qh, r, hb, H)
    a_row = a_idx + r.to(gl.int64) * stride_ar
    b_row = b_idx + r.to(gl.int64) * stride_br
    if SELF:
        # each partition reads the lengths itself: the producer starts at once, its length
        # and index loads not queued behind the hand-over
        gl.static_assert(STAGED == 3, "SELF is the ring producer's")
        gl.warp_specialize(
            [(_consumer_self, (q_s, k_s, p_s, ok_s, full, empty, qk_scale, r, hb, sp, bidx, H,
                               s_q, sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr,
                               lp_ptr, ks_ptr, a_len, a_topk, b_len, b_topk, BT, HAS_SINK,
                               NSPLIT, SCALED, A_HAS_LEN, HAS_B, B_HAS_LEN, q_ptr, stride_qr,
                               stride_qh, QLATE)),
             (_ring_producer_self, (k_s, ok_s, full, empty, r4_s, r2_s, r1_s, rs_s, a_u8,
                                    a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, a_row, b_row,
                                    a_len, a_topk, b_len, b_topk, bidx, sp, BT, A_LOG2, B_LOG2,
                                    CM, A_HAS_LEN, HAS_B, B_HAS_LEN, NSPLIT, SPEC))],
            [_PRODUCER_WARPS], [PRODUCER_REGS])
        return
    n_a, n_b, tiles_a, lo, hi = _split_range(a_len, a_topk, b_len, b_topk, bidx, sp, A_HAS_LEN,
                                             HAS_B, B_HAS_LEN, NSPLIT, BT)
    if STAGED == 3:
        gl.warp_specialize(
            [(_consumer, (q_s, k_s, p_s, ok_s, full, empty, lo, hi, qk_scale, r, hb, sp, bidx, H,
                          s_q, sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr, lp_ptr,
                          ks_ptr, BT, HAS_SINK, NSPLIT, SCALED, CPIPE)),
             (_ring_producer, (k_s, ok_s, full, empty, r4_s, r2_s, r1_s, rs_s, a_u8, a_bf16,
                               a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, a_row, n_a, b_row, n_b,
                               tiles_a, lo, hi, BT, A_LOG2, B_LOG2, 3, CM))],
            [_PRODUCER_WARPS], [PRODUCER_REGS])
    elif STAGED == 2:
        gl.warp_specialize(
            [(_consumer, (q_s, k_s, p_s, ok_s, full, empty, lo, hi, qk_scale, r, hb, sp, bidx, H,
                          s_q, sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr, lp_ptr,
                          ks_ptr, BT, HAS_SINK, NSPLIT, SCALED)),
             (_staged_producer2, (k_s, ok_s, full, empty, raw_s, rope_s, sc_s, a_u8, a_bf16,
                                  a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, a_row, n_a, b_row, n_b,
                                  tiles_a, lo, hi, BT, A_LOG2, B_LOG2, PRO))],
            [_PRODUCER_WARPS], [PRODUCER_REGS])
    elif STAGED == 1:
        gl.warp_specialize(
            [(_consumer, (q_s, k_s, p_s, ok_s, full, empty, lo, hi, qk_scale, r, hb, sp, bidx, H,
                          s_q, sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr, lp_ptr,
                          ks_ptr, BT, HAS_SINK, NSPLIT, SCALED)),
             (_staged_producer, (k_s, ok_s, full, empty, raw_s, rope_s, sc_s, okx_s, a_u8,
                                 a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb, a_row, n_a,
                                 b_row, n_b, tiles_a, lo, hi, BT, DIAG))],
            [_PRODUCER_WARPS], [PRODUCER_REGS])
    else:
        gl.warp_specialize(
            [(_consumer, (q_s, k_s, p_s, ok_s, full, empty, lo, hi, qk_scale, r, hb, sp, bidx, H,
                          s_q, sink_ptr, o_ptr, stride_or, stride_oh, lse_ptr, op_ptr, lp_ptr,
                          ks_ptr, BT, HAS_SINK, NSPLIT, SCALED)),
             (_producer, (k_s, ok_s, full, empty, a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16,
                          b_ps, b_pb, a_row, n_a, b_row, n_b, tiles_a, lo, hi, BT, DIAG))],
            [_PRODUCER_WARPS], [PRODUCER_REGS])


def _log2(ps: int) -> int:
    """log2 of a power-of-two page size, else -1 (the division path)."""
    return ps.bit_length() - 1 if ps > 0 and ps & (ps - 1) == 0 else -1


def launch_ws(q2: torch.Tensor, a: _Keys, bk: _Keys, a_len: torch.Tensor, b_len: torch.Tensor,
              sink: torch.Tensor, o2: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor,
              l_part: torch.Tensor, k_part: torch.Tensor, h: int, s_q: int, qk_scale: float,
              flags: dict[str, bool], has_sink: bool, nsplit: int, scaled: bool,
              block_t: int) -> None:
    """Launch over ``rows x cdiv(h, 64) x nsplit`` programs of 12 warps (as ``launch_wg``)."""
    rows = q2.shape[0]
    grid = (rows, (h + 63) // 64, nsplit)
    _sparse_decode_ws_kernel[grid](
        q2, q2.stride(0), q2.stride(1),
        a.u8, a.bf, a.idx, a.idx.stride(1), a_len, a.topk, a.ps, a.pb,
        bk.u8, bk.bf, bk.idx, bk.idx.stride(1), b_len, bk.topk, bk.ps, bk.pb,
        sink, o2, o2.stride(0), o2.stride(1), lse, o_part, l_part, k_part,
        h, s_q, qk_scale, **flags, HAS_SINK=has_sink, NSPLIT=nsplit, SCALED=scaled,
        BT=block_t, PRODUCER_REGS=_PRODUCER_REGS, num_warps=8,
        DIAG=int(__import__('os').environ.get('WS_DIAG', '0')),
        STAGED=int(__import__('os').environ.get('WS_STAGED', '2')),
        A_LOG2=_log2(a.ps), B_LOG2=_log2(bk.ps),
        PRO=__import__('os').environ.get('WS_PRO', '1') == '1',
        CM=__import__('os').environ.get('WS_CM', '1') == '1',
        CPIPE=__import__('os').environ.get('WS_CPIPE', '0') == '1',
        SELF=__import__('os').environ.get('WS_SELF', '1') == '1',
        QLATE=__import__('os').environ.get('WS_QLATE', '1') == '1',
        SPEC=__import__('os').environ.get('WS_SPEC', '1') == '1',
    )
