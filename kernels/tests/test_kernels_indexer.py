"""DSA indexer (logits + length-aware top-k with the page-to-slot transform) vs references."""

from __future__ import annotations

import pytest
import torch

from dsv4_kernels.cases import check_topk, make_indexer_case
from dsv4_kernels.indexer import dsa_indexer, indexer_logits, indexer_topk
from dsv4_kernels.reference import ref_indexer_logits, ref_topk_transform


@pytest.mark.parametrize(("lens", "page_size", "heads"), [([0, 37, 130], 5, 8),
                                                          ([64, 1, 200], 64, 20)])
def test_logits_match_reference(gen: torch.Generator, lens: list[int], page_size: int,
                                heads: int) -> None:
    c = make_indexer_case(gen, batch=len(lens), heads=heads, lens=lens, max_len=210,
                          page_size=page_size)
    got = indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table,
                         c.max_len, clean=True, nsplit=3, block_n=16)
    ref = ref_indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table,
                             c.max_len)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(got))
    assert torch.all(torch.isneginf(got[~fin]))
    assert float((got[fin] - ref[fin]).norm() / ref[fin].norm()) < 1e-5


def test_logits_leave_tail_untouched_without_clean(gen: torch.Generator) -> None:
    c = make_indexer_case(gen, batch=2, heads=8, lens=[10, 30], max_len=100, page_size=7)
    out = torch.full((2, 100), 12345.0)
    indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table, 100, out=out,
                   nsplit=2, block_n=16)
    assert torch.all(out[0, 10:] == 12345.0) and torch.all(out[1, 30:] == 12345.0)
    assert not torch.any(out[0, :10] == 12345.0)


@pytest.mark.parametrize(("lens", "topk", "page_size", "nprog"), [
    ([0, 5, 24, 25, 300], 24, 7, 4),       # empty, shorter, equal, one over, much longer
    ([0, 5, 24, 25, 300], 24, 7, 1),
    ([100, 97], 16, 64, 8),
])
def test_topk_matches_torch_topk(gen: torch.Generator, lens: list[int], topk: int,
                                 page_size: int, nprog: int) -> None:
    b, max_len = len(lens), 320
    logits = torch.randn(b, max_len, generator=gen)
    # plant ties at the threshold region and negative values
    logits[:, ::7] = logits[:, 3:4]
    pages = -(-max_len // page_size)
    pt = torch.stack([torch.randperm(pages * 3, generator=gen)[:pages] for _ in range(b)])
    pt = pt.to(torch.int32)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    raw = torch.empty(b, topk, dtype=torch.int32)
    slots = indexer_topk(logits, lens_t, pt, page_size, topk, raw_out=raw, block=32,
                         nprog=nprog)
    res = check_topk(slots, raw, logits, lens_t, pt, page_size, topk)
    assert res["ok"], res
    ref_slots, _ = ref_topk_transform(logits, lens_t, pt, page_size, topk)
    for r, n in enumerate(lens):
        if n <= topk:  # no choice involved: exact same slots
            assert torch.equal(slots[r].sort().values, ref_slots[r].sort().values)


def test_topk_all_equal_is_deterministic(gen: torch.Generator) -> None:
    logits = torch.zeros(1, 50)
    pt = torch.arange(10, dtype=torch.int32).view(1, 10)
    lens = torch.tensor([50], dtype=torch.int32)
    raw = torch.empty(1, 8, dtype=torch.int32)
    indexer_topk(logits, lens, pt, 5, 8, raw_out=raw, block=16, nprog=2)
    assert raw[0].tolist() == list(range(8))  # ties resolved in index order


def test_dsa_indexer_end_to_end(gen: torch.Generator) -> None:
    c = make_indexer_case(gen, batch=2, heads=8, lens=[40, 150], max_len=160, page_size=6)
    slots = dsa_indexer(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table,
                        c.max_len, topk=32)
    # judge the selection on the kernel's own logits (checked against the reference above), so
    # rounding-level differences near the threshold cannot make the test flaky
    logits = indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table,
                            c.max_len)
    res = check_topk(slots, None, logits, c.seq_lens, c.page_table, 6, 32)
    assert res["ok"], res


def test_bad_lengths_dtype_is_a_clear_error(gen: torch.Generator) -> None:
    c = make_indexer_case(gen, batch=1, heads=8, lens=[4], max_len=8, page_size=4)
    with pytest.raises(ValueError, match="int32"):
        indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens.long(), c.page_table, 8)
