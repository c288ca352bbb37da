"""Pieces every decode variant shares: the split-K cut of a row's key range, the choice of the
SWA or the extra cache, MODEL1 slot offsets (as ``@triton.jit`` functions whose bodies have no
layouts, so the Gluon kernels of ``wg_decode``/``ws_decode`` recompile them with
``gluon.jit``), the key-list record the launchers pass around, and the base-2 constants.

Kept apart from ``sparse_decode`` (the Triton kernels and the dispatcher) so that the Gluon
modules import these without importing the dispatcher that imports them: no import cycle.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _model1_slots(idx, ps, pb):
    """Byte offsets of each slot's 576 data bytes and of its 8 scale bytes in a flat MODEL1
    cache of ``ps`` tokens and ``pb`` bytes per page (layout.py). Index -1 maps to slot 0;
    callers mask those loads. max() rather than where(valid, ...): Triton 3.6's
    layout-conversion removal fails on a select fed by pf's loop-carried indices (seen
    compiling for sm_90 with Triton 3.6.0)."""
    safe = tl.maximum(idx, 0).to(tl.int64)
    page = safe // ps
    off = safe - page * ps
    return page * pb + off * 576, page * pb + ps * 576 + off * 8


@triton.jit
def _split_range(a_len, a_topk, b_len, b_topk, bidx, sp, A_HAS_LEN: tl.constexpr,
                 HAS_B: tl.constexpr, B_HAS_LEN: tl.constexpr, NSPLIT: tl.constexpr,
                 BT: tl.constexpr):
    """Valid lengths read on the device and this split's share ``[lo, hi)`` of the row's tiles
    (SWA tiles first, then the extra ones): the adaptive split-K cut."""
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
    tiles_a = tl.cdiv(n_a, BT)
    total = tiles_a + tl.cdiv(n_b, BT)
    per = tl.cdiv(total, NSPLIT)
    lo = sp * per
    hi = tl.minimum(lo + per, total)
    return n_a, n_b, tiles_a, lo, hi


@triton.jit
def _keys_of(first, a_u8, a_bf16, a_ps, a_pb, b_u8, b_bf16, b_ps, b_pb):
    """The cache of the SWA list (``first``) or of the extra list: its bytes, its BF16 view,
    tokens per page and bytes per page."""
    if first:
        u8 = a_u8
        bf = a_bf16
        ps = a_ps
        pb = a_pb
    else:
        u8 = b_u8
        bf = b_bf16
        ps = b_ps
        pb = b_pb
    return u8, bf, ps, pb


@dataclasses.dataclass(frozen=True)
class _Keys:
    """One key list (the SWA list or the extra one) as the kernels take it."""

    u8: torch.Tensor
    bf: torch.Tensor
    idx: torch.Tensor
    length: torch.Tensor | None
    topk: int
    ps: int
    pb: int


def page_log2(ps: int) -> int:
    """log2 of a power-of-two page size, else -1 (``ws`` then divides, and is not chosen)."""
    return ps.bit_length() - 1 if ps > 0 and ps & (ps - 1) == 0 else -1
