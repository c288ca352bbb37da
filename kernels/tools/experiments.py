"""The benches' door to ``kernels/experimental``: puts it on the import path, registers the
decode experiments (``staged``, ``gp``, ``pg``, and on a Triton with Gluon the sm_90 ``wg`` and
``ws``) with the shipped launcher, and gives one top-k entry
point for the shipped method (``radix3``) and the experiments (``radix1``, ``radix6``,
``fuse=True``), so sweeps can time them side by side."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experimental"))

import dsv4_experimental.decode
import dsv4_experimental.pg
from dsv4_experimental.topk import topk_variant

try:  # Gluon is experimental in Triton: an older or newer API leaves wg and ws unregistered
    import dsv4_experimental.wg_decode
    import dsv4_experimental.ws_decode  # noqa: F401
except (ImportError, AttributeError):
    pass

from dsv4_kernels.indexer import indexer_topk


def topk(logits: Any, lens: Any, pt: Any, page: int, k: int, method: str = "radix3",
         fuse: bool = False, **kw: Any) -> Any:
    """``indexer_topk`` for ``radix3`` (the shipped method), else the experiment."""
    if fuse:
        method = "fused"
    if method in ("radix3", "auto"):
        return indexer_topk(logits, lens, pt, page, k, **kw)
    return topk_variant(logits, lens, pt, page, k, method, **kw)
