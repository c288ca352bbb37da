"""The sm_120 path measured on an H200 (issue 24): a proxy for the RTX PRO 6000 the tool deploys to.

``python kernels/tools/sm120_proxy.py --baselines .baselines [--json out.json]``

* ``TRITON_OVERRIDE_ARCH=sm89`` (set here before Triton loads) makes Triton lower every kernel of
  this process through the pre-Hopper MMA path, as on sm_120 (``mma.sync``, no ``wgmma``); the
  PTX of every kernel that ran is checked for it afterwards (counts in the output).
* The sm_120 dispatch is forced: ``sparse_decode`` is told the device has sm_120's 101,376 B of
  shared memory per block and compute capability 12.0, so it picks what it picks there (``pf``
  at ``SMALL_SMEM_BLOCK_H`` heads); each kernel's shared memory is checked against that cap.
* SGLang 0.5.23's fused split-K decode kernel (``triton_fp8_attention_fwd``, baseline (b)) runs
  in the same process, so it is built the same way; side by side per shape, graph replays with
  a cold L2 (``bench.Timer``), outputs checked against the float32 reference.
* Beside each time: the RTX PRO 6000 roofline of the shape from datasheet figures (below).
* ``--candidates``: other tile configurations that fit sm_120, timed in the same run (the
  speed-target attempts).
* The indexer through the hooked entry point (``sglang_compat.fp8_paged_mqa_logits_sm120``, the
  function the hook installs for SGLang's ``fp8_paged_mqa_logits_torch_sm120``), B=64, 1K real
  compressed keys at 1K / 65K / 262K maximum, ``clean_logits=False`` as SGLang's caller passes
  it, and ``True`` (the tail written) for comparison.

RTX PRO 6000 Blackwell figures (docs/research model-hw.md, "hardware" table): memory bandwidth
1,597 GB/s (Server Edition, the deploy target; NVIDIA product page / Dec-2025 datasheet) and
1,792 GB/s (Workstation Edition); tensor rates listed by NVIDIA as BF16 1 PFLOPS and FP8
2 PFLOPS without a sparsity qualifier, so taken as sparse: dense ~500 / ~1000 TFLOPS
(unconfirmed; a derivation from clocks gives 480 / 960). The H200's own ceilings are measured
in the run (``bench.ceilings``) and printed too. Not part of the package.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_OVERRIDE_ARCH", "sm89")

import argparse
import json
import pathlib
import re
import time
from typing import Any

import torch
from bench import SWA, Timer, ceilings, load_baselines

from dsv4_kernels import sglang_compat
from dsv4_kernels import sparse_decode as sd
from dsv4_kernels.cases import compare_decode, make_decode_case, make_indexer_case
from dsv4_kernels.reference import ref_sparse_decode

SM120_SMEM = 101376
RTX_BW = {"server_1597": 1597e9, "workstation_1792": 1792e9}
RTX_BF16_DENSE = 500e12  # unconfirmed: half the listed 1 PFLOPS (taken as sparse)
RTX_FP8_DENSE = 1000e12
# Tile configurations that fit sm_120's 99 KB (the gate's compiler reports, notes "sm_120"):
# what the speed-target attempts timed side by side. "pf bh64" is the configuration before
# issue 24 (it spills 144 B a thread on sm_120); the local ones spill nothing at 8 warps.
CANDIDATES: dict[str, Any] = {
    "pf bh64 (before)": sd.DecodeConfig(variant="pf", block_h=64),
    "pf bh32": sd.DecodeConfig(variant="pf", block_h=32),
    "pf bh16": sd.DecodeConfig(variant="pf", block_h=16),
    "pf bh32 2x splits": "2x",
    "dsplit bh32 bt16": sd.DecodeConfig(variant="dsplit", block_h=32, block_t=16, num_stages=1),
    "local bh32 bt16 s2": sd.DecodeConfig(variant="local", block_h=32, block_t=16,
                                          num_stages=2),
    "local bh32 bt32 s2": sd.DecodeConfig(variant="local", block_h=32, block_t=32,
                                          num_stages=2),
    "local bh32 bt16 s3": sd.DecodeConfig(variant="local", block_h=32, block_t=16,
                                          num_stages=3),
}


def force_sm120() -> None:
    """Make the dispatcher see an sm_120 device (what ``choose_variant`` reads)."""
    sd.device_max_shared = lambda t: SM120_SMEM  # type: ignore[assignment]
    sd.device_arch = lambda t: 120  # type: ignore[assignment]


_LAUNCHED: list[str] = []


def record_launches() -> None:
    """Record the variant and tiles the launcher really runs (after the dispatch and any
    fallback), so the table's variant column is what ran, not a re-derivation of it."""
    rows = sd._Launch.rows

    def recording(self: Any, *a: Any, **kw: Any) -> Any:
        nsplit = a[-1] if a else kw.get("nsplit")
        _LAUNCHED.append(f"{self.variant} bh{self.block_h} bt{self.block_t} "
                         f"s{self.num_stages} w{self.num_warps} nsplit{nsplit}")
        return rows(self, *a, **kw)

    sd._Launch.rows = recording  # type: ignore[method-assign]


def compiled(fn: Any) -> list[Any]:
    """The compiled kernels a ``@triton.jit`` function holds (Triton 3.6 and 3.9 caches)."""
    out = []
    for entry in getattr(fn, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        out += list(cache.values())
    return out


def ptx_summary(fn: Any) -> list[dict[str, Any]]:
    rows = []
    for k in compiled(fn):
        ptx = k.asm.get("ptx", "")
        rows.append({"kernel": k.metadata.name, "shared": k.metadata.shared,
                     "target": re.search(r"\.target (\S+)", ptx).group(1) if ptx else "?",
                     "mma_sync": len(re.findall(r"\bmma\.sync\.aligned", ptx)),
                     "wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)),
                     "num_warps": k.metadata.num_warps})
    return rows


def rtx_roofline(bsz: int, topk: int) -> dict[str, float]:
    nbytes, flops = sd.roofline_bytes_flops(bsz, 64, SWA + topk)
    out = {f"rtx_{k}_us": max(nbytes / bw, flops / RTX_BF16_DENSE) * 1e6
           for k, bw in RTX_BW.items()}
    out["rtx_mem_us_1597"] = nbytes / RTX_BW["server_1597"] * 1e6
    out["rtx_bf16_us"] = flops / RTX_BF16_DENSE * 1e6
    out["rtx_fp8_us"] = flops / RTX_FP8_DENSE * 1e6
    return out


def decode_shape(timer: Timer, base: dict[str, Any], g: torch.Generator, bsz: int, topk: int,
                 candidates: list[str]) -> dict[str, Any]:
    c = make_decode_case(g, batch=bsz, heads=64, topk=SWA, extra_topk=topk, page_size=256,
                         extra_page_size=64, device="cuda")
    kw = c.kwargs()
    ro, rl = ref_sparse_decode(**kw)
    static: dict[str, Any] = {}

    def run(cfg: sd.DecodeConfig | None = None) -> None:
        static["o"] = sd.sparse_mla_decode(**kw, config=cfg)

    row: dict[str, Any] = {"shape": f"B={bsz} topk={topk}+{SWA}"}
    _LAUNCHED.clear()
    eager = sd.sparse_mla_decode(**kw)
    row["ran"] = "; ".join(_LAUNCHED)
    row.update(compare_decode(*eager, ro, rl))
    row["us"] = timer.graph(run)
    row["graph_equal"] = bool(torch.equal(static["o"][0], eager[0])
                              and torch.equal(static["o"][1], eager[1]))
    rows, hb = bsz, -(-64 // sd.pf_block_h(64, SM120_SMEM))
    row["dispatch"] = sd.choose_variant(rows, hb, torch.cuda.get_device_properties(0)
                                        .multi_processor_count, SM120_SMEM, 120)[0]
    bk = dict(q=c.q, k_cache=c.k_cache, head_dim_v=512, softmax_scale=c.sm_scale,
              indices=c.indices, attn_sink=c.attn_sink, extra_k_cache=c.extra_k_cache,
              extra_indices_in_kvcache=c.extra_indices, topk_length=c.topk_length,
              extra_topk_length=c.extra_topk_length)
    ob, _ = base["b"](**bk)
    row["b_out_rel_err"] = float((ob.float() - ro).norm() / ro.norm())
    row["us_b"] = timer.graph(lambda: base["b"](**bk))
    row["x_b"] = row["us_b"] / row["us"]
    row.update(rtx_roofline(bsz, topk))
    if candidates:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for name in candidates:
            cfg = CANDIDATES[name]
            if cfg == "2x":
                max_tiles = -(-SWA // 16) + -(-topk // 16)
                ns = 2 * sd.choose_nsplit(bsz, hb, max_tiles, sms)
                cfg = sd.DecodeConfig(nsplit=min(ns, 32))
            try:
                o = sd.sparse_mla_decode(**kw, config=cfg)
                ok = compare_decode(*o, ro, rl)["ok"]
                row[f"cand {name}"] = (round(timer.graph(lambda cfg=cfg: run(cfg)), 1), ok)
            except Exception as exc:  # a candidate that does not build is recorded, not fatal
                row[f"cand {name}"] = f"fail: {type(exc).__name__}: {str(exc)[:160]}"
    return row


def hooked_indexer(timer: Timer) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(5)
    rows = []
    for max_len in (1024, 65536, 262144):
        c = make_indexer_case(g, batch=64, heads=64, lens=[1024] * 64, max_len=max_len,
                              page_size=64, device="cuda")
        args = (c.q_fp8.unsqueeze(1), c.index_cache, c.weights, c.seq_lens, c.page_table, None,
                max_len)
        for clean in (False, True):
            t = timer.graph(lambda clean=clean, a=args: sglang_compat.fp8_paged_mqa_logits_sm120(
                *a, clean_logits=clean))
            rows.append({"real": 1024, "max": max_len, "clean_logits": clean, "us": t})
        torch.cuda.empty_cache()
    base = next(r["us"] for r in rows if r["max"] == 1024 and not r["clean_logits"])
    for r in rows:
        r["x_1k_at_1k"] = r["us"] / base
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baselines", required=True)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--topks", default="512,1024")
    ap.add_argument("--candidates", nargs="?", const="all", default="",
                    help="comma-separated names of CANDIDATES (default: all)")
    ap.add_argument("--skip-indexer", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.time()
    force_sm120()
    record_launches()
    base = load_baselines(args.baselines)
    dev = torch.device("cuda")
    import triton

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "triton": triton.__version__,
                           "TRITON_OVERRIDE_ARCH": os.environ.get("TRITON_OVERRIDE_ARCH"),
                           "ceilings_h200": ceilings(dev)}
    print(json.dumps(res), flush=True)
    timer = Timer(dev)
    g = torch.Generator().manual_seed(1234)
    res["decode"] = []
    cands = list(CANDIDATES) if args.candidates == "all" else \
        [c for c in args.candidates.split(",") if c]
    unknown = [c for c in cands if c not in CANDIDATES]
    if unknown:
        raise SystemExit(f"error: unknown --candidates {unknown}; known: {list(CANDIDATES)}")
    for topk in [int(x) for x in args.topks.split(",")]:
        for bsz in [int(x) for x in args.batches.split(",")]:
            row = decode_shape(timer, base, g, bsz, topk, cands)
            res["decode"].append(row)
            print(json.dumps(row), flush=True)
    # every kernel that ran, ours and SGLang's: lowered through mma.sync, under sm_120's cap
    import sys

    theirs = [m for n, m in sys.modules.items() if n.startswith("sglang.kernels")]
    res["ptx"] = {"ours": [r for fn in (sd._sparse_decode_pf_kernel, sd._combine_kernel,
                                        sd._sparse_decode_dsplit_kernel,
                                        sd._sparse_decode_local_kernel)
                           for r in ptx_summary(fn)],
                  "sglang": [r for m in theirs for v in vars(m).values()
                             for fn in (v, getattr(v, "fn", None))  # autotuned: .fn
                             if hasattr(fn, "device_caches") for r in ptx_summary(fn)]}
    print(json.dumps(res["ptx"]), flush=True)
    if not args.skip_indexer:
        res["indexer_hooked"] = hooked_indexer(timer)
        print(json.dumps(res["indexer_hooked"]), flush=True)
    res["wall_s"] = time.time() - t0
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    print_tables(res)
    ours_ok = all(r["shared"] <= SM120_SMEM and r["wgmma"] == 0 for r in res["ptx"]["ours"])
    return 0 if ours_ok and all(r["ok"] and r["graph_equal"] for r in res["decode"]) else 1


def print_tables(res: dict[str, Any]) -> None:
    print(f"\n{res['device']}, Triton {res['triton']}, TRITON_OVERRIDE_ARCH="
          f"{res['TRITON_OVERRIDE_ARCH']}, sm_120 dispatch forced; H200 ceilings "
          f"{res['ceilings_h200']['copy_GBps']:.0f} GB/s, {res['ceilings_h200']['bf16_TFLOPS']:.0f}"
          " TFLOPS")
    print("| shape | ran (dispatch) | ours µs | SGLang fused µs | × | RTX roofline µs "
          "(1597 / 1792 GB/s; bf16 / fp8 MMA) | out err | graph |")
    print("|---|---|---|---|---|---|---|---|")
    for r in res["decode"]:
        print(f"| {r['shape']} | {r['ran']} | {r['us']:.1f} | {r['us_b']:.1f} | "
              f"{r['x_b']:.2f} | {r['rtx_server_1597_us']:.1f} / {r['rtx_workstation_1792_us']:.1f}"
              f"; {r['rtx_bf16_us']:.1f} / {r['rtx_fp8_us']:.1f} | {r['out_rel_err']:.4f} | "
              f"{r['graph_equal']} |")
    cands = [k for k in res["decode"][0] if k.startswith("cand ")]
    if cands:
        print("\n| shape | " + " | ".join(k[5:] for k in cands) + " |")
        print("|---|" + "---|" * len(cands))
        for r in res["decode"]:
            print(f"| {r['shape']} | " + " | ".join(str(r.get(k)) for k in cands) + " |")
    print("\n| kernel (ours / SGLang) | shared B | mma.sync | wgmma | target |")
    print("|---|---|---|---|---|")
    for who in ("ours", "sglang"):
        seen = sorted({(r["kernel"], r["shared"], r["mma_sync"], r["wgmma"], r["target"])
                       for r in res["ptx"][who]})
        for kern, shared, mma, wg, target in seen:
            print(f"| {who}: {kern} | {shared} | {mma} | {wg} | {target} |")
    if "indexer_hooked" in res:
        print("\n| hooked logits, B=64 | max | clean_logits | µs | × (1K at 1K) |")
        print("|---|---|---|---|---|")
        for r in res["indexer_hooked"]:
            print(f"| 1K real | {r['max']} | {r['clean_logits']} | {r['us']:.1f} | "
                  f"{r['x_1k_at_1k']:.2f} |")


if __name__ == "__main__":
    raise SystemExit(main())
