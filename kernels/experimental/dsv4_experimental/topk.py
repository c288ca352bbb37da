"""Top-k experiments, kept for side-by-side timing against the shipped ``indexer_topk``
(three launches, "radix3"); every method gives the same output (exact top-k, ties in position
order), which the experimental tests check.

* ``radix1``: one launch, one program per row: the windowed-digit histogram, the compaction of
  the candidates into a per-row list and the exact select, all in one program. H200, B=64,
  top-k share of logits + top-k: 128K 58.1 µs (radix3 34.2) and 1M rows at B=8 358.9 µs
  (radix3 42.0), but faster on short rows (4K 10.9 vs 16.8, 16K 17.8 vs 32.4): it keeps 64 of
  132 SMs busy at B=64, where radix3 splits the scans.
* ``radix6``: four 8-bit radix passes whose histograms meet in a global buffer (atomics), a
  count pass and a compaction pass: six launches of ~19 µs at B=64 / 128K (116 µs).
* ``fused``: radix3 with launches B and C fused (C in the last-arriving B program of each row,
  an arrival counter with CUTLASS-semaphore ordering): one launch fewer, but slower on the
  H200 (128K top-k share 38.4 vs 34.2 µs; 4K 25.8 vs 16.8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4_kernels._runtime import device_sms
from dsv4_kernels.indexer import (
    R3_BLOCK,
    R3_SEL_BLOCK,
    R3_WARPS,
    _chunk_bounds,
    _compact_chunk,
    _emit_selected,
    _emit_short_row,
    _monotone_key,
    _radix_select,
    _round4,
    _row_io,
    _rows_lens,
    _select_bin,
    _select_list,
    _select_row,
    _source,
    _split_threshold,
    _topk_radix3,
    _window_base,
    _window_consts,
    _window_digit,
    _write_selected,
    radix3_nprog,
)

METHODS = ("radix1", "radix6", "fused")


@triton.jit
def _select_digit(hist, k_rem):
    """Largest bin b with count(bins >= b) >= k_rem; returns (b, k_rem minus count above b)."""
    bins = tl.arange(0, 256)
    suffix = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys in bins >= b
    sel = tl.max(tl.where(suffix >= k_rem, bins, -1), 0)
    above = tl.sum(tl.where(bins > sel, hist, 0), 0)
    return sel, k_rem - above


@triton.jit
def _threshold(hist_row, K: tl.constexpr, UPTO: tl.constexpr):
    """Replay the digit choices of passes < UPTO from the row's global histograms."""
    prefix = tl.zeros([], tl.uint32)
    k_rem = tl.full([], K, tl.int32)
    for q in tl.static_range(UPTO):
        h = tl.load(hist_row + q * 256 + tl.arange(0, 256))
        sel, k_rem = _select_digit(h, k_rem)
        prefix = (prefix << 8) | sel.to(tl.uint32)
    return prefix, k_rem


@triton.jit
def _topk_hist_kernel(
    logit_ptr, stride_lr, len_ptr, hist_ptr, max_len,
    K: tl.constexpr, PASS: tl.constexpr, NPROG: tl.constexpr, BLOCK: tl.constexpr,
):
    """Radix pass PASS (8 bits, most significant first) over this program's share of a row."""
    r = tl.program_id(0)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + r), 0), max_len)
    if n > K:
        hist_row = hist_ptr + r.to(tl.int64) * 1024
        prefix, _k_rem = _threshold(hist_row, K, PASS)
        lo, hi = _chunk_bounds(n, tl.program_id(1), NPROG, BLOCK)
        l_row = logit_ptr + r.to(tl.int64) * stride_lr
        shift = 24 - 8 * PASS
        hist = tl.zeros([512], tl.int32)
        for start in range(lo, hi, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < hi
            key = _monotone_key(tl.load(l_row + offs, mask=m, other=float("-inf")))
            match = m if PASS == 0 else m & ((key >> (shift + 8)) == prefix)
            digit = ((key >> shift) & 255).to(tl.int32)
            hist += tl.histogram(tl.where(match, digit, 256), 512)
        bins = tl.arange(0, 512)
        tl.atomic_add(hist_row + PASS * 256 + bins, hist, mask=bins < 256)


@triton.jit
def _topk_count_kernel(
    logit_ptr, stride_lr, len_ptr, hist_ptr, cnt_ptr, max_len,
    K: tl.constexpr, NPROG: tl.constexpr, BLOCK: tl.constexpr,
):
    """Per program: how many keys of its share lie above / at the final threshold."""
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + r), 0), max_len)
    if n > K:
        prefix, _k_rem = _threshold(hist_ptr + r.to(tl.int64) * 1024, K, 4)
        lo, hi = _chunk_bounds(n, sp, NPROG, BLOCK)
        l_row = logit_ptr + r.to(tl.int64) * stride_lr
        n_gt = tl.zeros([], tl.int32)
        n_eq = tl.zeros([], tl.int32)
        for start in range(lo, hi, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < hi
            key = _monotone_key(tl.load(l_row + offs, mask=m, other=float("-inf")))
            n_gt += tl.sum((m & (key > prefix)).to(tl.int32), 0)
            n_eq += tl.sum((m & (key == prefix)).to(tl.int32), 0)
        cnt = cnt_ptr + (r * NPROG + sp).to(tl.int64) * 2
        tl.store(cnt, n_gt)
        tl.store(cnt + 1, n_eq)


@triton.jit
def _topk_write_kernel(
    logit_ptr, stride_lr, len_ptr, pt_ptr, stride_pt, page_size, hist_ptr, cnt_ptr,
    out_ptr, stride_or, raw_ptr, stride_rr, max_len,
    K: tl.constexpr, KP: tl.constexpr, NPROG: tl.constexpr, BLOCK: tl.constexpr,
    WRITE_RAW: tl.constexpr,
):
    """Write the selected keys as physical slots: every key above the threshold and the first
    ``k_rem`` keys equal to it in index order (deterministic), rows with ``len <= K`` as
    ``0..len-1`` then -1."""
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n, pt_row, o_row, raw_row = _row_io(r, len_ptr, max_len, pt_ptr, stride_pt, out_ptr,
                                        stride_or, raw_ptr, stride_rr)
    if n <= K:
        if sp == 0:
            _emit_short_row(n, pt_row, page_size, o_row, raw_row, K, KP, WRITE_RAW)
    else:
        prefix, k_rem = _threshold(hist_ptr + r.to(tl.int64) * 1024, K, 4)
        progs = tl.arange(0, NPROG)
        cnt = cnt_ptr + (r * NPROG + progs).to(tl.int64) * 2
        before = progs < sp
        gt_before = tl.sum(tl.where(before, tl.load(cnt), 0), 0)
        eq_before = tl.sum(tl.where(before, tl.load(cnt + 1), 0), 0)
        cnt_sel = gt_before + tl.minimum(eq_before, k_rem)
        cnt_eq = eq_before
        lo, hi = _chunk_bounds(n, sp, NPROG, BLOCK)
        l_row = logit_ptr + r.to(tl.int64) * stride_lr
        for start in range(lo, hi, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < hi
            key = _monotone_key(tl.load(l_row + offs, mask=m, other=float("-inf")))
            cnt_sel, cnt_eq = _emit_selected(m & (key > prefix), m & (key == prefix), offs,
                                             cnt_sel, cnt_eq, k_rem, pt_row, page_size, o_row,
                                             raw_row, WRITE_RAW)


@triton.jit
def _topk_row_kernel(
    logit_ptr, stride_lr, len_ptr, pt_ptr, stride_pt, page_size, scratch_ptr,
    out_ptr, stride_or, raw_ptr, stride_rr, max_len,
    K: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr, CAP: tl.constexpr,
    DIRECT: tl.constexpr, NB: tl.constexpr, MSH: tl.constexpr, ANCHOR: tl.constexpr,
    WRITE_RAW: tl.constexpr,
):
    """Whole top-k of one row in one program (see the module docstring).

    Rows longer than ``DIRECT``: pass A histograms a windowed digit of each key
    (``clamp((key >> MSH) - base, 0, NB - 1)``, ``base`` placed so that the largest of a strided
    sample of the row lands in bin ``ANCHOR``); pass B copies every key whose digit is at or above
    the threshold bin (a superset of the top ``K`` holding all ties at the threshold, in position
    order) into the row's scratch list, when it fits in ``CAP`` entries. The exact radix select
    and the output then run on that short list. Otherwise they run on the row itself."""
    r = tl.program_id(0)
    n, pt_row, o_row, raw_row = _row_io(r, len_ptr, max_len, pt_ptr, stride_pt, out_ptr,
                                        stride_or, raw_ptr, stride_rr)
    if n <= K:
        _emit_short_row(n, pt_row, page_size, o_row, raw_row, K, KP, WRITE_RAW)
    else:
        l_row = logit_ptr + r.to(tl.int64) * stride_lr
        s_pos = scratch_ptr + r.to(tl.int64) * CAP
        count = n
        use_list = n < 0  # False, as a device value
        if n > DIRECT:
            # pass A: windowed histogram, anchored on a strided sample's maximum
            base = _window_base(l_row, n, CH, 1, MSH, ANCHOR)
            hist = tl.zeros([NB], tl.int32)
            n_ld = _round4(n, max_len)
            for start in range(0, n, CH):
                key, _pos, m = _source(l_row, s_pos, s_pos, start, n, n_ld, 0, CH)
                d = _window_digit(key, base, NB, MSH)
                hist += tl.histogram(tl.where(m, d, 0), NB)
            bins = tl.arange(0, NB)
            hist = tl.where(bins == 0, hist - (tl.cdiv(n, CH) * CH - n), hist)
            sel, k_rem, n_sel = _select_bin(hist, K, NB)
            n_list = K - k_rem + n_sel
            if n_list <= CAP:
                # pass B: the candidate list (digit >= sel), in position order
                at = tl.zeros([], tl.int32)
                for start in range(0, n, CH):
                    key, pos, m = _source(l_row, s_pos, s_pos, start, n, n_ld, 0, CH)
                    d = _window_digit(key, base, NB, MSH)
                    keep = m & (d >= sel)
                    keep_i = keep.to(tl.int32)
                    dst = at + tl.cumsum(keep_i, 0) - keep_i
                    tl.store(s_pos + dst, pos, mask=keep)
                    at += tl.sum(keep_i, 0)
                count = n_list
                use_list = n_list >= 0  # True
                tl.debug_barrier()  # the list is written and read by different threads
        if use_list:
            prefix, shift, k_rem = _radix_select(l_row, s_pos, s_pos, count, CAP, K, 1, CH)
            _write_selected(l_row, s_pos, s_pos, count, CAP, prefix, shift, k_rem, pt_row,
                            page_size, o_row, raw_row, WRITE_RAW, 1, CH)
        else:
            prefix, shift, k_rem = _radix_select(l_row, s_pos, s_pos, count, max_len, K, 0, CH)
            _write_selected(l_row, s_pos, s_pos, count, max_len, prefix, shift, k_rem, pt_row,
                            page_size, o_row, raw_row, WRITE_RAW, 0, CH)


@triton.jit
def _split_compact_select_kernel(
    logit_ptr, stride_lr, len_ptr, pt_ptr, stride_pt, page_size, hist_ptr, base_ptr, cnt_ptr,
    lpos_ptr, lkey_ptr, out_ptr, stride_or, raw_ptr, stride_rr, max_len,
    K: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr, SCH: tl.constexpr, CAP: tl.constexpr,
    NB: tl.constexpr, MSH: tl.constexpr, DIRECT: tl.constexpr, P: tl.constexpr,
    WRITE_RAW: tl.constexpr,
):
    """radix3 launches B and C fused (``fuse=True``): each program compacts its chunk, then
    counts itself in on the row's arrival counter (zeroed by launch A); the last of the row's
    ``P`` programs runs the select on the finished list, so no third launch is needed.

    Ordering (the pattern of CUTLASS's ``Semaphore``): a CTA barrier after the list stores,
    then one thread's ``acq_rel`` atomic at GPU scope; the last program reads the list through
    L2 (``.cg``). Rows that need no list are done by program 0 alone."""
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n, pt_row, o_row, raw_row = _row_io(r, len_ptr, max_len, pt_ptr, stride_pt, out_ptr,
                                        stride_or, raw_ptr, stride_rr)
    l_row = logit_ptr + r.to(tl.int64) * stride_lr
    if n <= K:
        if sp == 0:
            _emit_short_row(n, pt_row, page_size, o_row, raw_row, K, KP, WRITE_RAW)
    elif n <= DIRECT:
        if sp == 0:
            _select_row(l_row, n, max_len, pt_row, page_size, o_row, raw_row, K, WRITE_RAW, SCH)
    else:
        lh, sel, k_rem, n_sel, n_list = _split_threshold(hist_ptr, r, K, NB, P)
        if n_list > CAP:
            if sp == 0:
                _select_row(l_row, n, max_len, pt_row, page_size, o_row, raw_row, K, WRITE_RAW,
                            SCH)
        else:
            base = tl.load(base_ptr + r)
            s_pos = lpos_ptr + r.to(tl.int64) * CAP
            s_key = lkey_ptr + r.to(tl.int64) * CAP
            _compact_chunk(l_row, s_pos, s_key, lh, sel, base, n, sp, max_len, NB, MSH, P, CH)
            tl.debug_barrier()  # every thread's list stores precede the release below
            done = tl.atomic_add(cnt_ptr + r, 1, sem="acq_rel", scope="gpu")
            if done == P - 1:
                _select_list(l_row, s_pos, s_key, n_list, sel, k_rem, n_sel, base, pt_row,
                             page_size, o_row, raw_row, K, CAP, NB, MSH, WRITE_RAW, 3, SCH)


def _topk_radix1(logits: torch.Tensor, lens: torch.Tensor, page_table: torch.Tensor,
                 page_size: int, topk: int, out: torch.Tensor, raw: torch.Tensor, write_raw: bool,
                 max_len: int, block: int, num_warps: int, cap: int, direct: int, hist_bits: int,
                 mant_bits: int) -> None:
    """Launch the one-program-per-row top-k (checks its tunables first)."""
    nb, msh, anchor = _window_consts(topk, block, cap, hist_bits, mant_bits)
    rows = logits.shape[0]
    scratch = torch.empty(rows, cap, dtype=torch.int32, device=logits.device)
    _topk_row_kernel[(rows,)](
        logits, logits.stride(0), lens, page_table, page_table.stride(0), page_size, scratch,
        out, out.stride(0), raw, raw.stride(0), max_len,
        K=topk, KP=triton.next_power_of_2(topk), CH=block, CAP=cap, DIRECT=max(direct, topk),
        NB=nb, MSH=msh, ANCHOR=anchor, WRITE_RAW=write_raw, num_warps=num_warps,
    )


def topk_variant(logits: torch.Tensor, seq_lens: torch.Tensor, page_table: torch.Tensor,
                 page_size: int, topk: int, method: str, out: torch.Tensor | None = None,
                 raw_out: torch.Tensor | None = None, block: int | None = None,
                 nprog: int | None = None, num_warps: int | None = None, cap: int = 4096,
                 direct: int | None = None, hist_bits: int = 7, mant_bits: int = 2,
                 sel_block: int | None = None) -> torch.Tensor:
    """``indexer_topk``'s contract through an experimental ``method`` (:data:`METHODS`).
    radix1: ``block`` (2048), ``num_warps`` (16), ``cap``, ``direct`` (4096), digit bits;
    radix6: ``block`` (2048), ``nprog``; fused: radix3's tunables."""
    rows = logits.shape[0]
    lens = _rows_lens(seq_lens, rows)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if out is None:
        out = torch.empty(rows, topk, dtype=torch.int32, device=logits.device)
    raw = raw_out if raw_out is not None else out
    logits = logits.contiguous()
    max_len = logits.shape[1]
    if method == "radix1":
        _topk_radix1(logits, lens, page_table, page_size, topk, out, raw, raw_out is not None,
                     max_len, block or 2048, num_warps or 16, cap,
                     4096 if direct is None else direct, hist_bits, mant_bits)
        return out
    if method == "fused":
        nprog = nprog or radix3_nprog(rows, device_sms(logits))
        block, sel_block = block or R3_BLOCK, sel_block or R3_SEL_BLOCK
        direct = max(topk if direct is None else direct, topk)
        hist, base, cnt, lpos, lkey = _topk_radix3(
            logits, lens, page_table, page_size, topk, out, raw, raw_out is not None, max_len,
            nprog, block, num_warps or R3_WARPS, sel_block, 4, cap, direct, hist_bits,
            mant_bits, stages=1)
        nb, msh, _ = _window_consts(topk, block, cap, hist_bits, mant_bits)
        _split_compact_select_kernel[(rows, nprog)](
            logits, logits.stride(0), lens, page_table, page_table.stride(0), page_size, hist,
            base, cnt, lpos, lkey, out, out.stride(0), raw, raw.stride(0), max_len,
            K=topk, KP=triton.next_power_of_2(topk), CH=block, SCH=sel_block, CAP=cap, NB=nb,
            MSH=msh, DIRECT=direct, P=nprog, WRITE_RAW=raw_out is not None,
            num_warps=num_warps or R3_WARPS,
        )
        return out
    block = block or 2048
    if nprog is None:
        nprog = max(1, min(32, triton.next_power_of_2(max(1, 2 * device_sms(logits) // rows))))
    if nprog & (nprog - 1):
        raise ValueError(f"nprog must be a power of two, got {nprog}")
    hist = torch.zeros(rows, 4, 256, dtype=torch.int32, device=logits.device)
    cnt = torch.empty(rows, nprog, 2, dtype=torch.int32, device=logits.device)
    grid = (rows, nprog)
    for p in range(4):
        _topk_hist_kernel[grid](logits, logits.stride(0), lens, hist, max_len, K=topk, PASS=p,
                                NPROG=nprog, BLOCK=block, num_warps=8)
    _topk_count_kernel[grid](logits, logits.stride(0), lens, hist, cnt, max_len, K=topk,
                             NPROG=nprog, BLOCK=block, num_warps=8)
    _topk_write_kernel[grid](
        logits, logits.stride(0), lens, page_table, page_table.stride(0), page_size, hist, cnt,
        out, out.stride(0), raw, raw.stride(0), max_len,
        K=topk, KP=triton.next_power_of_2(topk), NPROG=nprog, BLOCK=block,
        WRITE_RAW=raw_out is not None, num_warps=8,
    )
    return out
