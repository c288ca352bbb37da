"""Time many sparse-decode configurations side by side in one GPU run (device-time saver).

``python kernels/tools/decode_sweep.py [--baselines .baselines] [--quick]`` builds the bench's
shapes (64 heads, SWA 128 + top-k extra keys), checks every configuration against the fp32
reference, times CUDA-graph replays with a cold L2 (bench.Timer) and prints one table per shape.
Used to pick the defaults recorded in kernels/notes; not part of the package.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import experiments  # noqa: F401  (registers the experiments: wg, ws, ...)
import torch
from bench import SWA, Timer, ceilings, load_baselines

from dsv4_kernels.cases import compare_decode, make_decode_case
from dsv4_kernels.reference import ref_sparse_decode
from dsv4_kernels.sparse_decode import DecodeConfig, roofline_bytes_flops, sparse_mla_decode


def staged_configs(bsz: int) -> list[DecodeConfig]:
    def st(**kw: object) -> DecodeConfig:
        return DecodeConfig(variant="staged", **kw)  # type: ignore[arg-type]

    out = [st(block_t=64, num_stages=2),
           st(block_t=64, num_stages=2, l2_hints=False),
           st(block_t=64, num_stages=2, partials="bf16"), st(block_t=32, num_stages=3),
           st(block_h=32, block_t=32, num_stages=2, num_warps=4, nsplit=1),
           st(block_h=32, block_t=32, num_stages=2, num_warps=8, nsplit=1),
           st(block_h=32, block_t=32, num_stages=2, num_warps=4)]
    # what fits sm_120's 99 KB (Triton 3.6: 84 KB at BH 64 / BT 16 / 2 stages)
    out += [st(block_t=16, num_stages=2)]
    return out


def local_configs() -> list[DecodeConfig]:
    def lo(**kw: object) -> DecodeConfig:
        return DecodeConfig(variant="local", **kw)  # type: ignore[arg-type]

    return [DecodeConfig(variant="staged"), DecodeConfig(variant="gp", block_t=64, num_stages=2),
            lo(), lo(stage_round=1), lo(stage_round=3), lo(stage_round=2, l2_hints=False),
            lo(stage_block=32), lo(stage_round=2, nsplit=3),
            lo(block_t=32, num_stages=3, stage_round=4), lo(partials="fp32"), lo(partials="bf16")]


def partial_configs(bsz: int) -> list[DecodeConfig]:
    """Split-partial formats side by side (notes v7)."""
    out = [DecodeConfig(variant="local", partials=p) for p in ("fp16", "fp32", "bf16")]
    if bsz >= 64:
        out += [DecodeConfig(variant="pf", block_t=16, partials=p) for p in ("fp16", "fp32")]
    return out


def wg_configs() -> list[DecodeConfig]:
    """The Gluon variant (wg_decode.py) against the Triton default it would replace."""
    def wg(**kw: object) -> DecodeConfig:
        return DecodeConfig(variant="wg", **kw)  # type: ignore[arg-type]

    return [DecodeConfig(variant="local"), wg(), wg(pipeline=False), wg(nsplit=3),
            wg(block_t=32, num_stages=3)]


def configs(bsz: int, limits: bool = False, only: str | None = None) -> list[DecodeConfig]:
    if only == "wg":
        return wg_configs()
    if only == "local":
        return local_configs()
    if only == "partials":
        return partial_configs(bsz)
    if only == "stage":
        return [DecodeConfig(variant="staged"), DecodeConfig(variant="staged", stage_warps=8),
                DecodeConfig(variant="staged", stage_block=16),
                DecodeConfig(variant="staged", stage_block=16, stage_warps=8),
                DecodeConfig(variant="staged", stage_block=64, stage_warps=8),
                DecodeConfig(variant="gp", block_t=64, num_stages=2),
                DecodeConfig(variant="dsplit", block_t=64)]
    if only == "gp":
        return [DecodeConfig(variant="staged"),
                *(DecodeConfig(variant="gp", block_t=bt, num_stages=st)
                  for bt, st in ((32, 3), (16, 3), (64, 2), (32, 2), (16, 4)))]
    if only == "staged":
        return [DecodeConfig(variant="full"), DecodeConfig(variant="pf", block_t=16),
                DecodeConfig(variant="dsplit", block_t=64),
                *staged_configs(bsz)]
    if limits:  # only what fits sm_120's 99 KB per block (kernels.md 5.2)
        return [DecodeConfig(variant="pf", block_t=16, num_warps=8),
                DecodeConfig(variant="dsplit", block_t=32),
                DecodeConfig(variant="staged", block_t=16, num_stages=2)]
    out = [DecodeConfig(variant="full"), DecodeConfig(variant="full", partials="bf16")]

    def pf(**kw: object) -> DecodeConfig:
        return DecodeConfig(variant="pf", **kw)  # type: ignore[arg-type]

    if bsz >= 64:
        out += [pf(block_t=32, num_warps=8), pf(block_t=32, num_warps=16),
                pf(block_t=64, num_warps=8), pf(block_t=32, num_warps=8, partials="bf16"),
                pf(block_t=32, num_warps=8, nsplit=1), pf(block_t=32, num_warps=8, nsplit=3),
                pf(block_t=32, num_warps=8, nsplit=4), pf(block_t=64, num_warps=8, nsplit=1),
                pf(block_t=64, num_warps=8, nsplit=3), pf(block_t=32, num_warps=8, num_stages=2)]
    else:
        out += [DecodeConfig(variant="dsplit"), DecodeConfig(variant="dsplit", block_t=64),
                pf(block_t=32, num_warps=8), pf(block_t=64, num_warps=8),
                pf(block_t=16, num_warps=8)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baselines")
    ap.add_argument("--shapes", default="64:512,64:1024,1:512,8:1024")
    ap.add_argument("--json")
    ap.add_argument("--limits", action="store_true", help="only configs that fit 99 KB")
    ap.add_argument("--only", choices=["staged", "gp", "stage", "local", "partials", "wg"],
                    help="one variant family (plus references)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    ceil = ceilings(dev)
    print(json.dumps(ceil), flush=True)
    base = load_baselines(args.baselines) if args.baselines else None
    timer = Timer(dev)
    g = torch.Generator().manual_seed(99)
    results = []
    for spec in args.shapes.split(","):
        bsz, topk = (int(x) for x in spec.split(":"))
        c = make_decode_case(g, batch=bsz, heads=64, topk=SWA, extra_topk=topk, page_size=256,
                             extra_page_size=64, device="cuda")
        kw = c.kwargs()
        ro, rl = ref_sparse_decode(**kw)
        nbytes, flops = roofline_bytes_flops(bsz, 64, SWA + topk)
        roof = max(nbytes / (ceil["copy_GBps"] * 1e9), flops / (ceil["bf16_TFLOPS"] * 1e12)) * 1e6
        rows = []
        if base is not None:
            bk = dict(q=c.q, k_cache=c.k_cache, head_dim_v=512, softmax_scale=c.sm_scale,
                      indices=c.indices, attn_sink=c.attn_sink, extra_k_cache=c.extra_k_cache,
                      extra_indices_in_kvcache=c.extra_indices, topk_length=c.topk_length,
                      extra_topk_length=c.extra_topk_length)
            rows.append({"cfg": "sglang (b)", "us": timer.graph(lambda bk=bk: base["b"](**bk))})
        for cfg in configs(bsz, args.limits, args.only):
            if bsz < 64 and cfg.nsplit == 1 and cfg.block_h == 32:
                continue
            name = (f"{cfg.variant} bt={cfg.block_t} nw={cfg.num_warps} pf={int(cfg.prefetch)}"
                    f" ns={cfg.nsplit} st={cfg.num_stages} pt={cfg.partials}"
                    f" bg={cfg.stage_block} l2={int(cfg.l2_hints)} sw={cfg.stage_warps}"
                    f" bh={cfg.block_h} rnd={cfg.stage_round} pipe={int(cfg.pipeline)}")
            try:
                t0 = time.time()
                o, lse = sparse_mla_decode(**kw, config=cfg)
                ok = compare_decode(o, lse, ro, rl)["ok"]
                st: dict[str, torch.Tensor] = {}

                def run(cfg: DecodeConfig = cfg, kw: dict = kw,
                        st: dict[str, torch.Tensor] = st) -> None:
                    st["o"], st["l"] = sparse_mla_decode(**kw, config=cfg)

                us = timer.graph(run)
                same = bool(torch.equal(st["o"], o) and torch.equal(st["l"], lse))
                rows.append({"cfg": name, "us": us, "ok": ok and same,
                             "compile_s": round(time.time() - t0, 1)})
            except Exception as exc:  # keep sweeping: one bad config must not end the run
                rows.append({"cfg": name, "us": None, "err": f"{type(exc).__name__}: {exc}"[:160]})
            print(json.dumps({"shape": spec, **rows[-1]}), flush=True)
        results.append({"shape": spec, "roofline_us": roof, "rows": rows})
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceilings": ceil, "results": results}, f, indent=1)
    for res in results:
        print(f"\n## B:topk {res['shape']}  roofline {res['roofline_us']:.1f} µs")
        for r in sorted(res["rows"], key=lambda r: r["us"] if r["us"] else 1e9):
            us = r["us"]
            frac = f"{res['roofline_us'] / us:.3f}" if us else "-"
            print(f"{r['cfg']:<62} {us if us is None else round(us, 1)!s:>8} µs  frac {frac}"
                  f"  ok={r.get('ok', '-')} {r.get('err', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
