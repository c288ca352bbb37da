"""The decode experiments (``staged``, ``gp``) against the float32 reference, run through the
shipped launcher via ``register_variant``."""

from __future__ import annotations

import dsv4_experimental.decode  # noqa: F401  (registers staged and gp)
import pytest
import torch

from dsv4_kernels.cases import compare_decode, make_decode_case
from dsv4_kernels.reference import ref_sparse_decode
from dsv4_kernels.sparse_decode import DecodeConfig, choose_variant, sparse_mla_decode


@pytest.mark.parametrize("variant", ["staged", "gp"])
@pytest.mark.parametrize("nsplit", [1, 3])
def test_experiment_matches_reference(gen: torch.Generator, variant: str, nsplit: int) -> None:
    case = make_decode_case(gen, batch=2, heads=16, topk=24, extra_topk=40, page_size=7,
                            extra_page_size=5, lengths="random", invalid_frac=0.2)
    cfg = DecodeConfig(block_h=16, block_t=16, num_warps=4, num_stages=1, nsplit=nsplit,
                       variant=variant)
    res = compare_decode(*sparse_mla_decode(**case.kwargs(), config=cfg),
                         *ref_sparse_decode(**case.kwargs()))
    assert res["ok"], res


@pytest.mark.parametrize(("block_t", "stage_block"), [(32, 8), (16, 16)])
def test_staged_tiles_and_staging_blocks(gen: torch.Generator, block_t: int,
                                         stage_block: int) -> None:
    case = make_decode_case(gen, batch=2, heads=16, topk=40, extra_topk=24, page_size=7,
                            extra_page_size=3, lengths="random", invalid_frac=0.25)
    cfg = DecodeConfig(block_h=16, block_t=block_t, num_warps=4, num_stages=2, nsplit=2,
                       variant="staged", stage_block=stage_block)
    res = compare_decode(*sparse_mla_decode(**case.kwargs(), config=cfg),
                         *ref_sparse_decode(**case.kwargs()))
    assert res["ok"], res


def test_registered_variants_are_never_dispatched() -> None:
    for mem, arch in ((101376, 120), (167936, 80), (232448, 90), (232448, None)):
        for rows in (1, 8, 64):
            assert choose_variant(rows, 1, 132, mem, arch)[0] not in ("staged", "gp")
