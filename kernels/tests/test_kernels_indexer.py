"""DSA indexer (logits + length-aware top-k with the page-to-slot transform) vs references."""

from __future__ import annotations

from typing import Any

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
                         nprog=nprog, direct=64)
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
    indexer_topk(logits, lens, pt, 5, 8, raw_out=raw, block=32, nprog=2, direct=8)
    assert raw[0].tolist() == list(range(8))  # ties resolved in index order
    raw.fill_(0)
    indexer_topk(logits, lens, pt, 5, 8, raw_out=raw)  # package defaults
    assert raw[0].tolist() == list(range(8))


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


def _random_pt(gen: torch.Generator, rows: int, max_len: int, page_size: int) -> torch.Tensor:
    pages = -(-max_len // page_size)
    return torch.stack([torch.randperm(pages * 2, generator=gen)[:pages] for _ in range(rows)]
                       ).to(torch.int32)


def _logits(gen: torch.Generator, kind: str, rows: int, max_len: int) -> torch.Tensor:
    if kind == "randn":
        return torch.randn(rows, max_len, generator=gen)
    if kind == "ties":  # a third of every row shares one value, planted near the top
        x = torch.randn(rows, max_len, generator=gen)
        x[:, ::3] = 1.5
        return x
    if kind == "negative":  # all negative, tightly packed (many equal top bits)
        return -torch.rand(rows, max_len, generator=gen) * 1e-3 - 5.0
    if kind == "integers":  # six distinct values: huge tie groups at the threshold
        return torch.randint(-3, 3, (rows, max_len), generator=gen).float()
    raise ValueError(kind)


def exact_topk(logits: torch.Tensor, lens: list[int], pt: torch.Tensor, page_size: int,
               topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract, independently: the ``topk`` largest of ``logits[r, :len]``, ties taken in
    position order, listed in ascending position order, -1 padded; and their slots."""
    raw = torch.full((len(lens), topk), -1, dtype=torch.int32)
    slots = raw.clone()
    for r, n in enumerate(lens):
        pos = torch.sort(-logits[r, :n], stable=True).indices[:topk].sort().values
        raw[r, :pos.numel()] = pos.to(torch.int32)
        slots[r, :pos.numel()] = (pt[r, pos // page_size] * page_size + pos % page_size).int()
    return slots, raw


def check_exact(gen: torch.Generator, kind: str, kw: dict[str, Any],
                topk_fn: Any = indexer_topk) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_fn(**kw)`` on rows of length 0, < k, == k, k + 1 and long, page size 7: equal to
    :func:`exact_topk` bit for bit. Returns the slots and positions."""
    lens, topk, page_size = [0, 7, 24, 25, 700, 2400], 24, 7
    rows, max_len = len(lens), 2410
    logits = _logits(gen, kind, rows, max_len)
    pt = _random_pt(gen, rows, max_len, page_size)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    got_raw = torch.empty(rows, topk, dtype=torch.int32)
    got = topk_fn(logits, lens_t, pt, page_size, topk, raw_out=got_raw, **kw)
    want, want_raw = exact_topk(logits, lens, pt, page_size, topk)
    assert check_topk(got, got_raw, logits, lens_t, pt, page_size, topk)["ok"]
    assert torch.equal(got_raw, want_raw) and torch.equal(got, want)
    return got, got_raw


@pytest.mark.parametrize(("kw", "field"), [
    (dict(cap=2), "cap"),
    (dict(nprog=3), "nprog"),
    (dict(sel_block=100), "block"),
    (dict(hist_bits=4), "hist_bits"),
])
def test_topk_method_and_tunables_are_checked(gen: torch.Generator, kw: dict[str, Any],
                                              field: str) -> None:
    logits = torch.randn(1, 10, generator=gen)
    lens = torch.tensor([10], dtype=torch.int32)
    pt = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=field):
        indexer_topk(logits, lens, pt, 16, 4, **kw)


def test_logits_tunables_keep_results(gen: torch.Generator) -> None:
    c = make_indexer_case(gen, batch=2, heads=8, lens=[70, 129], max_len=140, page_size=6)
    base = indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table,
                          c.max_len, clean=True, nsplit=3, block_n=16)
    for kw in (dict(contiguous=True), dict(num_warps=8, num_stages=2), dict(nsplit=1, block_n=32),
               dict(prefetch=True), dict(prefetch=True, contiguous=True, nsplit=2)):
        got = indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table,
                             c.max_len, clean=True, **kw)
        assert torch.equal(torch.isinf(got), torch.isinf(base))
        fin = torch.isfinite(base)
        assert torch.allclose(got[fin], base[fin], rtol=1e-5, atol=1e-5)


# radix3 tunables: several programs per row (also more programs than chunks: empty chunks), a cap
# too small for the list (whole-row fallback), rows below ``direct``,
# and other digit widths (incl. 8 mantissa-free bits: a select that starts 23 bits down)
_RADIX3 = [
    dict(nprog=4, block=64, sel_block=64, direct=64, cap=1024),
    dict(nprog=16, block=32, sel_block=128, direct=64, cap=1024),
    dict(nprog=2, block=64, sel_block=64, direct=64, cap=64),
    dict(nprog=4, block=128, direct=100000),
    dict(nprog=8, block=128, sel_block=256, direct=64, cap=2048, hist_bits=6, mant_bits=1),
    dict(nprog=1, block=256, sel_block=256, direct=64, cap=2048, hist_bits=10, mant_bits=7),
    dict(nprog=4, block=64, sel_block=64, direct=64, cap=2048, hist_bits=5, mant_bits=0),
]


@pytest.mark.parametrize("kind", ["randn", "ties", "negative", "integers"])
@pytest.mark.parametrize("cfg", range(len(_RADIX3)))
def test_topk_is_exact(gen: torch.Generator, kind: str, cfg: int) -> None:
    check_exact(gen, kind, _RADIX3[cfg])


def test_radix3_ties_at_threshold_and_spread_lengths(gen: torch.Generator) -> None:
    # a tie group straddling the threshold spread over every chunk: the first k_rem in position
    # order must win, whichever program compacts them; lengths that leave chunks empty
    topk, page_size, max_len = 64, 61, 5000
    lens = [5000, 4097, 130, 65, 64, 3001]
    rows = len(lens)
    logits = torch.randn(rows, max_len, generator=gen)
    logits[:, 3::11] = 2.5  # ~450 ties per full row, ~25 keys above them: k straddles them
    pt = _random_pt(gen, rows, max_len, page_size)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    raw = torch.empty(rows, topk, dtype=torch.int32)
    slots = indexer_topk(logits, lens_t, pt, page_size, topk, raw_out=raw, nprog=8, block=64,
                         sel_block=128, direct=64)
    assert check_topk(slots, raw, logits, lens_t, pt, page_size, topk)["ok"]
    want, want_raw = exact_topk(logits, lens, pt, page_size, topk)
    assert torch.equal(raw, want_raw) and torch.equal(slots, want)


def test_radix3_list_over_cap_falls_back_to_the_row(gen: torch.Generator) -> None:
    # every key equal: the threshold bin holds the whole row, far over the cap
    n, topk = 3000, 40
    logits = torch.full((2, n), 0.5)
    logits[1] = torch.randn(n, generator=gen)
    pt = _random_pt(gen, 2, n, 64)
    lens = torch.tensor([n, n], dtype=torch.int32)
    raw = torch.empty(2, topk, dtype=torch.int32)
    slots = indexer_topk(logits, lens, pt, 64, topk, raw_out=raw, nprog=4, block=128,
                         sel_block=256, direct=64, cap=topk)
    assert raw[0].tolist() == list(range(topk))
    assert check_topk(slots, raw, logits, lens, pt, 64, topk)["ok"]


@pytest.mark.parametrize("page_size", [16, 48])
def test_logits_aligned_and_prefetch_are_bit_identical(gen: torch.Generator,
                                                       page_size: int) -> None:
    # block_n divides the page size (the aligned path); lengths end mid-page and mid-block
    c = make_indexer_case(gen, batch=4, heads=8, lens=[200, 33, 0, 17], max_len=210,
                          page_size=page_size)
    args = (c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table, c.max_len)
    base = indexer_logits(*args, clean=True, nsplit=3, block_n=16)
    for kw in (dict(aligned=True), dict(aligned=True, prefetch=True),
               dict(aligned=True, prefetch=True, contiguous=True)):
        got = indexer_logits(*args, clean=True, nsplit=3, block_n=16, **kw)
        assert torch.equal(got, base), kw
