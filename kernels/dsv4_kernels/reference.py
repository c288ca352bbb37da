"""Float32 torch references (oracles) for the sparse-MLA decode and the DSA indexer.

These define what the Triton kernels must compute; tests, the self-test and the benchmark
compare against them. They follow FlashMLA ``tests/ref.py::ref_sparse_attn_decode``
(sink-exclusive natural-log LSE, ``+inf`` LSE and zero output for rows without keys, the sink
scaling the output by ``1 / (1 + exp(sink - lse))``) and DeepGEMM ``ref_paged_mqa_logits``
followed by a length-aware top-k with the page-to-slot transform of SGLang's
``topk_transform_512``. The reference KV is the *dequantized* cache, so only the kernels'
arithmetic is under test.
"""

from __future__ import annotations

import torch

from .layout import dequantize_index_keys, dequantize_model1


def _gather(
    kv: torch.Tensor, indices: torch.Tensor, length: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys ``[B, s_q, T, 512]`` and validity ``[B, s_q, T]`` of one cache's index list."""
    b, s_q, topk = indices.shape
    valid = indices >= 0
    if length is not None:
        pos = torch.arange(topk, device=indices.device)
        valid = valid & (pos.view(1, 1, -1) < length.view(b, 1, 1).to(indices.device))
    keys = kv.index_select(0, indices.clamp_min(0).reshape(-1).long())
    keys = torch.nan_to_num(keys).view(b, s_q, topk, -1)
    return keys, valid


def ref_sparse_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode in float32: ``(out [B, s_q, H, 512], lse [B, H, s_q])``."""
    qf = q.float()
    keys, valid = _gather(dequantize_model1(k_cache), indices, topk_length)
    if extra_k_cache is not None and extra_indices is not None:
        k2, v2 = _gather(dequantize_model1(extra_k_cache), extra_indices, extra_topk_length)
        keys = torch.cat([keys, k2], dim=2)
        valid = torch.cat([valid, v2], dim=2)
    s = torch.einsum("bqhd,bqtd->bqht", qf, keys) * sm_scale
    s = s.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B, s_q, H]; -inf where no keys
    empty = torch.isneginf(lse)
    p = torch.exp(s - lse.masked_fill(empty, 0.0).unsqueeze(-1))
    out = torch.einsum("bqht,bqtd->bqhd", p, keys)
    if attn_sink is not None:
        factor = 1.0 / (1.0 + torch.exp(attn_sink.float().view(1, 1, -1) - lse))
        out = out * factor.unsqueeze(-1)
    out = out.masked_fill(empty.unsqueeze(-1), 0.0)
    lse = lse.masked_fill(empty, float("inf"))
    return out, lse.permute(0, 2, 1).contiguous()


def ref_indexer_logits(
    q_fp8: torch.Tensor,
    index_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_len: int,
) -> torch.Tensor:
    """``logits[b, n] = scale[n] * sum_h w[b, h] * relu(q[b, h] . k[n])``; ``-inf`` past the length.

    ``q_fp8`` is ``[B, H, 128]`` FP8 E4M3 (its scale already folded into ``weights``).
    """
    vals, scales = dequantize_index_keys(index_cache)
    page_size = index_cache.shape[1]
    b = q_fp8.shape[0]
    pos = torch.arange(max_len, device=q_fp8.device)
    pages = page_table.long().gather(1, (pos // page_size).clamp_max(page_table.shape[1] - 1)
                                     .view(1, -1).expand(b, -1))
    slots = pages.clamp_min(0) * page_size + (pos % page_size).view(1, -1)
    k = vals[slots]  # [B, N, 128]
    dots = torch.einsum("bhd,bnd->bnh", q_fp8.float(), k)
    logits = (dots.relu() * weights.float().unsqueeze(1)).sum(-1) * scales[slots]
    return logits.masked_fill(pos.view(1, -1) >= seq_lens.view(-1, 1).long(), float("-inf"))


def ref_topk_transform(
    logits: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Length-aware top-k: ``(slots [B, topk], raw positions [B, topk])`` with -1 padding.

    Rows with ``len <= topk`` get positions ``0..len-1``; otherwise the ``topk`` largest logits
    among the first ``len``. Order within a row is unspecified (compare as sets).
    """
    b = logits.shape[0]
    raw = torch.full((b, topk), -1, dtype=torch.long, device=logits.device)
    for r in range(b):
        n = int(seq_lens[r])
        if n <= topk:
            raw[r, :n] = torch.arange(n, device=logits.device)
        else:
            raw[r] = torch.topk(logits[r, :n], topk).indices
    page = page_table.long().gather(1, (raw.clamp_min(0) // page_size))
    slots = page * page_size + raw.clamp_min(0) % page_size
    slots = slots.masked_fill(raw < 0, -1)
    return slots.to(torch.int32), raw.to(torch.int32)
