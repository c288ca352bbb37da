"""dsv4_kernels: Triton sparse-MLA decode and DSA indexer kernels for DeepSeek-V4 on sm_90/sm_120.

The package root stays import-light (no torch/triton at import) because a ``.pth`` hook in the
engine's environment imports ``dsv4_kernels.sglang_hook`` at every interpreter start; the public
functions load on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "sparse_mla_decode": "sparse_decode",
    "DecodeConfig": "sparse_decode",
    "indexer_logits": "indexer",
    "indexer_topk": "indexer",
    "dsa_indexer": "indexer",
    "quantize_model1": "layout",
    "dequantize_model1": "layout",
    "quantize_index_keys": "layout",
    "dequantize_index_keys": "layout",
    "ref_sparse_decode": "reference",
    "ref_indexer_logits": "reference",
    "ref_topk_transform": "reference",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'dsv4_kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dsv4_kernels.{mod}"), name)
