"""``pg`` (the pipelined gather): correct against the float32 reference under the interpreter,
and, compiled for sm_120 on the CPU, its gathered tile multi-buffered with a partial wait."""

from __future__ import annotations

import dsv4_experimental.pg  # noqa: F401  (registers pg)
import pytest
import torch
from triton_compile import compile_kernel

from dsv4_kernels.cases import compare_decode, make_decode_case, make_prefill_case
from dsv4_kernels.reference import ref_sparse_decode
from dsv4_kernels.sparse_decode import DecodeConfig, sparse_mla_decode

SPECS = [
    (dict(batch=2, heads=16, topk=24, extra_topk=40, page_size=7, extra_page_size=5), 1),
    (dict(batch=2, heads=20, topk=24, extra_topk=40, page_size=7, extra_page_size=5), 4),
    (dict(batch=3, heads=16, topk=20, extra_topk=0, page_size=61, lengths="random",
          invalid_frac=0.3), 3),
    (dict(batch=2, heads=16, topk=16, extra_topk=16, lengths="zero"), 3),
]


@pytest.mark.parametrize(("spec", "nsplit"), SPECS)
def test_pg_matches_reference(gen: torch.Generator, spec: dict, nsplit: int) -> None:
    c = make_decode_case(gen, **spec)
    cfg = DecodeConfig(variant="pg", block_h=16, block_t=16, num_warps=4, nsplit=nsplit)
    res = compare_decode(*sparse_mla_decode(**c.kwargs(), config=cfg),
                         *ref_sparse_decode(**c.kwargs()))
    assert res["ok"], res


def test_pg_on_a_prefill_chunk(gen: torch.Generator) -> None:
    c = make_prefill_case(gen, rows=6, heads=16, swa=16, topk=32, context=96, page_size=16,
                          extra_page_size=8)
    cfg = DecodeConfig(variant="pg", block_h=16, block_t=16, num_warps=4, nsplit=2)
    res = compare_decode(*sparse_mla_decode(**c.kwargs(), config=cfg),
                         *ref_sparse_decode(**c.kwargs()))
    assert res["ok"], res


@pytest.mark.parametrize(("stages", "buffers", "wait"), [(3, 2, 2), (4, 3, 4)])
def test_pg_gather_is_multi_buffered_on_sm120(stages: int, buffers: int, wait: int) -> None:
    consts = dict(A_HAS_LEN=True, HAS_B=True, B_HAS_LEN=True, HAS_SINK=True, NSPLIT=4, BH=16,
                  BT=32, DOT_F32=False, STAGES=stages, SCALED=True)
    got = compile_kernel("dsv4_experimental.pg", "_sparse_decode_pg_kernel", consts, 120, 8, 3)
    assert got["buffers"] == [f"{buffers}x32x64xbf16", f"{buffers}x32x8x64xi8"], got
    assert got["async_waits"] == [0, wait], got
    assert not (got["spill_stores"] or got["stack"]) and got["shared"] <= 101376, got
