"""MODEL1 and indexer-key cache layouts: byte positions, padding and round trips."""

from __future__ import annotations

import pytest
import torch

from dsv4_kernels.layout import (
    BYTES_PER_TOKEN,
    dequantize_index_keys,
    dequantize_model1,
    model1_cache_view,
    model1_geometry,
    model1_page_bytes,
    quantize_index_keys,
    quantize_model1,
)


@pytest.mark.parametrize("page_size", [1, 2, 61, 64, 256])
def test_page_bytes_padded_to_576(page_size: int) -> None:
    pb = model1_page_bytes(page_size)
    assert pb % 576 == 0
    assert page_size * BYTES_PER_TOKEN <= pb < page_size * BYTES_PER_TOKEN + 576


@pytest.mark.parametrize("page_size", [3, 64])
def test_model1_round_trip_and_byte_positions(gen: torch.Generator, page_size: int) -> None:
    kv = torch.randn(5, page_size, 512, generator=gen) * 3
    cache = quantize_model1(kv)
    assert cache.shape == (5, page_size, 1, 584) and cache.dtype == torch.uint8
    _, ps, pb = model1_geometry(cache)
    assert pb == model1_page_bytes(page_size)
    deq = dequantize_model1(cache).view(5, page_size, 512)
    # rope is stored as bf16: exact up to bf16 rounding; nope within e4m3 precision (3 bits)
    assert torch.allclose(deq[..., 448:], kv[..., 448:].bfloat16().float())
    err = (deq[..., :448] - kv[..., :448]).abs() / kv[..., :448].abs().clamp_min(0.05)
    assert float(err.median()) < 0.07
    flat = cache.as_strided((5 * pb,), (1,))
    # token (page 2, slot 1): its scale bytes sit after the page's data block, one per 64 values
    scales = flat[2 * pb + ps * 576 + 8: 2 * pb + ps * 576 + 16]
    amax = kv[2, 1, :448].view(7, 64).abs().amax(-1)
    want = torch.ceil(torch.log2(amax / 448)).to(torch.int64) + 127
    assert torch.equal(scales[:7].long(), want)
    assert int(scales[7]) == 0


def test_cache_view_rejects_wrong_row_size() -> None:
    with pytest.raises(ValueError, match="contiguous bytes"):
        model1_cache_view(torch.zeros(2, 1000, dtype=torch.uint8), 2)


def test_geometry_rejects_bad_shape() -> None:
    with pytest.raises(ValueError, match="584"):
        model1_geometry(torch.zeros(2, 4, 1, 576, dtype=torch.uint8))


def test_index_keys_round_trip(gen: torch.Generator) -> None:
    keys = torch.randn(3, 5, 128, generator=gen)
    cache = quantize_index_keys(keys)
    vals, sc = dequantize_index_keys(cache)
    back = vals * sc.unsqueeze(-1)
    rel = (back - keys.reshape(-1, 128)).norm() / keys.norm()
    assert float(rel) < 0.06
    assert cache.shape == (3, 5, 1, 132)
