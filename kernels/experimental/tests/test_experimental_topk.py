"""The top-k experiments give the shipped ``indexer_topk``'s output bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dsv4_experimental.topk import topk_variant
from test_kernels_indexer import _logits, _random_pt, check_exact

from dsv4_kernels.cases import check_topk


def _method(method: str) -> Any:
    def run(*args: Any, **kw: Any) -> torch.Tensor:
        return topk_variant(*args, method=method, **kw)
    return run


_CASES = [
    ("radix1", dict(block=64, direct=64, cap=1024)),
    ("radix1", dict(block=64, direct=64, cap=64)),
    ("radix1", dict(block=128, direct=100000)),
    ("radix1", dict(block=256, direct=64, cap=2048, hist_bits=10, mant_bits=7)),
    ("radix6", dict(block=64, nprog=4)),
    ("fused", dict(nprog=4, block=64, sel_block=64, direct=64, cap=1024)),
    ("fused", dict(nprog=2, block=64, sel_block=64, direct=64, cap=64)),
    ("fused", dict(nprog=4, block=64, sel_block=64, direct=64, cap=2048, hist_bits=5,
                   mant_bits=0)),
]


@pytest.mark.parametrize("kind", ["randn", "ties", "integers"])
@pytest.mark.parametrize("case", range(len(_CASES)))
def test_experiment_is_exact(gen: torch.Generator, kind: str, case: int) -> None:
    method, kw = _CASES[case]
    check_exact(gen, kind, kw, _method(method))


@pytest.mark.parametrize("topk", [512, 1024])
def test_radix1_large_k(gen: torch.Generator, topk: int) -> None:
    lens = [topk - 1, topk, topk + 1, 3 * topk + 5]
    rows, max_len, page_size = len(lens), 3 * topk + 8, 61
    logits = _logits(gen, "randn", rows, max_len)
    logits[:, 1::5] = logits[:, 2:3]  # ties
    pt = _random_pt(gen, rows, max_len, page_size)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    raw = torch.empty(rows, topk, dtype=torch.int32)
    got = topk_variant(logits, lens_t, pt, page_size, topk, "radix1", raw_out=raw, block=512,
                       direct=topk, cap=2 * topk + 512)
    assert check_topk(got, raw, logits, lens_t, pt, page_size, topk)["ok"]
    assert raw[0, -1] == -1 and raw[1].tolist() == list(range(topk))


def test_unknown_method_is_refused(gen: torch.Generator) -> None:
    with pytest.raises(ValueError, match="method"):
        topk_variant(torch.zeros(1, 4), torch.tensor([4], dtype=torch.int32),
                     torch.zeros(1, 1, dtype=torch.int32), 4, 2, "sort")
