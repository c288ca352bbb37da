"""Sparse-MLA decode kernel against the float32 reference, under the Triton interpreter.

Covers the issue's edge cases: invalid (-1) indices, valid length 0, page sizes that are not
powers of two, the sink on and off, one split and many, head counts that are not a multiple of
the head block, and SWA-only as well as SWA + extra key lists.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4_kernels.cases import DecodeCase, compare_decode, make_decode_case
from dsv4_kernels.layout import dequantize_model1, model1_geometry, quantize_model1
from dsv4_kernels.reference import ref_sparse_decode
from dsv4_kernels.sparse_decode import DecodeConfig, choose_nsplit, sparse_mla_decode

SMALL = DecodeConfig(block_h=16, block_t=16, variant="full")


def _run(case, nsplit: int, variant: str, prefetch: bool = True) -> dict[str, object]:
    cfg = DecodeConfig(block_h=16, block_t=16, num_warps=4, num_stages=1, nsplit=nsplit,
                       variant=variant, prefetch=prefetch)
    out = sparse_mla_decode(**case.kwargs(), config=cfg)
    ref = ref_sparse_decode(**case.kwargs())
    return compare_decode(*out, *ref)


@pytest.mark.parametrize(
    ("spec", "nsplit"),
    [
        (dict(batch=2, heads=16, topk=24, extra_topk=40, page_size=7, extra_page_size=5), 1),
        (dict(batch=2, heads=16, topk=24, extra_topk=40, page_size=7, extra_page_size=5), 4),
        (dict(batch=3, heads=20, topk=20, extra_topk=0, page_size=61, lengths="random",
              invalid_frac=0.3), 3),
        (dict(batch=2, heads=16, topk=16, extra_topk=33, page_size=2, extra_page_size=3,
              sink=False, lengths="random", invalid_frac=0.2), 2),
        (dict(batch=2, heads=16, topk=16, extra_topk=16, lengths="zero"), 1),
        (dict(batch=2, heads=16, topk=16, extra_topk=16, lengths="zero"), 3),
    ],
)
@pytest.mark.parametrize(("variant", "prefetch"), [("full", True), ("dsplit", True), ("pf", True),
                                                   ("pf", False), ("local", True)])
def test_decode_matches_reference(gen: torch.Generator, spec: dict, nsplit: int,
                                  variant: str, prefetch: bool) -> None:
    res = _run(make_decode_case(gen, **spec), nsplit, variant, prefetch)
    assert res["ok"], res


@pytest.mark.parametrize(("block_t", "stage_block", "stage_round", "nsplit"),
                         [(16, 16, 1, 2), (16, 8, 2, 3), (32, 16, 3, 1), (16, 16, 8, 1)])
def test_local_rounds_and_staging_blocks(gen: torch.Generator, block_t: int, stage_block: int,
                                         stage_round: int, nsplit: int) -> None:
    """One round per tile, several rounds per split, a round longer than the split (the slot is
    then cut to the split), staging blocks below the tile; lists not a tile multiple."""
    case = make_decode_case(gen, batch=2, heads=16, topk=40, extra_topk=24, page_size=7,
                            extra_page_size=3, lengths="random", invalid_frac=0.25)
    cfg = DecodeConfig(block_h=16, block_t=block_t, num_warps=4, num_stages=2, nsplit=nsplit,
                       variant="local", stage_block=stage_block, stage_round=stage_round)
    res = compare_decode(*sparse_mla_decode(**case.kwargs(), config=cfg),
                         *ref_sparse_decode(**case.kwargs()))
    assert res["ok"], res


def test_local_rejects_an_empty_round(gen: torch.Generator) -> None:
    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=16)
    with pytest.raises(ValueError, match="stage_round"):
        sparse_mla_decode(**case.kwargs(), config=DecodeConfig(
            block_h=16, block_t=16, variant="local", stage_round=0))


def test_local_rejects_a_staging_block_that_does_not_divide_the_tile(
        gen: torch.Generator) -> None:
    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=16)
    with pytest.raises(ValueError, match="stage_block"):
        sparse_mla_decode(**case.kwargs(), config=DecodeConfig(
            block_h=16, block_t=16, variant="local", stage_block=32))


def test_unknown_variant_is_a_clear_error(gen: torch.Generator) -> None:
    from dsv4_kernels.sparse_decode import _VARIANT_TILES

    # the experiments are not shipped (kernels/experimental registers them when imported)
    assert not {"staged", "gp"} & set(_VARIANT_TILES)
    case = make_decode_case(gen, batch=1, heads=16, topk=16)
    with pytest.raises(ValueError, match=r"variant must be one of .*got 'no-such'"):
        sparse_mla_decode(**case.kwargs(), config=DecodeConfig(variant="no-such"))


def test_all_indices_invalid_gives_zero_and_inf(gen: torch.Generator) -> None:
    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=16, page_size=5)
    case.indices.fill_(-1)
    assert case.extra_indices is not None
    case.extra_indices.fill_(-1)
    out, lse = sparse_mla_decode(**case.kwargs(), config=SMALL)
    assert torch.all(out == 0)
    assert torch.all(torch.isposinf(lse))


def test_sink_scales_output_and_lse_excludes_it(gen: torch.Generator) -> None:
    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=0, page_size=8)
    with_sink = sparse_mla_decode(**case.kwargs(), config=SMALL)
    kw = case.kwargs()
    kw["attn_sink"] = None
    no_sink = sparse_mla_decode(**kw, config=SMALL)
    assert torch.equal(with_sink[1], no_sink[1])  # LSE is sink-exclusive
    assert case.attn_sink is not None
    factor = 1 / (1 + torch.exp(case.attn_sink.view(1, 1, -1, 1) - no_sink[1].permute(0, 2, 1)
                                .unsqueeze(-1)))
    want = no_sink[0].float() * factor
    assert torch.allclose(with_sink[0].float(), want, atol=1e-2, rtol=2 / 128)


def test_lengths_beyond_topk_are_clamped(gen: torch.Generator) -> None:
    case = make_decode_case(gen, batch=2, heads=16, topk=16, extra_topk=0, page_size=4)
    assert case.topk_length is not None
    case.topk_length.fill_(10_000)
    res = compare_decode(*sparse_mla_decode(**case.kwargs(), config=SMALL),
                         *ref_sparse_decode(**{**case.kwargs(), "topk_length": None}))
    assert res["ok"], res


def test_choose_nsplit_bounds() -> None:
    assert choose_nsplit(rows=1, head_blocks=1, max_tiles=20, sms=132) == 16
    assert choose_nsplit(rows=1, head_blocks=1, max_tiles=5, sms=132) == 5
    assert choose_nsplit(rows=128, head_blocks=1, max_tiles=20, sms=132) == 1
    assert 1 <= choose_nsplit(rows=64, head_blocks=1, max_tiles=20, sms=132) <= 2


def test_bad_inputs_raise_clear_errors(gen: torch.Generator) -> None:
    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=0)
    kw = case.kwargs()
    with pytest.raises(ValueError, match="int32"):
        sparse_mla_decode(**{**kw, "indices": case.indices.long()})
    with pytest.raises(ValueError, match="q must be"):
        sparse_mla_decode(**{**kw, "q": case.q[..., :256]})
    with pytest.raises(ValueError, match="584"):
        sparse_mla_decode(**{**kw, "k_cache": torch.zeros(2, 4, 1, 576, dtype=torch.uint8)})


def test_unknown_variant_is_rejected(gen: torch.Generator) -> None:
    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=0)
    with pytest.raises(ValueError, match="variant"):
        sparse_mla_decode(**case.kwargs(), config=DecodeConfig(variant="fast"))


def test_variant_choice_follows_grid_and_shared_memory() -> None:
    from dsv4_kernels.sparse_decode import available_variants, choose_variant, dispatch_variants

    h200, sm120 = 232448, 101376
    # 200 KB and more (sm_90, sm_100, any arch): dsplit for a handful of programs, local beyond;
    # the sm_90 Gluon kernels are experiments (kernels/experimental) the dispatch never picks
    for arch in (None, 90, 100):
        assert not {"wg", "ws"} & set(available_variants(h200, arch))
        assert choose_variant(64, 1, 132, h200, arch) == ("local", None)
        assert choose_variant(8, 1, 132, h200, arch) == ("local", None)
        assert choose_variant(64, 1, 132, h200, arch, pow2_pages=False) == ("local", None)
        assert choose_variant(1, 1, 132, h200, arch) == ("dsplit", 64)
        assert choose_variant(4, 1, 132, h200, arch) == ("dsplit", 64)
    # 99 KB parts never get the 128-192 KB "full" tiles, whatever the batch
    for rows in (1, 8, 64, 128):
        assert choose_variant(rows, 1, 188, sm120, 120)[0] in dispatch_variants(sm120, 120)
    # sm_120: pf at 16 heads a program for a handful of programs, local at BT 32 beyond
    assert choose_variant(1, 4, 188, sm120, 120, heads=64) == ("pf", None)
    assert choose_variant(2, 8, 188, sm120, 120, heads=64) == ("pf", None)
    assert choose_variant(3, 2, 188, sm120, 120, heads=64) == ("local", 32)
    assert choose_variant(64, 2, 188, sm120, 120, heads=64) == ("local", 32)
    assert "full" not in available_variants(sm120)
    assert "local" not in available_variants(sm120)  # 196 KB at its default BT 64
    a100 = 167936  # 164 KB: full fits, local's default tiles do not
    assert choose_variant(64, 1, 108, a100) == ("full", None)
    assert "local" not in available_variants(a100)
    # what the self-test runs and the compile gate compiles: every pick, nothing else
    assert dispatch_variants(sm120, 120) == ("pf", "local")
    assert dispatch_variants(a100, 80) == ("dsplit", "full")
    assert dispatch_variants(h200, None) == dispatch_variants(h200, 90) == ("dsplit", "local")


@pytest.mark.parametrize("variant", ["full", "dsplit", "pf", "local"])
def test_split_partials_keep_nearly_cancelling_splits_exact(gen: torch.Generator,
                                                            variant: str) -> None:
    """Each row: two large keys in the SWA list and their negatives in the extra list, one list
    per split. The splits' outputs nearly cancel in the combine, so a bf16 rounding of each
    partial (the old default of pf, staged and local) lands outside the reference tolerance for
    most rows; the default partials must not."""
    rows, ps = 8, 16
    keys = torch.randn(rows, 2, 512, generator=gen) * 4
    kv_a = torch.zeros(rows, ps, 512)
    kv_a[:, :2] = keys
    idx = torch.full((rows, 1, ps), -1, dtype=torch.int32)
    idx[:, 0, 0] = torch.arange(rows, dtype=torch.int32) * ps
    idx[:, 0, 1] = idx[:, 0, 0] + 1
    q = (torch.randn(rows, 1, 16, 512, generator=gen) * 2).to(torch.bfloat16)
    case = DecodeCase(q, quantize_model1(kv_a), idx, None, 512 ** -0.5, None,
                      quantize_model1(-kv_a), idx.clone(), None)
    cfg = DecodeConfig(block_h=16, block_t=16, num_warps=4, nsplit=2, variant=variant)
    res = compare_decode(*sparse_mla_decode(**case.kwargs(), config=cfg),
                         *ref_sparse_decode(**case.kwargs()))
    assert res["ok"], res


@pytest.mark.parametrize(("variant", "partials"), [("full", "bf16"), ("pf", "fp32"),
                                                   ("local", "fp16"), ("dsplit", "bf16")])
def test_partial_format_is_a_free_choice(gen: torch.Generator, variant: str,
                                         partials: str) -> None:
    case = make_decode_case(gen, batch=2, heads=16, topk=24, extra_topk=40, page_size=7,
                            extra_page_size=5)
    cfg = DecodeConfig(block_h=16, block_t=16, num_warps=4, num_stages=1, nsplit=3,
                       variant=variant, partials=partials)
    res = compare_decode(*sparse_mla_decode(**case.kwargs(), config=cfg),
                         *ref_sparse_decode(**case.kwargs()))
    assert res["ok"], res


@pytest.mark.parametrize("variant", ["full", "pf", "local"])
@pytest.mark.parametrize("magnitude", [1e6, 1e-6])
def test_fp16_partials_keep_their_precision_at_any_magnitude(gen: torch.Generator, variant: str,
                                                            magnitude: float) -> None:
    """Default partials are fp16 with a per-head power-of-two scale: values far above fp16's
    65504 must not overflow and values far below its normal range must keep their digits."""
    case = make_decode_case(gen, batch=2, heads=16, topk=24, extra_topk=40, page_size=7,
                            extra_page_size=5, sink=False)
    def scaled(cache: torch.Tensor) -> torch.Tensor:
        pages, ps, _ = model1_geometry(cache)
        return quantize_model1(dequantize_model1(cache).view(pages, ps, 512) * magnitude)

    # keys x magnitude and queries / magnitude: the same logits, outputs x magnitude
    assert case.extra_k_cache is not None
    case = dataclasses.replace(case, q=(case.q.float() / magnitude).to(torch.bfloat16),
                               k_cache=scaled(case.k_cache),
                               extra_k_cache=scaled(case.extra_k_cache))
    cfg = DecodeConfig(block_h=16, block_t=16, num_warps=4, num_stages=2, nsplit=3,
                       variant=variant)
    out, lse = sparse_mla_decode(**case.kwargs(), config=cfg)
    ref_out, ref_lse = ref_sparse_decode(**case.kwargs())
    assert torch.isfinite(out.float()).all()
    rel = float((out.float() - ref_out).norm() / ref_out.norm())
    assert rel < 1e-2, rel
    assert float((lse - ref_lse).abs().max()) < 1e-3


@pytest.mark.parametrize(("variant", "partials", "match"),
                         [("dsplit", "fp16", "per-head scale"),
                          ("local", "fp64", "partials must be one of")])
def test_unsupported_partial_formats_are_refused(gen: torch.Generator, variant: str,
                                                 partials: str, match: str) -> None:
    case = make_decode_case(gen, batch=1, heads=16, topk=16)
    cfg = DecodeConfig(block_h=16, block_t=16, nsplit=2, variant=variant, partials=partials)
    with pytest.raises(ValueError, match=match):
        sparse_mla_decode(**case.kwargs(), config=cfg)


@pytest.mark.parametrize("block_h", [8, 16])
def test_combine_at_both_head_blocks(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch,
                                     block_h: int) -> None:
    """The combine merges the same partials at 8 and 16 heads per program (small grids take 8,
    so under the interpreter 16 runs only when forced), with a head count that is a multiple
    of neither and rows without any valid key."""
    from dsv4_kernels import sparse_decode as sd

    monkeypatch.setattr(sd, "combine_block_h", lambda rows, h: block_h)
    case = make_decode_case(gen, batch=3, heads=20, topk=24, extra_topk=40, page_size=7,
                            extra_page_size=5, lengths="random", invalid_frac=0.2)
    res = _run(case, 3, "local")
    assert res["ok"], res


def test_combine_block_h_follows_the_grid() -> None:
    from dsv4_kernels.sparse_decode import combine_block_h

    assert combine_block_h(1, 64) == 8
    assert combine_block_h(8, 64) == 8
    assert combine_block_h(32, 64) == 8  # 1024 programs
    assert combine_block_h(64, 64) == 16
    assert combine_block_h(128, 16) == 8


def test_heads_per_program_on_sm120() -> None:
    """sm_120 (99 KB): at most 32 heads a program (64 spills there, the sm_120 compile gate),
    16 where the grid would hold at most four programs; 64 on larger parts; a request wins."""
    from dsv4_kernels.sparse_decode import pf_block_h

    sm120, h200 = 101376, 232448
    assert pf_block_h(64, sm120, rows=64) == 32
    assert pf_block_h(64, sm120, rows=8) == 32
    assert pf_block_h(64, sm120, rows=3) == 32  # 6 programs of 32 heads
    assert pf_block_h(64, sm120, rows=2) == 16  # 4 programs of 32: few, so 16
    assert pf_block_h(64, sm120, rows=1) == 16
    assert pf_block_h(8, sm120, rows=64) == 16  # at least the MMA's M
    assert pf_block_h(64, h200, rows=1) == 64
    assert pf_block_h(64, sm120, want=64, rows=64) == 64


@pytest.mark.parametrize("nsplit", [1, 3])
def test_sm120_dispatch_configs_match_reference(gen: torch.Generator, nsplit: int) -> None:
    """What the sm_120 dispatch runs (pf at 16 heads a program, local at 32 heads / BT 32), as
    the self-test runs it there, against the reference; 32 heads so local takes its BH 32."""
    from dsv4_kernels.sparse_decode import dispatch_configs

    case = make_decode_case(gen, batch=2, heads=32, topk=40, extra_topk=70, page_size=7,
                            extra_page_size=5, lengths="random", invalid_frac=0.2)
    for cfg in dispatch_configs(101376, 120):
        res = compare_decode(*sparse_mla_decode(**case.kwargs(),
                                                config=dataclasses.replace(cfg, nsplit=nsplit)),
                             *ref_sparse_decode(**case.kwargs()))
        assert res["ok"], (cfg, res)


@pytest.mark.parametrize("device", ["h200", "sm120"])
def test_selftest_runs_the_tiles_the_dispatch_launches(monkeypatch: pytest.MonkeyPatch,
                                                       device: str) -> None:
    """The (variant, heads a program, block_t, stages, warps) the automatic dispatch launches on
    a device, over batch 1-64 and 16/64/128 heads, are those the self-test launches there with
    ``dispatch_configs`` (dsplit at the dispatch's BT 64, not its table default). Recorded at
    the launcher, after every default and fallback; the Gluon kernels refuse CPU tensors, so on
    the H200 the Triton variants (dsplit and the local fallback) are compared."""
    import dataclasses

    from dsv4_kernels import selftest
    from dsv4_kernels import sparse_decode as sd
    from dsv4_kernels.cases import make_decode_case

    shared, arch, sms = {"h200": (232448, 90, 132), "sm120": (101376, 120, 188)}[device]
    monkeypatch.setattr(sd, "device_max_shared", lambda t: shared)
    monkeypatch.setattr(sd, "device_arch", lambda t: arch)
    monkeypatch.setattr(sd, "device_sms", lambda t: sms)
    seen: list[tuple[object, ...]] = []
    monkeypatch.setattr(sd._Launch, "rows", lambda self, *a: seen.append(
        (self.variant, self.block_h, self.block_t, self.num_stages, self.num_warps)))
    g = torch.Generator().manual_seed(0)
    for heads in (16, 64, 128):
        for batch in (1, 2, 3, 4, 8, 16, 64):
            c = make_decode_case(g, batch=batch, heads=heads, topk=128, extra_topk=512,
                                 page_size=256, extra_page_size=64)
            sd.sparse_mla_decode(**c.kwargs())
    dispatched, seen[:] = set(seen), []
    for spec in selftest.DECODE_CASES:
        for pick in sd.dispatch_configs(shared, arch):
            if pick.variant in ("wg", "ws"):
                continue
            c = make_decode_case(g, **spec)
            sd.sparse_mla_decode(**c.kwargs(), config=dataclasses.replace(pick, nsplit=5))
    tested = set(seen)
    assert dispatched <= tested, f"dispatched but not self-tested: {dispatched - tested}"
    # and nothing the dispatch never launches (dsplit at its table default BT 32, say)
    assert tested <= dispatched, f"self-tested but never dispatched: {tested - dispatched}"
    if device == "h200":
        assert ("dsplit", 64, 64) in {t[:3] for t in dispatched}


@pytest.mark.parametrize(("variant", "nsplit"), [("pf", 1), ("pf", 3), ("local", 1), ("local", 3)])
def test_real_heads_only(gen: torch.Generator, variant: str, nsplit: int) -> None:
    """A query padded past its real heads (SGLang's padding holds garbage: NaN here): only the
    real heads are computed, equal to the reference on them; the padded heads come back as
    heads without keys (output 0, LSE +inf)."""
    c = make_decode_case(gen, batch=3, heads=32, topk=24, extra_topk=40, page_size=7,
                         extra_page_size=5, lengths="random", invalid_frac=0.1)
    real = 8
    q = c.q.clone()
    q[:, :, real:] = float("nan")
    kw = dict(c.kwargs(), q=q)
    cfg = DecodeConfig(block_h=16, block_t=16, num_warps=4, nsplit=nsplit, variant=variant)
    out, lse = sparse_mla_decode(**kw, config=cfg, real_heads=real)
    ref = ref_sparse_decode(**dict(kw, q=q[:, :, :real], attn_sink=c.attn_sink[:real]))
    assert compare_decode(out[:, :, :real], lse[:, :real], *ref)["ok"]
    assert torch.equal(out[:, :, real:], torch.zeros_like(out[:, :, real:]))
    assert bool(torch.isposinf(lse[:, real:]).all())


def test_real_heads_out_of_range_is_a_clear_error(gen: torch.Generator) -> None:
    c = make_decode_case(gen, batch=1, heads=16, topk=16)
    for bad in (0, 17):
        with pytest.raises(ValueError, match="real_heads must be in"):
            sparse_mla_decode(**c.kwargs(), real_heads=bad)


def test_sm120_splits_fill_two_waves_for_few_programs() -> None:
    """sm_120's dispatch: 8 heads at B=64 (one head block a row) on 132 SMs takes 4 splits (two
    waves, at least 4 tiles each), the H200-proxy best; grids that fill half the SMs keep the
    one-wave rule."""
    assert choose_nsplit(64, 1, 20, 132, small_smem=True) == 4
    assert choose_nsplit(64, 1, 20, 132) == 2
    assert choose_nsplit(64, 1, 6, 132, small_smem=True) == 2  # too few tiles to cut further
    assert choose_nsplit(64, 2, 20, 132, small_smem=True) == 1
    assert choose_nsplit(8, 2, 20, 132, small_smem=True) == 8
