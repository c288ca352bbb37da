"""Where the fixed part of a split decode goes, and which split-combine launch is fastest.

``python kernels/tools/combine_sweep.py [--shapes 64:512,64:1024,8:1024,1:512]`` times, per
shape and in one run (CUDA-graph replays with a cold L2, as the bench): the default decode with
the combine launched at several head-block / column-block / warp shapes, the same decode with
the combine left out (the attention kernel alone: outputs wrong on purpose, not checked), and
both again with every valid length set to 0 (prologue, epilogue and launches only). Every
checked configuration is compared with the fp32 reference. Used for notes v10; not part of
the package.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch
import triton
from bench import SWA, Timer

from dsv4_kernels import sparse_decode as sd
from dsv4_kernels.cases import compare_decode, make_decode_case
from dsv4_kernels.reference import ref_sparse_decode

_REAL = sd._combine_kernel


class _CombineAs:
    """Stands in for ``_combine_kernel`` in ``sparse_decode``: the same kernel launched with
    ``bh`` heads x ``dc`` columns per program and ``nw`` warps, or nothing at all."""

    def __init__(self, bh: int, dc: int, nw: int, skip: bool = False) -> None:
        self.bh, self.dc, self.nw, self.skip = bh, dc, nw, skip

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def launch(*args: object, **kw: object) -> None:
            if self.skip:
                return
            h = int(args[8])  # type: ignore[call-overload]
            kw.update(BH=self.bh, DC=self.dc, num_warps=self.nw)
            _REAL[(grid[0], triton.cdiv(h, self.bh), 512 // self.dc)](*args, **kw)
        return launch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="64:512,64:1024,8:1024,1:512")
    args = ap.parse_args()
    timer = Timer(torch.device("cuda"))
    g = torch.Generator().manual_seed(7)
    combos = [(16, 128, 4), (8, 128, 4), (4, 128, 2), (8, 256, 8), (8, 64, 2), (16, 256, 8)]
    for spec in args.shapes.split(","):
        bsz, topk = (int(x) for x in spec.split(":"))
        for lengths in ("full", "zero"):
            c = make_decode_case(g, batch=bsz, heads=64, topk=SWA, extra_topk=topk,
                                 page_size=256, extra_page_size=64, lengths=lengths,
                                 device="cuda")
            kw = c.kwargs()
            ro, rl = ref_sparse_decode(**kw)
            runs = [(f"combine bh={b} dc={d} nw={n}", _CombineAs(b, d, n)) for b, d, n in combos]
            runs.append(("no combine (kernel alone)", _CombineAs(0, 0, 0, skip=True)))
            for name, comb in runs:
                sd._combine_kernel = comb  # type: ignore[assignment]
                try:
                    o, lse = sd.sparse_mla_decode(**kw)
                    ok = compare_decode(o, lse, ro, rl)["ok"] if not comb.skip else None
                    st: dict[str, torch.Tensor] = {}

                    def run(st: dict[str, torch.Tensor] = st, kw: dict = kw) -> None:
                        st["o"], st["l"] = sd.sparse_mla_decode(**kw)

                    us = timer.graph(run)
                    print(json.dumps({"shape": spec, "lengths": lengths, "cfg": name,
                                      "us": round(us, 2), "ok": ok}), flush=True)
                except Exception as exc:  # keep sweeping
                    print(json.dumps({"shape": spec, "lengths": lengths, "cfg": name,
                                      "err": f"{type(exc).__name__}: {exc}"[:200]}), flush=True)
                finally:
                    sd._combine_kernel = _REAL
    return 0


if __name__ == "__main__":
    sys.exit(main())
