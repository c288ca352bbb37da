"""DSA indexer for DeepSeek-V4: paged FP8 MQA logits and a length-aware top-k, in Triton.

Why this exists: SGLang 0.5.23's sm_120 indexer path (``fp8_paged_mqa_logits_torch_sm120``)
gathers and multiplies every page up to the *maximum* context each step, and its top-k
(``torch.topk`` over ``max_seq_len``) does too; at a 1M-token limit that costs O(1M) per row
whatever the real length. Here all work and traffic follow each row's real length:

* ``indexer_logits``: grid ``(rows, splits)`` fixed by static values; each program walks its
  share of the row's key blocks ``[0, len)`` (length read on the device; interleaved blocks by
  default, one contiguous run with ``contiguous=True``), computing
  ``scale[n] * sum_h w[h] * relu(q_h . k_n)`` with an FP8 ``tl.dot`` (keys as M so that
  Hopper can use wgmma). Nothing past ``len`` is touched unless ``clean=True`` (the SGLang
  drop-in contract, which fills ``-inf`` there). When ``block_n`` divides the page size
  (``aligned``, the default; page 64 in SGLang), a block is one page id and one contiguous
  tile, and the per-key scales are loaded a block ahead (``prefetch``): Triton pipelines only
  the tiles that feed the dot, so without it every iteration waited for a page-id load and
  the dependent scale load (H200, 128K: 110 -> 85.6 µs, bit-identical). ``num_warps``,
  ``num_stages``, ``block_n``, ``nsplit`` and ``contiguous`` are sweepable
  (``kernels/tools/indexer_sweep.py``).
* ``indexer_topk``: rows with ``len <= k`` emit ``0..len-1`` and -1; longer rows select the
  exact top ``k`` (ties at the threshold taken in position order, output in ascending position
  order) with the page-table transform to physical slots (``page_table[b, i // ps] * ps +
  i % ps``, FlashMLA's ``extra_indices``) fused into the write. Three launches, the two row
  scans split over ``nprog`` programs per row:

  - A (``_split_hist_kernel``): each program histograms its chunk of a *windowed* digit
    ``clamp((key >> (23 - mant_bits)) - base, 0, 2^hist_bits - 1)`` of the monotone uint32
    key (sign, exponent, top ``mant_bits`` mantissa bits), ``base`` set so that the maximum of
    a strided sample sits two exponents below the top bin: the threshold bin then holds ~1-5%
    of a 32K row (a plain top-8-bit digit holds ~15%). Histograms need no mask: masked keys go
    to bin 0 and are subtracted afterwards.
  - B (``_split_compact_kernel``): each program sums the row's chunk histograms, finds the
    threshold bin and copies its chunk's candidates (positions and keys; digit at or above the
    threshold bin) into the row's list at an offset read off the earlier chunks' histograms:
    position order without atomics. The digit is monotone, so the list holds the whole top
    ``k`` and every tie of the threshold value.
  - C (``_split_select_kernel``, one program per row): the threshold bin's keys share their top
    ``9 + mant_bits`` bits, so the exact 8-bit radix select starts below them (2-3 passes over
    the list) and stops as soon as the threshold bin holds exactly the keys still needed; then
    the write. Rows up to ``direct`` keys, or whose list would exceed ``cap`` (heavy ties),
    run the same select on the row itself: slower, never wrong.

All are capture-safe: fixed grids from static values, lengths read on the device, scratch
buffers allocated per call (no host synchronisation).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import device_sms, interpreting
from .layout import INDEX_DIM, flat_bytes, index_geometry


@triton.jit
def _blk_page(pt_row, j, n, page_size, BN: tl.constexpr, ALIGNED: tl.constexpr):
    """Page ids of key block ``j`` (one scalar when ``ALIGNED``: the block lies in one page)."""
    if ALIGNED:
        page = tl.load(pt_row + (j * BN) // page_size, mask=j * BN < n, other=0)
    else:
        pos = j * BN + tl.arange(0, BN)
        page = tl.load(pt_row + pos // page_size, mask=pos < n, other=0)
    return page.to(tl.int64)


@triton.jit
def _blk_scale(kv_f32, page, j, n, page_size, page_bytes, BN: tl.constexpr,
               ALIGNED: tl.constexpr):
    """The fp32 scales of key block ``j`` (after each page's FP8 keys), 0 past ``n``."""
    pos = j * BN + tl.arange(0, BN)
    if ALIGNED:
        off0 = j * BN - ((j * BN) // page_size) * page_size
        ptr = kv_f32 + (page * page_bytes + page_size * 128 + off0 * 4) // 4 + tl.arange(0, BN)
    else:
        off = pos - (pos // page_size) * page_size
        ptr = kv_f32 + (page * page_bytes + page_size * 128 + off * 4) // 4
    return tl.load(ptr, mask=pos < n, other=0.0)


@triton.jit
def _logits_kernel(
    q_ptr, stride_qr, stride_qh, w_ptr, stride_wr,
    kv_u8, kv_f32, page_size, page_bytes,
    pt_ptr, stride_pt, len_ptr, out_ptr, stride_or, max_len, H,
    NSPLIT: tl.constexpr, BN: tl.constexpr, HP: tl.constexpr, CLEAN: tl.constexpr,
    DOT_F32: tl.constexpr, CONTIG: tl.constexpr, ALIGNED: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Logits of one row's key blocks ``j_lo, j_lo + j_step, ...`` (see ``indexer_logits``).

    ``PREFETCH``: Triton's pipeliner stages the key tiles (cp.async, they feed the dot) but not
    the scales, whose page-id load and dependent scale load then sit un-overlapped in every
    iteration (Triton 3.6 TTGIR: both are plain ``tt.load`` in the loop body). With it, the
    scales are loaded one block ahead and their page ids two blocks ahead, in registers."""
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n = tl.load(len_ptr + r)
    n = tl.minimum(tl.maximum(n, 0), max_len)
    heads = tl.arange(0, HP)
    hmask = heads < H
    dd = tl.arange(0, 128)
    qraw = tl.load(q_ptr + r.to(tl.int64) * stride_qr + heads[:, None] * stride_qh + dd[None, :],
                   mask=hmask[:, None], other=0)
    q = qraw.to(tl.float8e4nv, bitcast=True)
    if DOT_F32:
        q = q.to(tl.float32)
    w = tl.load(w_ptr + r.to(tl.int64) * stride_wr + heads, mask=hmask, other=0.0).to(tl.float32)
    qt = tl.trans(q)
    pt_row = pt_ptr + r.to(tl.int64) * stride_pt
    o_row = out_ptr + r.to(tl.int64) * stride_or
    nblk = tl.cdiv(n, BN)
    if CONTIG:  # this program's blocks are one contiguous run [lo, hi)
        per = tl.cdiv(nblk, NSPLIT)
        j_lo = sp * per
        j_hi = tl.minimum(j_lo + per, nblk)
        j_step = 1
    else:  # blocks sp, sp + NSPLIT, ... (interleaved over the row)
        j_lo = sp
        j_hi = nblk
        j_step = NSPLIT
    if PREFETCH:
        sc_nx = _blk_scale(kv_f32, _blk_page(pt_row, j_lo, n, page_size, BN, ALIGNED), j_lo, n,
                           page_size, page_bytes, BN, ALIGNED)
        pg_nx = _blk_page(pt_row, j_lo + j_step, n, page_size, BN, ALIGNED)
    for j in range(j_lo, j_hi, j_step):
        pos = j * BN + tl.arange(0, BN)
        pm = pos < n
        if ALIGNED:  # the block lies in one page: one page id, one contiguous [BN, 128] tile
            lp0 = (j * BN) // page_size
            off0 = j * BN - lp0 * page_size
            page0 = tl.load(pt_row + lp0).to(tl.int64)
            kb = page0 * page_bytes + off0 * 128
            rr = tl.arange(0, BN)
            k = tl.load(kv_u8 + kb + rr[:, None] * 128 + dd[None, :], mask=pm[:, None], other=0)
            if not PREFETCH:
                sc = tl.load(kv_f32 + (page0 * page_bytes + page_size * 128 + off0 * 4) // 4 + rr,
                             mask=pm, other=0.0)
        else:
            lp = pos // page_size
            off = pos - lp * page_size
            page = tl.load(pt_row + lp, mask=pm, other=0).to(tl.int64)
            kbase = page * page_bytes + off * 128
            k = tl.load(kv_u8 + kbase[:, None] + dd[None, :], mask=pm[:, None], other=0)
            if not PREFETCH:
                sc = tl.load(kv_f32 + (page * page_bytes + page_size * 128 + off * 4) // 4,
                             mask=pm, other=0.0)
        if PREFETCH:
            sc = sc_nx
            sc_nx = _blk_scale(kv_f32, pg_nx, j + j_step, n, page_size, page_bytes, BN, ALIGNED)
            pg_nx = _blk_page(pt_row, j + 2 * j_step, n, page_size, BN, ALIGNED)
        k = k.to(tl.float8e4nv, bitcast=True)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(k, qt, out_dtype=tl.float32)  # [BN, HP]
        s = tl.maximum(s, 0.0) * w[None, :]
        tl.store(o_row + pos, tl.sum(s, 1) * sc, mask=pm)
    if CLEAN:
        CB: tl.constexpr = 1024
        for j in range(sp, tl.cdiv(max_len - n, CB), NSPLIT):
            pos = n + j * CB + tl.arange(0, CB)
            tl.store(o_row + pos, tl.full([CB], float("-inf"), tl.float32), mask=pos < max_len)


@triton.jit
def _monotone_key(x):
    """Order-preserving map of float32 to uint32 (larger float, larger key)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)


@triton.jit
def _slot_of(pt_row, pos, mask, page_size):
    page = tl.load(pt_row + pos // page_size, mask=mask, other=0)
    return page * page_size + pos % page_size


@triton.jit
def _row_io(r, len_ptr, max_len, pt_ptr, stride_pt, out_ptr, stride_or, raw_ptr, stride_rr):
    """Row ``r``'s clamped length and its page-table, output and raw-output row pointers."""
    n = tl.minimum(tl.maximum(tl.load(len_ptr + r), 0), max_len)
    return (n, pt_ptr + r.to(tl.int64) * stride_pt, out_ptr + r.to(tl.int64) * stride_or,
            raw_ptr + r.to(tl.int64) * stride_rr)


@triton.jit
def _emit_short_row(n, pt_row, page_size, o_row, raw_row, K: tl.constexpr, KP: tl.constexpr,
                    WRITE_RAW: tl.constexpr):
    """A row with ``len <= K`` keeps every key: slots of ``0..len-1``, then -1."""
    pos = tl.arange(0, KP)
    keep = pos < n
    slot = _slot_of(pt_row, pos, keep, page_size)
    tl.store(o_row + pos, tl.where(keep, slot, -1), mask=pos < K)
    if WRITE_RAW:
        tl.store(raw_row + pos, tl.where(keep, pos, -1), mask=pos < K)


@triton.jit
def _emit_selected(gt, eq, pos, cnt_sel, cnt_eq, k_rem, pt_row, page_size, o_row, raw_row,
                   WRITE_RAW: tl.constexpr):
    """Write one chunk's selected keys as slots (and positions): every key above the threshold
    and the first ``k_rem`` equal to it in position order (deterministic tie-break), after the
    ``cnt_sel`` already written. Returns the updated (written, equal-seen) counters."""
    eq_i = eq.to(tl.int32)
    eq_rank = cnt_eq + tl.cumsum(eq_i, 0) - eq_i
    take = gt | (eq & (eq_rank < k_rem))
    take_i = take.to(tl.int32)
    dst = cnt_sel + tl.cumsum(take_i, 0) - take_i
    slot = _slot_of(pt_row, pos, take, page_size)
    tl.store(o_row + dst, slot, mask=take)
    if WRITE_RAW:
        tl.store(raw_row + dst, pos, mask=take)
    return cnt_sel + tl.sum(take_i, 0), cnt_eq + tl.sum(eq_i, 0)


@triton.jit
def _chunk_bounds(n, sp, NPROG: tl.constexpr, BLOCK: tl.constexpr):
    per = tl.cdiv(tl.cdiv(n, NPROG), BLOCK) * BLOCK
    lo = sp * per
    return lo, tl.minimum(lo + per, n)


# ---------------------------------------------------------------------------------------------
# Shared select machinery: the windowed digit, the exact radix select on a list or a row.


@triton.jit
def _select_bin(hist, k_rem, NB: tl.constexpr):
    """Largest bin b with count(bins >= b) >= k_rem.

    Returns (b, k_rem minus the count above b, count of b)."""
    bins = tl.arange(0, NB)
    suffix = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys in bins >= b
    sel = tl.max(tl.where(suffix >= k_rem, bins, -1), 0)
    above = tl.sum(tl.where(bins > sel, hist, 0), 0)
    cnt = tl.sum(tl.where(bins == sel, hist, 0), 0)
    return sel, k_rem - above, cnt


@triton.jit
def _source(l_row, s_pos, s_key, start, hi, hi_ld, MODE: tl.constexpr, CH: tl.constexpr):
    """Chunk ``[start, start + CH)`` of a key source. ``MODE`` 0: the row (position = index);
    1: the row's candidate list (positions from the scratch list, keys gathered from the
    logits, which are L1/L2-resident by then); 2: a candidate list that also stores the
    monotone keys (``s_key``), so no dependent gather; 3: as 2, bypassing L1 (``.cg``) for a
    list that other programs of the same launch wrote. Returns (monotone keys, positions, valid).

    Entries ``< hi`` are valid; loads run to ``hi_ld`` (``hi`` rounded up to 4 within the
    buffer), so that their mask is constant over 4 lanes and they vectorise."""
    offs = start + tl.arange(0, CH)
    m = offs < hi
    if MODE == 1:
        pos = tl.load(s_pos + offs, mask=offs < hi_ld, other=0)
        key = _monotone_key(tl.load(l_row + pos, mask=m, other=float("-inf")))
    elif MODE == 2:
        pos = tl.load(s_pos + offs, mask=offs < hi_ld, other=0)
        key = tl.load(s_key + offs, mask=offs < hi_ld, other=0).to(tl.uint32, bitcast=True)
    elif MODE == 3:  # as 2, from L2: the list was written by other programs of this launch
        pos = tl.load(s_pos + offs, mask=offs < hi_ld, other=0, cache_modifier=".cg")
        key = tl.load(s_key + offs, mask=offs < hi_ld, other=0,
                      cache_modifier=".cg").to(tl.uint32, bitcast=True)
    else:
        pos = offs
        key = _monotone_key(tl.load(l_row + offs, mask=offs < hi_ld, other=float("-inf")))
    return key, pos, m


@triton.jit
def _round4(n, limit):
    return tl.minimum((n + 3) // 4 * 4, limit)


@triton.jit
def _radix_select(l_row, s_pos, s_key, count, limit, K, MODE: tl.constexpr,
                  CH: tl.constexpr):
    """Exact threshold of the top ``K`` among ``count`` source keys: up to four 8-bit passes, most
    significant first, stopping as soon as the threshold bin holds exactly the keys still
    needed. Returns ``(prefix, shift, k_rem)``: the top ``32 - shift`` key bits of the threshold,
    and how many keys whose top bits equal ``prefix`` to take (all those above are taken).

    Keys that are masked or do not match the prefix are counted into bin 0 and subtracted
    afterwards (their number is known), so the histogram needs no mask and no spare bin."""
    bins = tl.arange(0, 256)
    prefix = tl.zeros([], tl.uint32)
    k_rem = tl.zeros([], tl.int32) + K
    shift = tl.full([], 24, tl.int32)
    n_match = count
    live = count > K
    n_proc = tl.cdiv(count, CH) * CH
    count_ld = _round4(count, limit)
    for p in tl.static_range(4):
        SH = 24 - 8 * p
        if live:
            hist = tl.zeros([256], tl.int32)
            for start in range(0, count, CH):
                key, _pos, m = _source(l_row, s_pos, s_key, start, count, count_ld, MODE, CH)
                if p == 0:  # noqa: SIM108 (static branch: no 32-bit shift is built)
                    match = m
                else:
                    match = m & ((key >> (SH + 8)) == prefix)
                digit = tl.where(match, (key >> SH) & 255, 0).to(tl.int32)
                hist += tl.histogram(digit, 256)
            hist = tl.where(bins == 0, hist - (n_proc - n_match), hist)
            sel, k_rem, n_match = _select_bin(hist, k_rem, 256)
            prefix = (prefix << 8) | sel.to(tl.uint32)
            shift = tl.full([], SH, tl.int32)
            live = n_match != k_rem
    return prefix, shift, k_rem


@triton.jit
def _write_selected(l_row, s_pos, s_key, count, limit, prefix, shift, k_rem, pt_row, page_size,
                    o_row, raw_row, WRITE_RAW: tl.constexpr, MODE: tl.constexpr,
                    CH: tl.constexpr):
    """Compact the selected source entries, in source (= position) order, into the outputs:
    top bits above ``prefix``, and the first ``k_rem`` equal to it."""
    sh = shift.to(tl.uint32)
    cnt_sel = tl.zeros([], tl.int32)
    cnt_eq = tl.zeros([], tl.int32)
    count_ld = _round4(count, limit)
    for start in range(0, count, CH):
        key, pos, m = _source(l_row, s_pos, s_key, start, count, count_ld, MODE, CH)
        top = key >> sh
        cnt_sel, cnt_eq = _emit_selected(m & (top > prefix), m & (top == prefix), pos, cnt_sel,
                                         cnt_eq, k_rem, pt_row, page_size, o_row, raw_row,
                                         WRITE_RAW)


@triton.jit
def _window_base(l_row, n, SAMPLE: tl.constexpr, RUN: tl.constexpr, MSH: tl.constexpr,
                 ANCHOR: tl.constexpr):
    """Window offset of the digit: the top bits (``key >> MSH``) of the largest of ``SAMPLE``
    keys of the row ``[0, n)``, minus ``ANCHOR``; a pure function of the row, so every program
    of a row computes the same value. ``RUN`` 1: single keys at stride ``n / SAMPLE`` (one
    32-byte sector each, which at 2048 samples of a 32K row touches every other sector);
    ``RUN`` > 1: ``SAMPLE / RUN`` runs of ``RUN`` consecutive keys, ``RUN / 8`` sectors each
    (radix3, where every program of a row takes the sample: on the H200, launch A 21.5 µs with
    2048 single keys)."""
    i = tl.arange(0, SAMPLE)
    if RUN == 1:
        smp = (i.to(tl.int64) * n // SAMPLE).to(tl.int32)
        anchor = tl.max(_monotone_key(tl.load(l_row + smp)), 0)
    else:
        smp = (i // RUN) * (n // (SAMPLE // RUN)) + i % RUN
        anchor = tl.max(_monotone_key(tl.load(l_row + smp, mask=smp < n,
                                              other=float("-inf"))), 0)
    return (anchor >> MSH).to(tl.int32) - ANCHOR


@triton.jit
def _window_digit(key, base, NB: tl.constexpr, MSH: tl.constexpr):
    """Monotone windowed digit ``clamp((key >> MSH) - base, 0, NB - 1)``."""
    return tl.minimum(tl.maximum((key >> MSH).to(tl.int32) - base, 0), NB - 1)


# ---------------------------------------------------------------------------------------------
# The top-k: three launches, the row scans split over several programs per row.


@triton.jit
def _split_hist_kernel(
    logit_ptr, stride_lr, len_ptr, hist_ptr, base_ptr, cnt_ptr, max_len,
    CH: tl.constexpr, SAMPLE: tl.constexpr, RUN: tl.constexpr, NB: tl.constexpr,
    MSH: tl.constexpr, ANCHOR: tl.constexpr, DIRECT: tl.constexpr, P: tl.constexpr,
):
    """radix3 launch A, program ``(row, p)``: the windowed-digit histogram of chunk ``p`` of a row
    longer than ``DIRECT``, stored (not added) at ``hist[row, p]``, so no buffer needs zeroing.
    Every program derives the same window from the same strided sample; program 0 stores it
    and zeroes the row's arrival counter (the fused B+C experiment uses it)."""
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + r), 0), max_len)
    if sp == 0:
        tl.store(cnt_ptr + r, 0)
    if n > DIRECT:
        l_row = logit_ptr + r.to(tl.int64) * stride_lr
        base = _window_base(l_row, n, SAMPLE, RUN, MSH, ANCHOR)
        if sp == 0:
            tl.store(base_ptr + r, base)
        lo, hi = _chunk_bounds(n, sp, P, CH)
        hi_ld = _round4(hi, max_len)
        hist = tl.zeros([NB], tl.int32)
        for start in range(lo, hi, CH):
            key, _pos, m = _source(l_row, l_row, l_row, start, hi, hi_ld, 0, CH)
            hist += tl.histogram(tl.where(m, _window_digit(key, base, NB, MSH), 0), NB)
        bins = tl.arange(0, NB)
        masked = tl.cdiv(tl.maximum(hi - lo, 0), CH) * CH - tl.maximum(hi - lo, 0)
        hist = tl.where(bins == 0, hist - masked, hist)
        tl.store(hist_ptr + (r * P + sp).to(tl.int64) * NB + bins, hist)


@triton.jit
def _split_threshold(hist_ptr, r, K: tl.constexpr, NB: tl.constexpr, P: tl.constexpr):
    """Threshold bin of a row from its ``P`` chunk histograms. Returns (per-chunk histograms
    ``[P, NB]``, threshold bin, keys still needed from it, its population, list length)."""
    progs = tl.arange(0, P)
    bins = tl.arange(0, NB)
    lh = tl.load(hist_ptr + (r * P + progs[:, None]).to(tl.int64) * NB + bins[None, :])
    sel, k_rem, n_sel = _select_bin(tl.sum(lh, 0), K, NB)
    return lh, sel, k_rem, n_sel, K - k_rem + n_sel


@triton.jit
def _compact_chunk(l_row, s_pos, s_key, lh, sel, base, n, sp, max_len, NB: tl.constexpr,
                   MSH: tl.constexpr, P: tl.constexpr, CH: tl.constexpr):
    """Copy chunk ``sp``'s keys of digit >= ``sel`` (positions and monotone keys) into the row's
    list, in position order, after the entries of chunks ``< sp`` (their number is read off
    the chunk histograms ``lh``): the list is in position order without atomics."""
    progs = tl.arange(0, P)
    bins = tl.arange(0, NB)
    per_chunk = tl.sum(tl.where(bins[None, :] >= sel, lh, 0), 1)
    at = tl.sum(tl.where(progs < sp, per_chunk, 0), 0)
    lo, hi = _chunk_bounds(n, sp, P, CH)
    hi_ld = _round4(hi, max_len)
    for start in range(lo, hi, CH):
        key, pos, m = _source(l_row, l_row, l_row, start, hi, hi_ld, 0, CH)
        keep = m & (_window_digit(key, base, NB, MSH) >= sel)
        keep_i = keep.to(tl.int32)
        dst = at + tl.cumsum(keep_i, 0) - keep_i
        tl.store(s_pos + dst, pos, mask=keep)
        tl.store(s_key + dst, key.to(tl.int32, bitcast=True), mask=keep)
        at += tl.sum(keep_i, 0)


@triton.jit
def _split_compact_kernel(
    logit_ptr, stride_lr, len_ptr, hist_ptr, base_ptr, lpos_ptr, lkey_ptr, max_len,
    K: tl.constexpr, CH: tl.constexpr, CAP: tl.constexpr, NB: tl.constexpr,
    MSH: tl.constexpr, DIRECT: tl.constexpr, P: tl.constexpr,
):
    """radix3 launch B, program ``(row, p)``: ``_compact_chunk`` of chunk ``p`` into the row's
    list, skipped when the list would exceed ``CAP`` (launch C then works on the row)."""
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + r), 0), max_len)
    if n > DIRECT:
        lh, sel, _k_rem, _n_sel, n_list = _split_threshold(hist_ptr, r, K, NB, P)
        if n_list <= CAP:
            _compact_chunk(logit_ptr + r.to(tl.int64) * stride_lr,
                           lpos_ptr + r.to(tl.int64) * CAP, lkey_ptr + r.to(tl.int64) * CAP,
                           lh, sel, tl.load(base_ptr + r), n, sp, max_len, NB, MSH, P, CH)


@triton.jit
def _below_pass(s_key, count, count_ld, n_proc, prefix, k_rem, n_match,
                S_HI: tl.constexpr, SH: tl.constexpr, MODE: tl.constexpr, CH: tl.constexpr):
    """One radix pass of ``_radix_select_below`` over key bits ``[SH, S_HI)`` of the list keys
    whose bits from ``S_HI`` up equal ``prefix``. Returns (prefix, k_rem, n_match) updated."""
    NBW: tl.constexpr = 1 << (S_HI - SH)
    hist = tl.zeros([NBW], tl.int32)
    for start in range(0, count, CH):
        key, _pos, m = _source(s_key, s_key, s_key, start, count, count_ld, MODE, CH)
        match = m & ((key >> S_HI) == prefix)
        digit = tl.where(match, (key >> SH) & (NBW - 1), 0).to(tl.int32)
        hist += tl.histogram(digit, NBW)
    bins = tl.arange(0, NBW)
    hist = tl.where(bins == 0, hist - (n_proc - n_match), hist)
    sel, k_rem, n_match = _select_bin(hist, k_rem, NBW)
    return (prefix << (S_HI - SH)) | sel.to(tl.uint32), k_rem, n_match


@triton.jit
def _radix_select_below(s_key, count, limit, prefix, k_rem, n_match, MSH: tl.constexpr,
                        MODE: tl.constexpr, CH: tl.constexpr):
    """``_radix_select`` on a stored-key list whose threshold is known to start with the
    ``32 - MSH`` bits ``prefix`` (``n_match`` list keys share them, ``k_rem`` of those are
    needed): only the ``MSH`` bits below remain, in byte-aligned passes (the first takes the
    bits above the highest byte boundary below ``MSH``), stopping as in ``_radix_select``."""
    TOP: tl.constexpr = 8 * ((MSH - 1) // 8)
    n_proc = tl.cdiv(count, CH) * CH
    count_ld = _round4(count, limit)
    shift = tl.full([], MSH, tl.int32)
    live = n_match != k_rem
    if live:
        prefix, k_rem, n_match = _below_pass(s_key, count, count_ld, n_proc, prefix, k_rem,
                                             n_match, MSH, TOP, MODE, CH)
        shift = tl.full([], TOP, tl.int32)
        live = n_match != k_rem
    for p in tl.static_range(TOP // 8):
        if live:
            prefix, k_rem, n_match = _below_pass(s_key, count, count_ld, n_proc, prefix, k_rem,
                                                 n_match, TOP - 8 * p, TOP - 8 * p - 8, MODE,
                                                 CH)
            shift = tl.full([], TOP - 8 * p - 8, tl.int32)
            live = n_match != k_rem
    return prefix, shift, k_rem


@triton.jit
def _select_list(l_row, s_pos, s_key, count, sel, k_rem, n_sel, base, pt_row, page_size,
                 o_row, raw_row, K: tl.constexpr, CAP: tl.constexpr, NB: tl.constexpr,
                 MSH: tl.constexpr, WRITE_RAW: tl.constexpr, MODE: tl.constexpr,
                 CH: tl.constexpr):
    """Exact select and write on a row's candidate list (``count`` entries in position order
    holding every key of digit >= ``sel``). When ``sel`` is not a clamped edge bin, its keys
    share their top ``32 - MSH`` bits (``base + sel``), so the select starts below them (at
    most ``ceil(MSH / 8)`` passes over the list, not four)."""
    if (sel > 0) & (sel < NB - 1):
        prefix, shift, k_rem = _radix_select_below(s_key, count, CAP, (base + sel).to(tl.uint32),
                                                   k_rem, n_sel, MSH, MODE, CH)
    else:
        prefix, shift, k_rem = _radix_select(l_row, s_pos, s_key, count, CAP, K, MODE, CH)
    _write_selected(l_row, s_pos, s_key, count, CAP, prefix, shift, k_rem, pt_row, page_size,
                    o_row, raw_row, WRITE_RAW, MODE, CH)


@triton.jit
def _select_row(l_row, n, max_len, pt_row, page_size, o_row, raw_row, K: tl.constexpr,
                WRITE_RAW: tl.constexpr, CH: tl.constexpr):
    """Exact select and write on the row itself (short rows, lists over the cap)."""
    prefix, shift, k_rem = _radix_select(l_row, l_row, l_row, n, max_len, K, 0, CH)
    _write_selected(l_row, l_row, l_row, n, max_len, prefix, shift, k_rem, pt_row, page_size,
                    o_row, raw_row, WRITE_RAW, 0, CH)


@triton.jit
def _split_select_kernel(
    logit_ptr, stride_lr, len_ptr, pt_ptr, stride_pt, page_size, hist_ptr, base_ptr,
    lpos_ptr, lkey_ptr, out_ptr, stride_or, raw_ptr, stride_rr, max_len,
    K: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr, CAP: tl.constexpr,
    NB: tl.constexpr, MSH: tl.constexpr, DIRECT: tl.constexpr, P: tl.constexpr,
    WRITE_RAW: tl.constexpr,
):
    """radix3 launch C, one program per row: the exact select and the write on the row's list
    (``_select_list``), or, for rows up to ``DIRECT`` keys and lists over ``CAP``, on the row
    itself."""
    r = tl.program_id(0)
    n, pt_row, o_row, raw_row = _row_io(r, len_ptr, max_len, pt_ptr, stride_pt, out_ptr,
                                        stride_or, raw_ptr, stride_rr)
    l_row = logit_ptr + r.to(tl.int64) * stride_lr
    if n <= K:
        _emit_short_row(n, pt_row, page_size, o_row, raw_row, K, KP, WRITE_RAW)
    else:
        use_list = n < 0  # False, as a device value
        count = n
        sel = tl.zeros([], tl.int32)
        k_rem = tl.zeros([], tl.int32)
        n_sel = tl.zeros([], tl.int32)
        if n > DIRECT:
            _lh, sel, k_rem, n_sel, n_list = _split_threshold(hist_ptr, r, K, NB, P)
            if n_list <= CAP:
                use_list = n_list >= 0  # True
                count = n_list
        if use_list:
            _select_list(l_row, lpos_ptr + r.to(tl.int64) * CAP, lkey_ptr + r.to(tl.int64) * CAP,
                         count, sel, k_rem, n_sel, tl.load(base_ptr + r), pt_row, page_size,
                         o_row, raw_row, K, CAP, NB, MSH, WRITE_RAW, 2, CH)
        else:
            _select_row(l_row, count, max_len, pt_row, page_size, o_row, raw_row, K, WRITE_RAW,
                        CH)


def _rows_lens(seq_lens: torch.Tensor, rows: int) -> torch.Tensor:
    if seq_lens.dim() == 2:
        seq_lens = seq_lens[:, 0]
    if seq_lens.numel() != rows:
        raise ValueError(
            f"seq_lens must have one entry per row ({rows}), got {tuple(seq_lens.shape)}"
        )
    if seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32, got {seq_lens.dtype}")
    return seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous()


def indexer_logits(
    q_fp8: torch.Tensor,
    index_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_len: int,
    out: torch.Tensor | None = None,
    clean: bool = False,
    nsplit: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 5,  # H200 sweep (notes v4): 5 stages 110 µs vs 3 stages 129 µs at 128K
    contiguous: bool = False,
    aligned: bool = True,  # H200 run (indexer_sweep): 110 -> 89 µs at 128K, 85.6 with prefetch
    prefetch: bool = True,
) -> torch.Tensor:
    """Logits ``[rows, max_len]`` fp32; only ``[:, :len]`` is written unless ``clean``.

    ``q_fp8`` is ``[rows, H, 128]`` (or ``[rows, 1, H, 128]``) FP8 E4M3 or its uint8 bytes;
    ``weights`` ``[rows, H]`` fp32 (q scale folded in); ``page_table`` ``[rows, max_pages]`` int32.
    Tunables (for sweeps; results do not depend on them): ``nsplit`` programs per row,
    ``block_n`` keys per step, ``num_warps``/``num_stages``, and ``contiguous`` (each program
    walks one contiguous run of blocks instead of every ``nsplit``-th block), ``aligned``
    (when ``block_n`` divides the page size: one page-table load and one contiguous tile per
    block instead of per-key addresses; ignored otherwise) and ``prefetch`` (scales loaded a
    block ahead in registers; see ``_logits_kernel``).
    """
    if q_fp8.dim() == 4:
        if q_fp8.shape[1] != 1:
            raise ValueError(f"q_fp8 with next_n={q_fp8.shape[1]} is not supported (use rows)")
        q_fp8 = q_fp8[:, 0]
    if q_fp8.dim() != 3 or q_fp8.shape[-1] != INDEX_DIM or q_fp8.element_size() != 1:
        raise ValueError(f"q_fp8 must be a 1-byte [rows, H, 128] tensor, got {q_fp8.dtype} "
                         f"{tuple(q_fp8.shape)}")
    rows, h, _ = q_fp8.shape
    if h > 128:
        raise ValueError(f"at most 128 indexer heads are supported, got {h}")
    if q_fp8.stride(-1) != 1:
        q_fp8 = q_fp8.contiguous()
    q_u8 = q_fp8.view(torch.uint8)
    _, page_size, page_bytes = index_geometry(index_cache)
    flat = flat_bytes(index_cache, page_bytes)
    lens = _rows_lens(seq_lens, rows)
    if page_table.dtype != torch.int32 or page_table.shape[0] != rows:
        raise ValueError(f"page_table must be int32 [rows={rows}, pages], got {page_table.dtype} "
                         f"{tuple(page_table.shape)}")
    weights = weights.float() if weights.dtype != torch.float32 else weights
    if out is None:
        out = torch.empty(rows, max_len, dtype=torch.float32, device=q_fp8.device)
    if nsplit is None:
        nsplit = max(1, min(64, (4 * device_sms(q_fp8)) // max(1, rows)))
    hp = max(16, triton.next_power_of_2(h))
    _logits_kernel[(rows, nsplit)](
        q_u8, q_u8.stride(0), q_u8.stride(1), weights, weights.stride(0),
        flat, flat.view(torch.float32), page_size, page_bytes,
        page_table, page_table.stride(0), lens, out, out.stride(0), max_len, h,
        NSPLIT=nsplit, BN=block_n, HP=hp, CLEAN=clean, DOT_F32=interpreting(), CONTIG=contiguous,
        ALIGNED=aligned and page_size % block_n == 0, PREFETCH=prefetch,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def indexer_topk(
    logits: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    topk: int,
    out: torch.Tensor | None = None,
    raw_out: torch.Tensor | None = None,
    block: int | None = None,
    nprog: int | None = None,
    num_warps: int | None = None,
    cap: int = 4096,
    direct: int | None = None,
    hist_bits: int = 7,  # H200 sweep (notes v4): 7/2 61 µs vs 8/3 70 µs at 128K, B=64
    mant_bits: int = 2,
    sel_block: int | None = None,
    sel_warps: int | None = None,
) -> torch.Tensor:
    """Top-``topk`` slots per row over ``logits[:, :len]`` with the page-to-slot transform.

    Returns ``[rows, topk]`` int32 physical slots (-1 padded; ascending position order within
    the selected set); ``raw_out``, if given, receives the logical positions. Exact top-k, ties
    at the threshold taken in position order; nothing at or past a row's length is read.

    Tunables (sweeps; the output does not depend on them): ``nprog`` programs per row for the
    two row scans (default :func:`radix3_nprog`, about four per SM), ``block``/``num_warps``
    of those scans (``R3_BLOCK``/``R3_WARPS``), ``sel_block``/``sel_warps`` of the select
    (``R3_SEL_BLOCK``/``R3_SEL_WARPS``), ``cap`` candidate-list entries, ``direct`` (rows up to
    this length skip the list; default ``topk``), ``hist_bits``/``mant_bits`` of the windowed
    digit. Earlier methods (one program per row, six launches, B and C fused) are in
    ``kernels/experimental``.
    """
    rows = logits.shape[0]
    lens = _rows_lens(seq_lens, rows)
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if out is None:
        out = torch.empty(rows, topk, dtype=torch.int32, device=logits.device)
    raw = raw_out if raw_out is not None else out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    _topk_radix3(logits, lens, page_table, page_size, topk, out, raw, raw_out is not None,
                 logits.shape[1], nprog or radix3_nprog(rows, device_sms(logits)),
                 block or R3_BLOCK, num_warps or R3_WARPS, sel_block or R3_SEL_BLOCK,
                 sel_warps or R3_SEL_WARPS, cap, topk if direct is None else direct,
                 hist_bits, mant_bits)
    return out


# radix3 defaults (H200, ``tools/indexer_sweep.py``, B=64, 128K): block 1024 x 4
# warps 36.4 µs vs 2048 x 8 40.6, 512 x 4 37.3; nprog 8 vs 4 38.4, 16 37.8; select 1024 x 4
# 35.9 vs 2048 x 8 36.4 vs 2048 x 16 36.6. radix3 sends every row longer than k through the
# list (``direct`` default k): its select on the row itself (one program per row) cost more at
# short rows (H200, top-k share, 4K: 20.3 vs 16.8 µs; 16K: 37.5 vs 32.4).
R3_BLOCK, R3_WARPS, R3_SEL_BLOCK, R3_SEL_WARPS = 1024, 4, 1024, 4


def radix3_nprog(rows: int, sms: int) -> int:
    """radix3's programs per row: about four per SM in all, a power of two in 1..32."""
    return 1 << (max(1, min(32, 4 * sms // max(1, rows))).bit_length() - 1)


def _window_consts(topk: int, block: int, cap: int, hist_bits: int, mant_bits: int
                   ) -> tuple[int, int, int]:
    """Check the windowed-digit tunables; returns (bins, mantissa shift, anchor bin)."""
    if block & (block - 1) or block < 32:
        raise ValueError(f"block must be a power of two >= 32, got {block}")
    if not 5 <= hist_bits <= 10:
        raise ValueError(f"hist_bits must be in 5..10, got {hist_bits}")
    if not 0 <= mant_bits <= 7:
        raise ValueError(f"mant_bits must be in 0..7, got {mant_bits}")
    if cap < topk:
        raise ValueError(f"cap ({cap}) must be at least topk ({topk})")
    nb = 1 << hist_bits
    # two exponents (2 << mant_bits bins) of headroom above the sampled maximum
    return nb, 23 - mant_bits, max(0, nb - 1 - (2 << mant_bits))


def _topk_radix3(logits: torch.Tensor, lens: torch.Tensor, page_table: torch.Tensor,
                 page_size: int, topk: int, out: torch.Tensor, raw: torch.Tensor, write_raw: bool,
                 max_len: int, nprog: int, block: int, num_warps: int, sel_block: int,
                 sel_warps: int, cap: int, direct: int, hist_bits: int, mant_bits: int,
                 stages: int = 3, sample: int = 1024
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the split top-k: chunk histograms (A) and the list compaction (B) on ``nprog``
    programs per row, then the select on the list (C) with one program per row. ``stages`` < 3
    stops early (the sweep's per-launch breakdown, the experiments' fused B+C; the output is
    then incomplete). Returns the scratch (hist, base, cnt, lpos, lkey)."""
    if nprog < 1 or nprog & (nprog - 1):
        raise ValueError(f"nprog must be a power of two, got {nprog}")
    nb, msh, anchor = _window_consts(topk, block, cap, hist_bits, mant_bits)
    _window_consts(topk, sel_block, cap, hist_bits, mant_bits)
    rows, dev = logits.shape[0], logits.device
    direct = max(direct, topk)
    hist = torch.empty(rows, nprog, nb, dtype=torch.int32, device=dev)
    base = torch.empty(rows, dtype=torch.int32, device=dev)
    cnt = torch.empty(rows, dtype=torch.int32, device=dev)
    lpos = torch.empty(rows, cap, dtype=torch.int32, device=dev)
    lkey = torch.empty(rows, cap, dtype=torch.int32, device=dev)
    grid = (rows, nprog)
    kp = triton.next_power_of_2(topk)
    _split_hist_kernel[grid](
        logits, logits.stride(0), lens, hist, base, cnt, max_len,
        CH=block, SAMPLE=sample, RUN=16, NB=nb, MSH=msh, ANCHOR=anchor, DIRECT=direct, P=nprog,
        num_warps=num_warps,
    )
    scratch = (hist, base, cnt, lpos, lkey)
    if stages < 2:
        return scratch
    _split_compact_kernel[grid](
        logits, logits.stride(0), lens, hist, base, lpos, lkey, max_len,
        K=topk, CH=block, CAP=cap, NB=nb, MSH=msh, DIRECT=direct, P=nprog, num_warps=num_warps,
    )
    if stages < 3:
        return scratch
    _split_select_kernel[(rows,)](
        logits, logits.stride(0), lens, page_table, page_table.stride(0), page_size, hist, base,
        lpos, lkey, out, out.stride(0), raw, raw.stride(0), max_len,
        K=topk, KP=kp, CH=sel_block, CAP=cap, NB=nb, MSH=msh,
        DIRECT=direct, P=nprog, WRITE_RAW=write_raw, num_warps=sel_warps,
    )
    return scratch


def dsa_indexer(
    q_fp8: torch.Tensor,
    index_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_len: int,
    topk: int,
    logits_ws: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits then top-k: ``[rows, topk]`` int32 slots in the compressed KV cache.

    ``logits_ws`` (``[rows, >= max_len]`` fp32) can be preallocated once for CUDA graphs; only
    each row's first ``len`` entries are written and read.
    """
    logits = indexer_logits(q_fp8, index_cache, weights, seq_lens, page_table, max_len,
                            out=logits_ws)
    return indexer_topk(logits, seq_lens, page_table, index_cache.shape[1], topk, out=out)
