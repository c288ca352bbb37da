"""CPU checks of the Gluon ``wg`` decode kernel (wg_decode.py).

The Triton interpreter cannot run Gluon, so its numerics are checked on the GPU (selftest and
bench, every variant against the fp32 reference). What CI can check without a GPU: that the
kernel still compiles for sm_90 with the installed Triton (Gluon is experimental and its API
moves between releases), that it fits the shared memory the dispatcher budgets for it, and that
the compiled products have the shapes the design rests on: ``Q K^T`` split between the two
warpgroups (wgmma m64n32: each scores half of a 64-key tile; Triton's own ``tl.dot`` gives both
warpgroups the whole product) and ``P V`` as m64n256 (each warpgroup owns 256 output columns).
The compile runs in a subprocess because this suite sets ``TRITON_INTERPRET=1``, under which
Gluon code cannot be compiled.
"""

from __future__ import annotations

import dsv4_experimental.wg_decode  # noqa: F401  (registers wg)
import pytest
import torch


def _compile(nsplit: int, scaled: bool, pipe: bool) -> dict:
    from gluon_compile import compile_sm90

    return compile_sm90("dsv4_experimental.wg_decode", "_sparse_decode_wg_kernel", dict(
        A_HAS_LEN=True, HAS_B=True, B_HAS_LEN=True, HAS_SINK=True, NSPLIT=nsplit,
        SCALED=scaled, BT=64, STAGES=2, PIPE=pipe))


@pytest.mark.parametrize(("nsplit", "scaled", "pipe"),
                         [(2, True, True), (1, False, True), (2, True, False)])
def test_wg_compiles_for_sm90_with_split_products(nsplit: int, scaled: bool, pipe: bool,
                                                  ) -> None:
    from dsv4_experimental.wg_decode import WG_SMEM

    out = _compile(nsplit, scaled, pipe)
    assert out["shared"] <= WG_SMEM, out
    # Q K^T: 512 / 16 = 32 k-steps of m64n32 per warpgroup (half of the 64 keys each);
    # P V: 64 / 16 = 4 k-steps of m64n256 (half of the 512 columns each); nothing else, with
    # the sequential schedule or the pipelined one.
    assert out["wgmma"] == {"m64n32k16": 32, "m64n256k16": 4}, out


def test_wg_is_refused_where_it_cannot_run(gen: torch.Generator) -> None:
    from dsv4_kernels.cases import make_decode_case
    from dsv4_kernels.sparse_decode import DecodeConfig, sparse_mla_decode

    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=0)
    with pytest.raises(ValueError, match="interpreter"):
        sparse_mla_decode(**case.kwargs(), config=DecodeConfig(variant="wg"))


def test_wg_refuses_tiles_that_do_not_fit(gen: torch.Generator) -> None:
    from dsv4_kernels.cases import make_decode_case
    from dsv4_kernels.sparse_decode import DecodeConfig, sparse_mla_decode

    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=0)
    for bad in (dict(block_t=64, num_stages=3), dict(block_t=16, num_stages=2),
                dict(num_warps=4)):
        with pytest.raises(ValueError, match="227 KB"):
            sparse_mla_decode(**case.kwargs(), config=DecodeConfig(variant="wg", **bad))


def _odd_stride(cache: torch.Tensor) -> torch.Tensor:
    """The same MODEL1 pages with a page stride 2 bytes longer (not a multiple of 16)."""
    from dsv4_kernels.layout import flat_bytes, model1_geometry

    pages, ps, pb = model1_geometry(cache)
    buf = torch.zeros(pages, pb + 2, dtype=torch.uint8)
    buf[:, :pb] = flat_bytes(cache, pb).view(pages, pb)
    return buf.as_strided((pages, ps, 1, 584), (pb + 2, 584, 584, 1))


def test_wg_refuses_page_bytes_it_cannot_copy(gen: torch.Generator) -> None:
    """A cache whose page stride is not a multiple of 16 bytes (allowed by the layout, though
    SGLang pads pages to multiples of 576) would split wg's 16-byte copies: it says so."""
    from dsv4_kernels.cases import make_decode_case
    from dsv4_kernels.sparse_decode import DecodeConfig, sparse_mla_decode

    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=0)
    kw = {**case.kwargs(), "k_cache": _odd_stride(case.k_cache)}
    with pytest.raises(ValueError, match="16-byte pieces, so page bytes"):
        sparse_mla_decode(**kw, config=DecodeConfig(variant="wg"))
