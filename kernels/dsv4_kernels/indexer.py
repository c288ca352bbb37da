"""DSA indexer for DeepSeek-V4: paged FP8 MQA logits and a length-aware top-k, in Triton.

Why this exists: SGLang 0.5.23's sm_120 indexer path (``fp8_paged_mqa_logits_torch_sm120``)
gathers and multiplies every page up to the *maximum* context each step, and its top-k
(``torch.topk`` over ``max_seq_len``) does too; at a 1M-token limit that costs O(1M) per row
whatever the real length. Here all work and traffic follow each row's real length:

* ``indexer_logits``: grid ``(rows, splits)`` fixed by static values; each program walks its
  share of the row's key blocks ``[0, len)`` (length read on the device), computing
  ``scale[n] * sum_h w[h] * relu(q_h . k_n)`` with an FP8 ``tl.dot`` (keys as M so that
  Hopper can use wgmma). Nothing past ``len`` is touched unless ``clean=True`` (the SGLang
  drop-in contract, which fills ``-inf`` there).
* ``indexer_topk``: one program per row; rows with ``len <= k`` emit ``0..len-1`` and -1;
  longer rows run a 4-pass 8-bit radix select over the first ``len`` logits (monotone uint32
  keys, ``tl.histogram``), then one compaction pass that keeps every key above the threshold
  and the first ones equal to it in index order (deterministic tie-break). The page-table
  transform to physical slots (``page_table[b, i // ps] * ps + i % ps``, FlashMLA's
  ``extra_indices``) is fused into the compaction.

Both are capture-safe: fixed grids, lengths on the device, no host synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import device_sms, interpreting
from .layout import INDEX_DIM, flat_bytes, index_geometry


@triton.jit
def _logits_kernel(
    q_ptr, stride_qr, stride_qh, w_ptr, stride_wr,
    kv_u8, kv_f32, page_size, page_bytes,
    pt_ptr, stride_pt, len_ptr, out_ptr, stride_or, max_len, H,
    NSPLIT: tl.constexpr, BN: tl.constexpr, HP: tl.constexpr, CLEAN: tl.constexpr,
    DOT_F32: tl.constexpr,
):
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
    for j in range(sp, nblk, NSPLIT):
        pos = j * BN + tl.arange(0, BN)
        pm = pos < n
        lp = pos // page_size
        off = pos - lp * page_size
        page = tl.load(pt_row + lp, mask=pm, other=0).to(tl.int64)
        kbase = page * page_bytes + off * 128
        k = tl.load(kv_u8 + kbase[:, None] + dd[None, :], mask=pm[:, None], other=0)
        k = k.to(tl.float8e4nv, bitcast=True)
        if DOT_F32:
            k = k.to(tl.float32)
        sc = tl.load(kv_f32 + (page * page_bytes + page_size * 128 + off * 4) // 4, mask=pm,
                     other=0.0)
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
def _topk_kernel(
    logit_ptr, stride_lr, len_ptr, pt_ptr, stride_pt, page_size, out_ptr, stride_or,
    raw_ptr, stride_rr, max_len,
    K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, WRITE_RAW: tl.constexpr,
):
    r = tl.program_id(0)
    n = tl.load(len_ptr + r)
    n = tl.minimum(tl.maximum(n, 0), max_len)
    pt_row = pt_ptr + r.to(tl.int64) * stride_pt
    o_row = out_ptr + r.to(tl.int64) * stride_or
    raw_row = raw_ptr + r.to(tl.int64) * stride_rr
    l_row = logit_ptr + r.to(tl.int64) * stride_lr
    if n <= K:
        pos = tl.arange(0, KP)
        keep = pos < n
        slot = _slot_of(pt_row, pos, keep, page_size)
        tl.store(o_row + pos, tl.where(keep, slot, -1), mask=pos < K)
        if WRITE_RAW:
            tl.store(raw_row + pos, tl.where(keep, pos, -1), mask=pos < K)
    else:
        bins = tl.arange(0, 512)
        prefix = tl.zeros([], tl.uint32)
        k_rem = tl.full([], K, tl.int32)
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros([512], tl.int32)
            for start in range(0, n, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                m = offs < n
                key = _monotone_key(tl.load(l_row + offs, mask=m, other=float("-inf")))
                match = m if p == 0 else m & ((key >> (shift + 8)) == prefix)
                digit = ((key >> shift) & 255).to(tl.int32)
                hist += tl.histogram(tl.where(match, digit, 256), 512)
            hv = tl.where(bins < 256, hist, 0)
            suffix = tl.sum(hv, 0) - tl.cumsum(hv, 0) + hv  # count in bins >= b
            sel = tl.max(tl.where((suffix >= k_rem) & (bins < 256), bins, -1), 0)
            above = tl.sum(tl.where(bins > sel, hv, 0), 0)
            k_rem = k_rem - above
            prefix = (prefix << 8) | sel.to(tl.uint32)
        # prefix is now the exact threshold key; take all keys above it and the first
        # k_rem keys equal to it, in index order.
        cnt_sel = tl.zeros([], tl.int32)
        cnt_eq = tl.zeros([], tl.int32)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < n
            key = _monotone_key(tl.load(l_row + offs, mask=m, other=float("-inf")))
            gt = m & (key > prefix)
            eq = m & (key == prefix)
            eq_i = eq.to(tl.int32)
            eq_rank = cnt_eq + tl.cumsum(eq_i, 0) - eq_i
            take = gt | (eq & (eq_rank < k_rem))
            take_i = take.to(tl.int32)
            dst = cnt_sel + tl.cumsum(take_i, 0) - take_i
            slot = _slot_of(pt_row, offs, take, page_size)
            tl.store(o_row + dst, slot, mask=take)
            if WRITE_RAW:
                tl.store(raw_row + dst, offs, mask=take)
            cnt_sel += tl.sum(take_i, 0)
            cnt_eq += tl.sum(eq_i, 0)


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
) -> torch.Tensor:
    """Logits ``[rows, max_len]`` fp32; only ``[:, :len]`` is written unless ``clean``.

    ``q_fp8`` is ``[rows, H, 128]`` (or ``[rows, 1, H, 128]``) FP8 E4M3 or its uint8 bytes;
    ``weights`` ``[rows, H]`` fp32 (q scale folded in); ``page_table`` ``[rows, max_pages]`` int32.
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
        NSPLIT=nsplit, BN=block_n, HP=hp, CLEAN=clean, DOT_F32=interpreting(),
        num_warps=4, num_stages=3,
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
    block: int = 4096,
) -> torch.Tensor:
    """Top-``topk`` slots per row over ``logits[:, :len]`` with the page-to-slot transform.

    Returns ``[rows, topk]`` int32 physical slots (-1 padded, order unspecified); ``raw_out``, if
    given, receives the logical positions.
    """
    rows = logits.shape[0]
    lens = _rows_lens(seq_lens, rows)
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if out is None:
        out = torch.empty(rows, topk, dtype=torch.int32, device=logits.device)
    raw = raw_out if raw_out is not None else out
    _topk_kernel[(rows,)](
        logits, logits.stride(0), lens, page_table, page_table.stride(0), page_size,
        out, out.stride(0), raw, raw.stride(0), logits.shape[1],
        K=topk, KP=triton.next_power_of_2(topk), BLOCK=block, WRITE_RAW=raw_out is not None,
        num_warps=8,
    )
    return out


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
