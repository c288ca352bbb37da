"""Random problem generators and comparison rules shared by tests, self-test and benchmark.

One definition of "a valid input" and "close enough" keeps the CPU tests, the on-host self-test
and the H200 benchmark honest with each other. Inputs are drawn fresh from a caller-seeded
generator each time; tolerances follow FlashMLA's sparse-decode test (out: abs 1e-3-ish plus
rel 2/128 for bf16 outputs; lse: tight absolute) scaled to this kernel's bf16 P.V product.
"""

from __future__ import annotations

import dataclasses

import torch

from .layout import quantize_index_keys, quantize_model1


@dataclasses.dataclass
class DecodeCase:
    """Inputs of one sparse-decode call (keyword names of :func:`sparse_mla_decode`)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    indices: torch.Tensor
    topk_length: torch.Tensor | None
    sm_scale: float
    attn_sink: torch.Tensor | None
    extra_k_cache: torch.Tensor | None
    extra_indices: torch.Tensor | None
    extra_topk_length: torch.Tensor | None

    def kwargs(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def unique_tokens(self) -> int:
        n = int((self.indices >= 0).sum())
        if self.extra_indices is not None:
            n += int((self.extra_indices >= 0).sum())
        return n


def _distinct_slots(g: torch.Generator, b: int, per_req: int, topk: int, region: int,
                    device: str) -> torch.Tensor:
    """[b, topk] slots; request i draws distinct slots from its own region of ``region`` slots."""
    keys = torch.rand(b, region, generator=g, device="cpu")
    sel = keys.argsort(dim=1)[:, :topk] if topk <= region else None
    if sel is None:
        raise ValueError(f"topk {topk} exceeds per-request region {region}")
    base = torch.arange(b).view(-1, 1) * per_req
    return (base + sel).to(torch.int32).to(device)


def make_decode_case(
    g: torch.Generator,
    *,
    batch: int,
    heads: int,
    topk: int,
    extra_topk: int = 0,
    page_size: int = 64,
    extra_page_size: int = 64,
    s_q: int = 1,
    sink: bool = True,
    lengths: str = "full",
    invalid_frac: float = 0.0,
    device: str = "cpu",
) -> DecodeCase:
    """A decode problem with distinct keys per request.

    ``lengths``: ``full`` (every index valid), ``random`` (random valid prefixes incl. 0) or
    ``zero`` (no valid keys at all).
    """
    region = max(topk, 1) + 3
    n_slots = batch * region
    pages = -(-n_slots // page_size)
    kv = torch.randn(pages, page_size, 512, generator=g).to(device)
    k_cache = quantize_model1(kv)
    idx = _distinct_slots(g, batch, region, topk, region, device)
    idx = idx.view(batch, 1, topk).expand(batch, s_q, topk).contiguous()
    if invalid_frac > 0:
        drop = torch.rand(idx.shape, generator=g) < invalid_frac
        idx = idx.masked_fill(drop.to(device), -1)
    extra_cache = extra_idx = extra_len = None
    if extra_topk > 0:
        region_e = extra_topk + 5
        pages_e = -(-(batch * region_e) // extra_page_size)
        kv_e = torch.randn(pages_e, extra_page_size, 512, generator=g).to(device)
        extra_cache = quantize_model1(kv_e)
        extra_idx = _distinct_slots(g, batch, region_e, extra_topk, region_e, device)
        extra_idx = extra_idx.view(batch, 1, extra_topk).expand(batch, s_q, extra_topk)
        extra_idx = extra_idx.contiguous()
        if invalid_frac > 0:
            drop = torch.rand(extra_idx.shape, generator=g) < invalid_frac
            extra_idx = extra_idx.masked_fill(drop.to(device), -1)
    topk_len: torch.Tensor | None = None
    if lengths == "random":
        topk_len = torch.randint(0, topk + 1, (batch,), generator=g, dtype=torch.int32)
        topk_len = topk_len.to(device)
        if extra_topk > 0:
            extra_len = torch.randint(0, extra_topk + 1, (batch,), generator=g,
                                      dtype=torch.int32).to(device)
    elif lengths == "zero":
        topk_len = torch.zeros(batch, dtype=torch.int32, device=device)
        if extra_topk > 0:
            extra_len = torch.zeros(batch, dtype=torch.int32, device=device)
    elif lengths == "full":
        topk_len = torch.full((batch,), topk, dtype=torch.int32, device=device)
        if extra_topk > 0:
            extra_len = torch.full((batch,), extra_topk, dtype=torch.int32, device=device)
    else:
        raise ValueError(f"lengths must be full|random|zero, got {lengths!r}")
    q = torch.randn(batch, s_q, heads, 512, generator=g).to(device=device, dtype=torch.bfloat16)
    attn_sink = torch.randn(heads, generator=g).to(device) if sink else None
    return DecodeCase(q, k_cache, idx, topk_len, 512 ** -0.5, attn_sink, extra_cache, extra_idx,
                      extra_len)


def make_prefill_case(
    g: torch.Generator,
    *,
    rows: int,
    heads: int,
    swa: int = 128,
    topk: int = 1024,
    context: int = 65536,
    page_size: int = 256,
    extra_page_size: int = 64,
    overlap_noise: float = 0.5,
    device: str = "cpu",
) -> DecodeCase:
    """One prefill chunk as SGLang hands it to the sparse decode: ``rows`` consecutive positions
    of one request ending at ``context``, each row a "batch" entry with s_q = 1.

    Row i (position p) attends to its SWA window (the ``swa`` slots up to p) and to ``topk`` of
    the request's C4 compressed keys before it (``context // 4`` in all), chosen the way the
    indexer does, by score: a per-request score per key plus per-row noise of ``overlap_noise``
    standard deviations, so that neighbouring rows select mostly the same keys (what a chunk's
    rows share, and what a kernel can reuse through L2).
    """
    if rows > context:
        raise ValueError(f"rows ({rows}) must not exceed the context ({context})")
    n_comp = context // 4
    pages = -(-context // page_size)
    k_cache = quantize_model1(torch.randn(pages, page_size, 512, generator=g).to(device))
    pages_e = -(-n_comp // extra_page_size)
    extra_cache = quantize_model1(torch.randn(pages_e, extra_page_size, 512,
                                              generator=g).to(device))
    pos = torch.arange(context - rows, context)
    win = pos.view(-1, 1) - torch.arange(swa - 1, -1, -1).view(1, -1)
    idx = torch.where(win >= 0, win, -1).to(torch.int32)
    avail = ((pos + 1) // 4).clamp(max=n_comp)  # compressed keys before each row
    score = torch.randn(n_comp, generator=g).view(1, -1) + overlap_noise * torch.randn(
        rows, n_comp, generator=g)
    score = score.masked_fill(torch.arange(n_comp).view(1, -1) >= avail.view(-1, 1),
                              float("-inf"))
    k = min(topk, n_comp)
    top = score.topk(k, dim=1)
    extra_idx = torch.where(torch.isfinite(top.values), top.indices, -1).to(torch.int32)
    if k < topk:
        extra_idx = torch.cat([extra_idx, torch.full((rows, topk - k), -1, dtype=torch.int32)], 1)
    extra_len = avail.clamp(max=topk).to(torch.int32)
    # valid entries first (the indexer's top-k output is a prefix of valid slots)
    extra_idx = extra_idx.gather(1, (extra_idx < 0).to(torch.int8).argsort(dim=1, stable=True))
    q = torch.randn(rows, 1, heads, 512, generator=g).to(device=device, dtype=torch.bfloat16)
    return DecodeCase(q, k_cache, idx.view(rows, 1, swa).to(device),
                      torch.full((rows,), swa, dtype=torch.int32, device=device), 512 ** -0.5,
                      torch.randn(heads, generator=g).to(device), extra_cache,
                      extra_idx.view(rows, 1, topk).to(device), extra_len.to(device))


def compare_decode(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor,
                   ref_lse: torch.Tensor) -> dict[str, object]:
    """FlashMLA-style closeness: elementwise out (abs 4e-3 + rel 2/128), lse abs 1e-3, inf match."""
    o = out.float()
    finite_ok = bool(torch.equal(torch.isinf(lse), torch.isinf(ref_lse)))
    fin = torch.isfinite(ref_lse)
    lse_err = float((lse[fin] - ref_lse[fin]).abs().max()) if bool(fin.any()) else 0.0
    out_ok = bool(torch.all((o - ref_out).abs() <= 4e-3 + (2 / 128) * ref_out.abs()))
    nan_free = not bool(torch.isnan(o).any())
    denom = float(ref_out.norm()) or 1.0
    rel = float((o - ref_out).norm()) / denom
    ok = finite_ok and out_ok and nan_free and lse_err <= 1e-3
    return {"ok": ok, "out_rel_err": rel, "lse_max_abs_err": lse_err,
            "inf_pattern_ok": finite_ok, "out_elementwise_ok": out_ok}


@dataclasses.dataclass
class IndexerCase:
    """Inputs of one indexer call."""

    q_fp8: torch.Tensor
    index_cache: torch.Tensor
    weights: torch.Tensor
    seq_lens: torch.Tensor
    page_table: torch.Tensor
    max_len: int


def make_indexer_case(
    g: torch.Generator,
    *,
    batch: int,
    heads: int,
    lens: list[int],
    max_len: int,
    page_size: int = 64,
    device: str = "cpu",
) -> IndexerCase:
    """Indexer problem: each row's pages are distinct pages of one shared pool."""
    if len(lens) != batch:
        raise ValueError("one length per row")
    max_pages = -(-max_len // page_size)
    used = [-(-n // page_size) for n in lens]
    pool = max(1, sum(used))
    keys = torch.randn(pool, page_size, 128, generator=g)
    cache = quantize_index_keys(keys.to(device))
    perm = torch.randperm(pool, generator=g)
    pt = torch.zeros(batch, max_pages, dtype=torch.int32)
    at = 0
    for r, u in enumerate(used):
        pt[r, :u] = perm[at:at + u].to(torch.int32)
        at += u
    q = (torch.randn(batch, heads, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(batch, heads, generator=g) * heads ** -0.5
    return IndexerCase(q.to(device), cache, w.to(device),
                       torch.tensor(lens, dtype=torch.int32, device=device), pt.to(device),
                       max_len)


def check_topk(slots: torch.Tensor, raw: torch.Tensor | None, logits: torch.Tensor,
               seq_lens: torch.Tensor, page_table: torch.Tensor, page_size: int,
               topk: int) -> dict[str, object]:
    """Top-k validity against ``torch.topk`` on the same logits, forgiving tie order.

    Checks per row: slots are distinct, -1 exactly where fewer than ``topk`` keys exist, each
    slot is the page transform of a position < len, and the multiset of selected logits equals
    the reference's (so equal-valued ties may differ in index).
    """
    bad: list[int] = []
    s_cpu, l_cpu = slots.cpu().long(), logits.float().cpu()
    pt = page_table.cpu().long()
    for r in range(slots.shape[0]):
        n = int(seq_lens[r])
        row = s_cpu[r]
        want_valid = min(n, topk)
        valid = row[row >= 0]
        if valid.numel() != want_valid or valid.unique().numel() != want_valid:
            bad.append(r)
            continue
        if n <= topk:
            expect = pt[r, torch.arange(n) // page_size] * page_size + torch.arange(n) % page_size
            if not torch.equal(valid.sort().values, expect.sort().values):
                bad.append(r)
            continue
        # map slots back to positions through the row's page table (vectorized)
        ar = torch.arange(n)
        all_slots = pt[r, ar // page_size] * page_size + ar % page_size
        order = all_slots.argsort()
        at = torch.searchsorted(all_slots[order], valid).clamp_max(n - 1)
        if not torch.equal(all_slots[order][at], valid):
            bad.append(r)
            continue
        pos = order[at]
        if raw is not None and not torch.equal(raw[r].cpu().long()[row >= 0].sort().values,
                                               pos.sort().values):
            bad.append(r)
            continue
        got = l_cpu[r, pos].sort().values
        ref = torch.topk(l_cpu[r, :n], topk).values.sort().values
        if not torch.equal(got, ref):
            bad.append(r)
    return {"ok": not bad, "bad_rows": bad[:8]}
