"""Side by side on an sm_90 GPU: the ``ws`` and ``wg`` decode variants on the shapes that
decide the dispatch (B=64 at top-k 512 / 1024, pages that are not a power of two, zero and
random lengths, more than one head block, no sink), and ``ws`` with two splits merged in a
cluster of two CTAs (``ws``, the default) against the same splits merged by the combine launch
(``ws-combine``). Every result is checked against the fp32 reference, and each timing
(CUDA-graph replays, L2 flushed, as in the bench) against an eager call for bit-identical
output. One JSON line per case and variant; each variant runs twice.

``python kernels/tools/ws_probe.py [--variants pf,full,local] [--shapes 0,1,5]``
(PYTHONPATH=kernels): other variants (``NAME-combine``: two or more splits merged by the combine
launch), and a subset of SHAPES by index.
"""

from __future__ import annotations

import argparse
import json

import experiments  # noqa: F401  (registers the experiments: wg, ws, ...)
import torch
from bench import SWA, Timer

from dsv4_kernels import sparse_decode as sd
from dsv4_kernels.cases import compare_decode, make_decode_case
from dsv4_kernels.reference import ref_sparse_decode

SHAPES = [  # batch, extra top-k, heads, lengths, SWA page size, extra page size, splits, sink
    (64, 512, 64, "full", 256, 64, None, True), (64, 1024, 64, "full", 256, 64, None, True),
    (64, 512, 64, "random", 61, 64, None, True), (5, 512, 32, "random", 61, 3, 2, True),
    (3, 512, 64, "zero", 256, 64, 2, True), (1, 512, 64, "full", 256, 64, 2, True),
    (4, 1024, 128, "full", 256, 64, 2, False),
]
VARIANTS = ("wg", "ws", "ws-combine")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated, e.g. pf,full,local (default: %(default)s)")
    ap.add_argument("--shapes", default=None,
                    help="comma-separated indices into SHAPES (default: all)")
    args = ap.parse_args()
    variants = tuple(args.variants.split(","))
    unknown = [v for v in variants if v.removesuffix("-combine") not in sd._VARIANT_TILES]
    if unknown:
        ap.error(f"--variants: unknown {', '.join(unknown)}; choose from "
                 f"{', '.join(sorted(sd._VARIANT_TILES))}, each optionally with -combine")
    picked = SHAPES
    if args.shapes:
        idx = args.shapes.split(",")
        bad = [i for i in idx if not (i.isdigit() and int(i) < len(SHAPES))]
        if bad:
            ap.error(f"--shapes: {', '.join(bad)} not an index of SHAPES (0-{len(SHAPES) - 1})")
        picked = [SHAPES[int(i)] for i in idx]
    timer = Timer(torch.device("cuda"))
    g = torch.Generator().manual_seed(3)
    for bsz, topk, heads, lengths, ps, eps, nsplit, sink in picked:
        c = make_decode_case(g, batch=bsz, heads=heads, topk=SWA, extra_topk=topk,
                             page_size=ps, extra_page_size=eps, lengths=lengths, sink=sink,
                             invalid_frac=0.1 if lengths == "random" else 0.0, device="cuda")
        kw = c.kwargs()
        ro, rl = ref_sparse_decode(**kw)
        for name in variants + variants:
            cfg = sd.DecodeConfig(variant=name.removesuffix("-combine"), nsplit=nsplit,
                                  pair=not name.endswith("-combine"))
            row: dict = {"shape": f"{bsz}:{topk} h{heads} {lengths} ps{ps}/{eps} "
                                  f"splits {nsplit or 'auto'} sink {sink}", "variant": name}
            o, lse = sd.sparse_mla_decode(**kw, config=cfg)
            res = compare_decode(o, lse, ro, rl)
            row["ok"] = res["ok"]
            st: dict = {}

            def run(st: dict = st, kw: dict = kw, cfg: sd.DecodeConfig = cfg) -> None:
                st["o"], st["l"] = sd.sparse_mla_decode(**kw, config=cfg)

            row["us"] = round(timer.graph(run), 2)
            row["graph_equal"] = bool(torch.equal(st["o"], o) and torch.equal(st["l"], lse))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
