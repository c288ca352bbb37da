"""Byte layouts of the DeepSeek-V4 caches, and quantize/dequantize helpers for them.

Owns the two on-device formats the kernels read, so that kernels, references, tests and the
benchmark agree on one definition:

* MODEL1 latent KV (FlashMLA ``MODEL1_FP8Sparse``, SGLang 0.5.23 ``DeepSeekV4SingleKVPool``):
  584 B per token = 448 FP8 E4M3 "nope" values (one UE8M0 scale per 64) + 64 BF16 rope values.
  Page-level layout: ``[page_size * 576 data][page_size * 8 scales]``, the page padded up to a
  multiple of 576 B (FlashMLA ``tests/quant.py``; SGLang asserts the same padding in
  ``deepseek_v4_memory_pool.py``). A cache is passed as a ``[num_pages, page_size, 1, 584]``
  uint8 view whose ``stride(0)`` is the padded page size in bytes.
* DSA indexer keys (DeepGEMM paged MQA-logits layout): 128 FP8 E4M3 values + one FP32 scale per
  token, page layout ``[page_size * 128 fp8][page_size * 4 fp32]``, passed as
  ``[num_pages, page_size, 1, 132]`` uint8.

Quantization follows FlashMLA ``tests/quant.py``: ``scale = 2^ceil(log2(max(amax, 1e-4) / 448))``.
"""

from __future__ import annotations

import math

import torch

NOPE_DIM = 448
ROPE_DIM = 64
HEAD_DIM = NOPE_DIM + ROPE_DIM  # 512: d_qk == d_v for MODEL1
DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
SCALE_BYTES = 8  # 7 UE8M0 scales + 1 pad
BYTES_PER_TOKEN = DATA_BYTES + SCALE_BYTES  # 584
QUANT_BLOCK = 64
NUM_SCALES = NOPE_DIM // QUANT_BLOCK  # 7

INDEX_DIM = 128
INDEX_BYTES_PER_TOKEN = INDEX_DIM + 4  # 132
FP8_MAX = 448.0


def model1_page_bytes(page_size: int) -> int:
    """Bytes of one MODEL1 page, padded up to a multiple of 576 (FlashMLA/SGLang rule)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    return math.ceil(page_size * BYTES_PER_TOKEN / DATA_BYTES) * DATA_BYTES


def _ue8m0_scale(amax: torch.Tensor) -> torch.Tensor:
    """Power-of-two scale that maps ``amax`` into the E4M3 range (exponent only, UE8M0)."""
    return torch.pow(2.0, torch.ceil(torch.log2(amax.clamp_min(1e-4) / FP8_MAX)))


def quantize_model1(kv: torch.Tensor) -> torch.Tensor:
    """Pack float latent vectors ``[num_pages, page_size, 512]`` into a MODEL1 cache.

    Returns a ``[num_pages, page_size, 1, 584]`` uint8 view over a padded page buffer, the shape
    FlashMLA and SGLang pass as ``k_cache``.
    """
    if kv.dim() != 3 or kv.shape[-1] != HEAD_DIM:
        raise ValueError(
            f"quantize_model1 wants [num_pages, page_size, {HEAD_DIM}], got {tuple(kv.shape)}"
        )
    num_pages, page_size, _ = kv.shape
    page_bytes = model1_page_bytes(page_size)
    x = kv.float()
    nope = x[..., :NOPE_DIM].reshape(num_pages, page_size, NUM_SCALES, QUANT_BLOCK)
    scale = _ue8m0_scale(nope.abs().amax(dim=-1))  # [P, ps, 7]
    q = (nope / scale.unsqueeze(-1)).reshape(num_pages, page_size, NOPE_DIM)
    q8 = q.to(torch.float8_e4m3fn)
    exp = (torch.log2(scale).round() + 127).to(torch.uint8)
    rope = x[..., NOPE_DIM:].to(torch.bfloat16)

    buf = torch.zeros(num_pages, page_bytes, dtype=torch.uint8, device=kv.device)
    data = buf[:, : page_size * DATA_BYTES].view(num_pages, page_size, DATA_BYTES)
    data[..., :NOPE_DIM] = q8.view(torch.uint8)
    data[..., NOPE_DIM:] = rope.contiguous().view(torch.uint8).view(num_pages, page_size, 128)
    scales = buf[:, page_size * DATA_BYTES : page_size * (DATA_BYTES + SCALE_BYTES)]
    scales = scales.view(num_pages, page_size, SCALE_BYTES)
    scales[..., :NUM_SCALES] = exp
    return model1_cache_view(buf, page_size)


def model1_cache_view(buf: torch.Tensor, page_size: int) -> torch.Tensor:
    """View a ``[num_pages, page_bytes]`` uint8 buffer as ``[num_pages, page_size, 1, 584]``."""
    if buf.dtype != torch.uint8 or buf.dim() != 2:
        raise ValueError(f"want a 2-D uint8 page buffer, got {buf.dtype} {tuple(buf.shape)}")
    page_bytes = model1_page_bytes(page_size)
    if buf.shape[1] != page_bytes or buf.stride(1) != 1:
        raise ValueError(
            f"page buffer rows must be {page_bytes} contiguous bytes for page_size {page_size}, "
            f"got shape {tuple(buf.shape)} strides {buf.stride()}"
        )
    return buf.as_strided(
        (buf.shape[0], page_size, 1, BYTES_PER_TOKEN),
        (buf.stride(0), BYTES_PER_TOKEN, BYTES_PER_TOKEN, 1),
    )


def model1_geometry(k_cache: torch.Tensor) -> tuple[int, int, int]:
    """(num_pages, page_size, page_bytes) of a MODEL1 cache view, validated."""
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != BYTES_PER_TOKEN:
        raise ValueError(
            "MODEL1 k_cache must be [num_pages, page_size, 1, 584] "
            f"(uint8/float8 view), got {tuple(k_cache.shape)}"
        )
    if k_cache.element_size() != 1:
        raise ValueError(f"MODEL1 k_cache must be a 1-byte dtype, got {k_cache.dtype}")
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    page_bytes = k_cache.stride(0)
    if page_bytes < page_size * BYTES_PER_TOKEN or page_bytes % 2:
        raise ValueError(
            f"MODEL1 page stride {page_bytes} B is too small or odd for page_size {page_size} "
            f"(need >= {page_size * BYTES_PER_TOKEN}, padded to a multiple of 576)"
        )
    return num_pages, page_size, page_bytes


def flat_bytes(cache: torch.Tensor, page_bytes: int) -> torch.Tensor:
    """The whole page buffer behind a cache view as a flat uint8 tensor."""
    u8 = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    return u8.as_strided((cache.shape[0] * page_bytes,), (1,))


def dequantize_model1(k_cache: torch.Tensor) -> torch.Tensor:
    """Decode a MODEL1 cache to float32 ``[num_pages * page_size, 512]`` indexed by slot."""
    num_pages, page_size, page_bytes = model1_geometry(k_cache)
    flat = flat_bytes(k_cache, page_bytes).view(num_pages, page_bytes)
    data = flat[:, : page_size * DATA_BYTES].reshape(num_pages, page_size, DATA_BYTES)
    sc = flat[:, page_size * DATA_BYTES : page_size * (DATA_BYTES + SCALE_BYTES)]
    sc = sc.reshape(num_pages, page_size, SCALE_BYTES)[..., :NUM_SCALES]
    nope = data[..., :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scale = torch.pow(2.0, sc.float() - 127.0)
    nope = (nope.view(num_pages, page_size, NUM_SCALES, QUANT_BLOCK) * scale.unsqueeze(-1))
    rope = data[..., NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    out = torch.cat([nope.reshape(num_pages, page_size, NOPE_DIM), rope], dim=-1)
    return out.reshape(num_pages * page_size, HEAD_DIM)


def quantize_index_keys(keys: torch.Tensor) -> torch.Tensor:
    """Pack float index keys ``[num_pages, page_size, 128]`` into the DeepGEMM paged layout.

    One FP32 scale per token (``amax / 448``), returned as ``[num_pages, page_size, 1, 132]``
    uint8 over a contiguous ``[num_pages, page_size * 132]`` buffer.
    """
    if keys.dim() != 3 or keys.shape[-1] != INDEX_DIM:
        raise ValueError(f"want [num_pages, page_size, 128], got {tuple(keys.shape)}")
    num_pages, page_size, _ = keys.shape
    x = keys.float()
    scale = x.abs().amax(dim=-1).clamp_min(1e-4) / FP8_MAX  # [P, ps]
    q8 = (x / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    buf = torch.zeros(num_pages, page_size * INDEX_BYTES_PER_TOKEN, dtype=torch.uint8,
                      device=keys.device)
    buf[:, : page_size * INDEX_DIM] = q8.view(torch.uint8).reshape(num_pages, -1)
    buf[:, page_size * INDEX_DIM :] = scale.contiguous().view(torch.uint8).reshape(num_pages, -1)
    return buf.view(num_pages, page_size, 1, INDEX_BYTES_PER_TOKEN)


def index_geometry(index_cache: torch.Tensor) -> tuple[int, int, int]:
    """(num_pages, page_size, page_bytes) of an indexer key cache, validated."""
    if (
        index_cache.dim() != 4
        or index_cache.shape[2] != 1
        or index_cache.shape[3] != INDEX_BYTES_PER_TOKEN
        or index_cache.element_size() != 1
    ):
        raise ValueError(
            "index cache must be a 1-byte [num_pages, page_size, 1, 132] tensor, got "
            f"{index_cache.dtype} {tuple(index_cache.shape)}"
        )
    page_size = index_cache.shape[1]
    page_bytes = index_cache.stride(0)
    if page_bytes < page_size * INDEX_BYTES_PER_TOKEN or page_bytes % 4:
        raise ValueError(f"index cache page stride {page_bytes} B invalid for page {page_size}")
    return index_cache.shape[0], page_size, page_bytes


def dequantize_index_keys(index_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 values as float32 ``[slots, 128]``, fp32 scales ``[slots]``), indexed by slot."""
    num_pages, page_size, page_bytes = index_geometry(index_cache)
    flat = flat_bytes(index_cache, page_bytes).view(num_pages, page_bytes)
    vals = flat[:, : page_size * INDEX_DIM].contiguous().view(torch.float8_e4m3fn).float()
    sc = flat[:, page_size * INDEX_DIM : page_size * INDEX_BYTES_PER_TOKEN].contiguous()
    return vals.reshape(-1, INDEX_DIM), sc.view(torch.float32).reshape(-1)
