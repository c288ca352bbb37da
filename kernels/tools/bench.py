"""Benchmark on one GPU: bundled kernels vs rooflines and SGLang 0.5.23's own kernels.

``python kernels/tools/bench.py --baselines .baselines [--json out.json]`` prints a table per
section. All numbers come from this run: the device copy bandwidth (bytes read + written of a
large device-to-device copy) and the bf16 matrix rate (8192^3 random operands) are measured
first and serve as the ceilings. Kernel times are medians of CUDA-graph replays with a 256 MiB
buffer overwritten before each replay (so L2 starts cold), except SGLang's per-(request, head)
fallback (a), which is timed eagerly as the issue asks. Roofline time = max(unique bytes / copy
bandwidth, FLOPs / bf16 rate). Baselines are imported from the folder written by
``kernels/tools/fetch_baselines.py`` (SGLang's code is never committed here).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from experiments import topk_variant

from dsv4_kernels.cases import check_topk, compare_decode, make_decode_case
from dsv4_kernels.indexer import indexer_logits, indexer_topk
from dsv4_kernels.layout import INDEX_BYTES_PER_TOKEN, quantize_index_keys
from dsv4_kernels.reference import ref_indexer_logits, ref_sparse_decode
from dsv4_kernels.sparse_decode import DecodeConfig, roofline_bytes_flops, sparse_mla_decode

SWA = 128


class Timer:
    """Event timing with an L2 flush before each measured launch."""

    def __init__(self, device: torch.device) -> None:
        self.flush_buf = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)

    def _measure(self, launch: Callable[[], Any], reps: int) -> float:
        times = []
        for _ in range(reps):
            self.flush_buf.fill_(1)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            launch()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        return statistics.median(times)

    def graph(self, fn: Callable[[], Any], reps: int = 30) -> float:
        """Median µs of graph replays of ``fn`` (warmed up and compiled before capture)."""
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        self.last_graph = g
        return self._measure(g.replay, reps)

    def replay_matches_eager(self, fn: Callable[[], Any], out: torch.Tensor) -> bool:
        """Replay the last timed graph, then run ``fn`` eagerly: does ``out`` come out the same?"""
        self.last_graph.replay()
        torch.cuda.synchronize()
        from_graph = out.clone()
        fn()
        torch.cuda.synchronize()
        return bool(torch.equal(from_graph, out))

    def eager(self, fn: Callable[[], Any], reps: int = 5) -> float:
        fn()
        torch.cuda.synchronize()
        return self._measure(fn, reps)


def ceilings(device: torch.device) -> dict[str, float]:
    """Copy bandwidth (GB/s, read + write) and bf16 matmul TFLOP/s, measured now."""
    n = 2 * 2**30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    bw = 2 * n / statistics.median(ts) / 1e9
    del src, dst
    m = 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    tf = 2 * m**3 / statistics.median(ts) / 1e12
    return {"copy_GBps": bw, "bf16_TFLOPS": tf}


def load_baselines(folder: str) -> dict[str, Any]:
    """Import SGLang 0.5.23's kernels from the fetched folder (see tools/fetch_baselines.py)."""
    root = pathlib.Path(folder).resolve()
    if (root / "VERSION").read_text().strip() != "0.5.23":
        raise SystemExit(f"error: {root} does not hold sglang 0.5.23 baselines")
    sys.path.insert(0, str(root))
    import sglang

    if not str(pathlib.Path(sglang.__file__).resolve()).startswith(str(root)):
        raise SystemExit(f"error: imported sglang from {sglang.__file__}, not {root}")
    from sglang.kernels.ops.attention.dsv4.triton_sparse_decode import (
        triton_fp8_attention_fwd,
    )
    from sglang.kernels.ops.attention.flash_mla_sm120_triton import (
        flash_mla_sparse_decode_triton,
    )

    from dsv4_kernels.sglang_compat import load_sglang_functions

    idx_fns = load_sglang_functions(
        root / "sglang/srt/layers/attention/dsv4/indexer.py",
        ["_arange_cache", "fp8_paged_mqa_logits_torch_sm120", "_topk_transform_vectorized",
         "topk_transform_pytorch_vectorized"],
    )
    return {"a": flash_mla_sparse_decode_triton, "b": triton_fp8_attention_fwd, **idx_fns}


def _decode_row(name: str, t_us: float, nbytes: float, flops: float, ceil: dict[str, float],
                extra: dict[str, Any]) -> dict[str, Any]:
    roof = max(nbytes / (ceil["copy_GBps"] * 1e9), flops / (ceil["bf16_TFLOPS"] * 1e12)) * 1e6
    return {"shape": name, "us": t_us, "GBps": nbytes / t_us / 1e3,
            "TFLOPS": flops / t_us / 1e6, "roofline_us": roof, "roofline_frac": roof / t_us,
            **extra}


def _decode_shape(timer: Timer, base: dict[str, Any] | None, ceil: dict[str, float],
                  device: torch.device, g: torch.Generator, bsz: int, topk: int,
                  sweep: list[DecodeConfig]) -> dict[str, Any]:
    c = make_decode_case(g, batch=bsz, heads=64, topk=SWA, extra_topk=topk, page_size=256,
                         extra_page_size=64, device=str(device))
    kw = c.kwargs()
    out, lse = sparse_mla_decode(**kw)
    ro, rl = ref_sparse_decode(**kw)
    cmp = compare_decode(out, lse, ro, rl)
    # graph replay must reproduce the eager result bit for bit
    static: dict[str, torch.Tensor] = {}

    def run_ours(cfg: DecodeConfig | None = None) -> None:
        static["out"], static["lse"] = sparse_mla_decode(**kw, config=cfg)

    t_ours = timer.graph(run_ours)
    graph_equal = bool(torch.equal(static["out"], out) and torch.equal(static["lse"], lse))
    nbytes, flops = roofline_bytes_flops(bsz, 64, SWA + topk)
    extra: dict[str, Any] = {"ok": cmp["ok"] and graph_equal, "graph_equal": graph_equal,
                             "out_rel_err": cmp["out_rel_err"],
                             "lse_err": cmp["lse_max_abs_err"]}
    if bsz <= 8:
        extra["us_nosplit"] = timer.graph(lambda: run_ours(DecodeConfig(nsplit=1)))
        extra["split_speedup"] = extra["us_nosplit"] / t_ours
    if bsz in (1, 64) and sweep:
        best = {}
        for cfg in sweep:
            try:
                best[repr(cfg)] = timer.graph(lambda cfg=cfg: run_ours(cfg))
            except Exception as exc:
                best[repr(cfg)] = f"fail: {type(exc).__name__}: {str(exc)[:120]}"
        extra["sweep"] = best
    if base is not None:
        bk = dict(q=c.q, k_cache=c.k_cache, head_dim_v=512, softmax_scale=c.sm_scale,
                  indices=c.indices, attn_sink=c.attn_sink, extra_k_cache=c.extra_k_cache,
                  extra_indices_in_kvcache=c.extra_indices, topk_length=c.topk_length,
                  extra_topk_length=c.extra_topk_length)
        try:
            ob, _ = base["b"](**bk)
            extra["b_out_rel_err"] = float((ob.float() - ro).norm() / ro.norm())
            extra["us_b"] = timer.graph(lambda: base["b"](**bk))
            extra["speedup_b"] = extra["us_b"] / t_ours
        except Exception as exc:
            extra["b_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if bsz <= 64:
            try:
                def run_a() -> Any:
                    return base["a"](c.q, c.k_cache, c.indices, c.topk_length,
                                     c.attn_sink, 512, c.sm_scale, c.extra_k_cache,
                                     c.extra_indices, c.extra_topk_length)
                oa, _ = run_a()
                extra["a_out_rel_err"] = float((oa.float() - ro).norm() / ro.norm())
                extra["us_a_eager"] = timer.eager(run_a, reps=3)
                extra["speedup_a"] = extra["us_a_eager"] / t_ours
            except Exception as exc:
                extra["a_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    row = _decode_row(f"B={bsz} H=64 topk={topk}+{SWA}", t_ours, nbytes, flops, ceil, extra)
    return row


def bench_decode(timer: Timer, base: dict[str, Any] | None, ceil: dict[str, float],
                 device: torch.device, batches: list[int], topks: list[int],
                 sweep: list[DecodeConfig], results: dict[str, Any]) -> None:
    g = torch.Generator().manual_seed(1234)
    rows = []
    for topk in topks:
        for bsz in batches:
            row = _decode_shape(timer, base, ceil, device, g, bsz, topk, sweep)
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    results["decode"] = rows


def _index_pool(device: torch.device, batch: int, n_max: int, page: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    pages_per_row = -(-n_max // page)
    pool = batch * pages_per_row
    g = torch.Generator(device=device).manual_seed(7)
    keys = torch.randn(pool, page, 128, device=device, generator=g, dtype=torch.bfloat16)
    cache = quantize_index_keys(keys)
    perm = torch.randperm(pool, device=device, generator=g).to(torch.int32)
    return cache, perm.view(batch, pages_per_row)


def indexer_point_inputs(used_pt: torch.Tensor, batch: int, page: int, topk: int, ratio: int,
                         ctx: int, max_ctx: int) -> tuple[int, int, torch.Tensor, torch.Tensor,
                                                          torch.Tensor, torch.Tensor, int]:
    """Buffers of one indexer point (also used by ``indexer_sweep``): keys per row ``n``, the
    maximum ``mk``, a page table sized for ``mk`` keys holding the pool's used pages, the
    lengths, the logits workspace, the top-k output, and the bytes the indexer must read."""
    device = used_pt.device
    n, mk = ctx // ratio, max_ctx // ratio
    pt = torch.zeros(batch, -(-mk // page), dtype=torch.int32, device=device)
    width = min(pt.shape[1], used_pt.shape[1])
    pt[:, :width] = used_pt[:, :width]
    lens = torch.full((batch,), n, dtype=torch.int32, device=device)
    ws = torch.empty(batch, mk, dtype=torch.float32, device=device)
    out = torch.empty(batch, topk, dtype=torch.int32, device=device)
    must = batch * n * INDEX_BYTES_PER_TOKEN + batch * (-(-n // page)) * 4
    return n, mk, pt, lens, ws, out, must


def _indexer_point(timer: Timer, base: dict[str, Any] | None, ceil: dict[str, float],
                   setup: dict[str, Any], ctx: int, max_ctx: int) -> dict[str, Any]:
    """Time logits + top-k at one real context under one maximum context."""
    batch, page, topk = setup["batch"], setup["page"], setup["topk"]
    q, w, cache = setup["q"], setup["w"], setup["cache"]
    device = q.device
    n, mk, pt, lens, ws, out, must = indexer_point_inputs(setup["used_pt"], batch, page, topk,
                                                          setup["ratio"], ctx, max_ctx)

    def run_all() -> None:
        indexer_logits(q, cache, w, lens, pt, mk, out=ws)
        indexer_topk(ws, lens, pt, page, topk, out=out)

    def run_logits() -> None:
        indexer_logits(q, cache, w, lens, pt, mk, out=ws)

    t_log = timer.graph(run_logits)
    t_all = timer.graph(run_all)
    graph_equal = timer.replay_matches_eager(run_all, out)
    row: dict[str, Any] = {"ctx": ctx, "keys": n, "max_ctx": max_ctx, "us": t_all,
                           "us_logits": t_log, "us_topk": t_all - t_log, "bytes": must,
                           "bw_frac": must / t_all / 1e3 / ceil["copy_GBps"]}
    sub = slice(0, 4)
    ref = ref_indexer_logits(q[sub], cache, w[sub], lens[sub], pt[sub], n)
    got = ws[sub, :n]
    row["logits_rel_err"] = float((got - ref).norm() / ref.norm())
    tk = check_topk(out[sub], None, got, lens[sub], pt[sub], page, topk)
    row["graph_equal"] = graph_equal
    if setup.get("sweep") and max_ctx == 2**20 and ctx >= 2**17:
        tk_sw: dict[str, float] = {}
        for blk, npg in ((2048, 8), (1024, 16), (4096, 4), (1024, 32), (512, 32)):
            tk_sw[f"block={blk},nprog={npg}"] = timer.graph(
                lambda blk=blk, npg=npg: topk_variant(ws, lens, pt, page, topk, "radix6",
                                                      out=out, block=blk, nprog=npg))
        lg_sw: dict[str, float] = {}
        for bn, nsp in ((64, 8), (128, 8), (64, 16), (128, 16), (64, 32)):
            lg_sw[f"block_n={bn},nsplit={nsp}"] = timer.graph(
                lambda bn=bn, nsp=nsp: indexer_logits(q, cache, w, lens, pt, mk, out=ws,
                                                      nsplit=nsp, block_n=bn))
        row["topk_sweep"], row["logits_sweep"] = tk_sw, lg_sw
    row["ok"] = row["logits_rel_err"] < 2e-3 and tk["ok"] and graph_equal
    if base is not None and setup.get("with_base", False):
        fn = base["fp8_paged_mqa_logits_torch_sm120"]
        tk_fn = base["topk_transform_pytorch_vectorized"]
        q4 = q.unsqueeze(1)
        out_b = torch.empty(batch, topk, dtype=torch.int32, device=device)

        def run_base() -> None:
            lg = fn(q4, cache, w, lens, pt, None, mk, clean_logits=False)
            tk_fn(lg, lens, pt, out_b, page)

        try:
            row["us_base_eager"] = timer.eager(run_base, reps=3)
            row["speedup_base"] = row["us_base_eager"] / t_all
        except Exception as exc:
            row["base_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        torch.cuda.empty_cache()
    return row


def bench_indexer(timer: Timer, base: dict[str, Any] | None, ceil: dict[str, float],
                  device: torch.device, ctxs: list[int], results: dict[str, Any],
                  sweep: bool = False) -> None:
    """Indexer (B=64, 64 heads, C4 keys = ctx / 4, top-512) against context at a 1M maximum."""
    batch, heads, page = 64, 64, 64
    n_max_keys = max(ctxs) // 4
    cache, used_pt = _index_pool(device, batch, n_max_keys, page)
    g = torch.Generator(device=device).manual_seed(11)
    q = (torch.randn(batch, heads, 128, device=device, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(batch, heads, device=device, generator=g) * heads ** -0.5
    setup = {"batch": batch, "page": page, "topk": 512, "ratio": 4, "q": q, "w": w,
             "cache": cache, "used_pt": used_pt, "sweep": sweep}
    rows = []
    for i, ctx in enumerate(ctxs):
        setup["with_base"] = i in (0, len(ctxs) - 1)
        rows.append(_indexer_point(timer, base, ceil, setup, ctx, 2**20))
        print(json.dumps(rows[-1]), flush=True)
    setup["with_base"] = False
    rows.append(_indexer_point(timer, base, ceil, setup, ctxs[0], ctxs[0]))
    print(json.dumps(rows[-1]), flush=True)
    results["indexer"] = rows


def print_tables(res: dict[str, Any]) -> None:
    c = res["ceilings"]
    print(f"\n# {res['device']}  copy {c['copy_GBps']:.0f} GB/s"
          f"  bf16 {c['bf16_TFLOPS']:.0f} TFLOP/s")
    print("| shape | ok | µs | GB/s | TFLOPS | roofline µs | frac | (a) µs | ×a | (b) µs | ×b |"
          " no-split µs | ×split |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res.get("decode", []):
        def f(k: str, fmt: str = ".1f", r: dict[str, Any] = r) -> str:
            v = r.get(k)
            return format(v, fmt) if isinstance(v, float) else "-"
        print(f"| {r['shape']} | {r['ok']} | {r['us']:.1f} | {r['GBps']:.0f} | {r['TFLOPS']:.0f} |"
              f" {r['roofline_us']:.1f} | {r['roofline_frac']:.2f} | {f('us_a_eager', '.0f')} |"
              f" {f('speedup_a')} | {f('us_b')} | {f('speedup_b')} | {f('us_nosplit')} |"
              f" {f('split_speedup')} |")
    print("\n| ctx (keys) | max ctx | ok | µs total | µs logits | µs topk | frac copy BW |"
          " base µs | ×base |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res.get("indexer", []):
        b = r.get("us_base_eager")
        print(f"| {r['ctx']} ({r['keys']}) | {r['max_ctx']} | {r.get('ok', '-')} | {r['us']:.1f} |"
              f" {r['us_logits']:.1f} | {r['us_topk']:.1f} | {r['bw_frac']:.2f} |"
              f" {format(b, '.0f') if b else '-'} |"
              f" {format(r['speedup_base'], '.1f') if b else '-'} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="dsv4_kernels benchmark (one GPU)")
    ap.add_argument("--baselines", help="folder from kernels/tools/fetch_baselines.py")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--batches", default="1,8,64,128")
    ap.add_argument("--topks", default="512,1024")
    ap.add_argument("--ctxs", default="4096,16384,65536,131072")
    ap.add_argument("--sweep", action="store_true",
                    help="also time every variant at batch 1 and 64")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: decode,indexer")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible; the benchmark needs a GPU"}))
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    base = load_baselines(args.baselines) if args.baselines else None
    t0 = time.time()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(device),
                           "torch": torch.__version__}
    import triton

    res["triton"] = triton.__version__
    res["ceilings"] = ceilings(device)
    print(json.dumps(res), flush=True)
    timer = Timer(device)
    sweep = []
    if args.sweep:
        # every variant at its default tiles (a variant the device cannot run records why)
        sweep = [DecodeConfig(block_t=bt, num_stages=ns, variant=v)
                 for v, bt, ns in [("ws", 64, 3), ("wg", 64, 2), ("local", 64, 2),
                                   ("staged", 64, 2), ("gp", 32, 3), ("full", 64, 1),
                                   ("dsplit", 64, 2), ("dsplit", 32, 2), ("pf", 16, 1)]]
    skip = set(args.skip.split(","))
    if "decode" not in skip:
        bench_decode(timer, base, res["ceilings"], device,
                     [int(x) for x in args.batches.split(",")],
                     [int(x) for x in args.topks.split(",")], sweep, res)
    if "indexer" not in skip:
        bench_indexer(timer, base, res["ceilings"], device,
                      [int(x) for x in args.ctxs.split(",")], res, sweep=args.sweep)
    res["wall_s"] = time.time() - t0
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1))
    print_tables(res)
    bad = [r for r in res.get("decode", []) + res.get("indexer", []) if r.get("ok") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
