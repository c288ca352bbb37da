"""CPU checks of the warp-specialized Gluon ``ws`` decode kernel (ws_decode.py).

As for ``wg`` (test_kernels_wg.py), the interpreter cannot run Gluon: the numerics are checked
on the GPU (selftest and bench, every variant against the fp32 reference). What CI checks
here: that the kernel compiles for sm_90 with the installed Triton, in the shapes the design
rests on (a producer warpgroup whose registers are cut to 128 by ``setmaxnreg``; ``Q K^T`` and
``P V`` split between the two consumer warpgroups as in ``wg``; both page-size paths), within
the shared memory the dispatcher budgets for it; and that it refuses, with a reason, what it
cannot run. The compile runs in a subprocess, outside this suite's ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from collections.abc import Callable

import dsv4_experimental.ws_decode  # noqa: F401  (registers ws)
import pytest
import torch


def _compile(nsplit: int, scaled: bool, log2: int, pair: bool = False) -> dict:
    from gluon_compile import compile_sm90

    return compile_sm90("dsv4_experimental.ws_decode", "_sparse_decode_ws_kernel", dict(
        A_HAS_LEN=True, HAS_B=True, B_HAS_LEN=True, HAS_SINK=True, NSPLIT=nsplit,
        SCALED=scaled, BT=64, A_LOG2=log2, B_LOG2=log2 - 2 if log2 > 2 else log2, PAIR=pair))


@pytest.mark.parametrize(("nsplit", "scaled", "log2"), [(2, True, 8), (1, False, -1)])
def test_ws_compiles_for_sm90_with_a_producer_warpgroup(nsplit: int, scaled: bool,
                                                        log2: int) -> None:
    """(2, True, 8): the B=64 launch (fp16 partials, 256- and 64-token pages); (1, False, -1):
    one split, fp32 partials, page sizes that are not powers of two (the division path)."""
    from dsv4_experimental.ws_decode import WS_SMEM

    out = _compile(nsplit, scaled, log2)
    assert out["shared"] + 1024 <= WS_SMEM, out
    assert out["wgmma"] == {"m64n32k16": 32, "m64n256k16": 4}, out
    assert 128 in out["setmaxnreg"], out  # the producer warpgroup's register cut
    assert out["cp_async"] > 0, out
    assert out["cluster_arrive"] == out["cluster_wait"] == 0, out  # no pair: no cluster
    assert out["div_f32"] < _PER_ELEMENT_DIVISIONS, out


# The epilogues scale each row by one factor (notes v13): a division per element of the
# [64, 512] tile would be 128 a thread (one split) or more, against a few dozen per row.
_PER_ELEMENT_DIVISIONS = 64


def test_ws_pair_merges_through_one_cluster_barrier_per_thread() -> None:
    """The pair build (two splits merged in a cluster of two CTAs) keeps the products and the
    shared-memory budget of the plain build, and every thread passes the cluster barrier once:
    one arrive-wait pair in the producer, one in each of the consumers' two merge paths (split
    0 keeps columns 0-255, split 1 the rest), so no thread can wait for an arrival that never
    comes. Its epilogue holds half the columns at a time: the whole tile at once spilled (a
    320-byte stack against the plain build's 8, Triton 3.6); by halves it is 8 against 8 with
    Triton 3.6 and 112 against 64 with 3.9."""
    from dsv4_experimental.ws_decode import WS_SMEM

    plain = _compile(2, True, 8)
    out = _compile(2, True, 8, pair=True)
    assert out["shared"] == plain["shared"] and out["shared"] + 1024 <= WS_SMEM, out
    assert out["wgmma"] == plain["wgmma"], out
    assert out["cluster_arrive"] == out["cluster_wait"] == 3, out
    assert out["stack"] <= plain["stack"] + 64, (out, plain)
    assert out["div_f32"] < _PER_ELEMENT_DIVISIONS, out  # nor in the merge


def test_ws_is_refused_where_it_cannot_run(gen: torch.Generator) -> None:
    from dsv4_kernels.cases import make_decode_case
    from dsv4_kernels.sparse_decode import DecodeConfig, sparse_mla_decode

    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=0)
    with pytest.raises(ValueError, match=r"variant 'ws' is a Gluon kernel.*interpreter"):
        sparse_mla_decode(**case.kwargs(), config=DecodeConfig(variant="ws"))


def test_ws_refuses_other_tiles(gen: torch.Generator) -> None:
    from dsv4_kernels.cases import make_decode_case
    from dsv4_kernels.sparse_decode import DecodeConfig, sparse_mla_decode

    case = make_decode_case(gen, batch=1, heads=16, topk=16, extra_topk=0)
    for bad in (dict(block_t=32), dict(num_stages=2), dict(num_warps=4)):
        with pytest.raises(ValueError, match="'ws' takes only block_t 64, num_stages 3"):
            sparse_mla_decode(**case.kwargs(), config=DecodeConfig(variant="ws", **bad))


def test_ws_page_log2() -> None:
    from dsv4_kernels.sparse_decode import page_log2

    assert [page_log2(p) for p in (1, 2, 64, 256, 61, 3, 96, 0)] == [0, 1, 6, 8, -1, -1, -1, -1]


class _FakeCompiled:
    """What ``_launch_pairs`` uses of Triton's compiled kernel, recording the launch."""

    def __init__(self, meta: object) -> None:
        self.packed_metadata = meta
        self.function = "fn"
        self.launches: list[tuple] = []

    @property
    def run(self) -> Callable[..., None]:
        return lambda *a: self.launches.append(a)

    def launch_metadata(self, grid: tuple, stream: int, *values: object) -> None:
        return None


class _FakeKernel:
    """Stands in for the Gluon kernel: records warmups and plain launches (CPU: nothing runs)."""

    def __init__(self, arg_names: list[str], meta: object) -> None:
        self.arg_names = arg_names
        self.compiled = _FakeCompiled(meta)
        self.warmups: list[tuple] = []
        self.plain: list[tuple] = []

    def warmup(self, *, grid: tuple, **kw: object) -> _FakeCompiled:
        self.warmups.append((grid, kw))
        return self.compiled

    def __getitem__(self, grid: tuple) -> Callable[..., None]:
        return lambda **kw: self.plain.append((grid, kw))


def _launch(monkeypatch: pytest.MonkeyPatch, *, rows: int, nsplit: int, scaled: bool,
            pair: bool, meta: object = (8, 1, 227364)) -> tuple[_FakeKernel, bool]:
    from types import SimpleNamespace

    import dsv4_experimental.ws_decode as w

    from dsv4_kernels.sparse_decode import _Keys

    fake = _FakeKernel(list(w._sparse_decode_ws_kernel.arg_names), meta)
    monkeypatch.setattr(w, "_sparse_decode_ws_kernel", fake)
    monkeypatch.setattr(w, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda dev: 1234)))
    q2 = torch.zeros(rows, 64, 512, dtype=torch.bfloat16, device="meta")
    idx = torch.zeros(rows, 1, 128, dtype=torch.int32, device="meta")
    u8 = torch.zeros(2, 256 * 584, dtype=torch.uint8, device="meta")
    keys = _Keys(u8, u8, idx, None, 128, 256, 256 * 584)
    f32 = torch.zeros(1, device="meta")
    done = w.launch_ws(q2, keys, keys, f32, f32, f32, q2, f32, f32, f32, f32, 64, 1, 0.1,
                       dict(A_HAS_LEN=False, HAS_B=True, B_HAS_LEN=False), True, nsplit,
                       scaled, pair=pair)
    return fake, done


def test_ws_pair_is_launched_as_clusters_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two scaled splits: compiled (not launched) through ``warmup``, then launched through
    the compiled kernel's launcher with a grid of (1, rows, head blocks) and packed metadata
    asking for 2 CTAs per cluster (the launcher multiplies x by it), every argument in the
    kernel's order; no combine is needed."""
    fake, done = _launch(monkeypatch, rows=64, nsplit=2, scaled=True, pair=True)
    assert done and not fake.plain
    (grid, kw), = fake.warmups
    assert grid == (2, 64, 1) and kw["PAIR"] is True and kw["NSPLIT"] == 2
    (launch,) = fake.compiled.launches
    gx, gy, gz, stream, fn, meta, _, _, _, *values = launch
    assert (gx, gy, gz, stream, fn, meta) == (1, 64, 1, 1234, "fn", (8, 2, 227364))
    assert values == [kw[name] for name in fake.arg_names]
    assert values[fake.arg_names.index("PAIR")] is True


@pytest.mark.parametrize(("rows", "nsplit", "scaled", "pair", "meta", "complete"), [
    (64, 2, True, False, (8, 1, 227364), False),   # pair=False: the combine
    (64, 2, False, True, (8, 1, 227364), False),   # fp32 partials: the pair merges fp16 ones
    (64, 3, True, True, (8, 1, 227364), False),    # three splits
    (70000, 2, True, True, (8, 1, 227364), False),  # rows past the y-grid limit
    (64, 2, True, True, None, False),              # a launcher without packed metadata
    (64, 1, False, True, (8, 1, 227364), True),    # one split: complete, no combine
])
def test_ws_falls_back_to_the_plain_launch(monkeypatch: pytest.MonkeyPatch, rows: int,
                                           nsplit: int, scaled: bool, pair: bool,
                                           meta: object, complete: bool) -> None:
    """Wherever the pair cannot run, the ordinary grid (rows, head blocks, splits) runs with
    PAIR off, and the caller is told whether the combine must follow."""
    fake, done = _launch(monkeypatch, rows=rows, nsplit=nsplit, scaled=scaled, pair=pair,
                         meta=meta)
    assert done is complete
    assert not fake.compiled.launches
    (grid, kw), = fake.plain
    assert grid == (rows, 1, nsplit) and kw["PAIR"] is False
