"""Side by side: the mHC pre mix GEMM as SGLang 0.5.23 runs it on sm_120, and on bf16 tensor cores.

Run on a GPU with the sm_120-like build (issue 25; Triton lowers ``tl.dot`` to ``mma.sync`` for
sm_89 as it does for sm_120)::

    TRITON_OVERRIDE_ARCH=sm89 PYTHONPATH=kernels python kernels/tools/mhc_pre_bench.py --out DIR

What is timed, per decode row count T (1, 8, 64), shapes of DeepSeek-V4-Flash (hidden 4096,
hc_mult 4, so ``[T, 16384] x [24, 16384]^T``):

* ``sgl_fma``: a Triton copy of the *structure* of SGLang's sm_120 path for T <= 32
  (``mhc_fused_post_pre_fma_tilelang``, TileLang, not runnable here): one token per program,
  FP32 ``fn`` re-read for every token, scalar FMA, post fused, SGLang's tile/split choice.
* ``sgl_tile``: the structure of its T > 32 path (``mhc_post_tilelang`` then
  ``mhc_pre_gemm_sqrsum_tilelang``): a post kernel, then one 32-row program over all of K with an
  FP32 weight (``tl.dot`` in tf32 here; TileLang's FP32 ``T.gemm`` precision is unconfirmed).
* ``torch_f32`` / ``torch_bf16``: the layer-0 ``hc_pre_torch_impl`` ``F.linear`` in FP32 and the
  same product in bf16 (cuBLAS of this machine, not of sm_120: a lead, not a proxy).
* ``hc_head``: a copy of SGLang's ``_hc_head_kernel`` (FP32, once per step).
* ``ours``: ``dsv4_kernels.mhc_pre_gemm`` (post + hi/lo bf16 ``mma`` + split-K partials).

Times are µs per call from CUDA-graph replays of 24 calls on 24 distinct data sets (about
110 MB of weights, so L2 holds none of a call's weight when it starts; decode runs in graphs,
so no launch gaps are counted). Errors are ``|mixes - ref| / |ref|`` against a float64
reference of the same residual; the batch-invariance check compares a token's partials bit
for bit across batches; the graph check replays a captured launch. Prints a table last;
``--out`` gets the JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch
import triton
import triton.language as tl

from dsv4_kernels.mhc_pre_gemm import (
    mhc_post_pre_partials,
    post_pre_reference,
)

H = 4096
HC = 4
N = 24


@triton.jit
def _sgl_fma_kernel(y_ptr, res_ptr, post_ptr, comb_ptr, fn_ptr, res_out_ptr, mix_ptr, sq_ptr,
                    n_rows, H: tl.constexpr, N: tl.constexpr, TILE_N: tl.constexpr,
                    SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    s = tl.program_id(2)
    HS: tl.constexpr = H // SPLITS
    KT: tl.constexpr = 4 * H
    pb = post_ptr + t * 4
    cb = comb_ptr + t * 16
    acc0 = tl.zeros([BLOCK], tl.float32)
    acc1 = tl.zeros([BLOCK], tl.float32)
    acc2 = tl.zeros([BLOCK], tl.float32)
    sq = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, HS, BLOCK):
        h = s * HS + k0 + tl.arange(0, BLOCK)
        yv = tl.load(y_ptr + t * H + h).to(tl.float32)
        r0 = tl.load(res_ptr + t * KT + 0 * H + h).to(tl.float32)
        r1 = tl.load(res_ptr + t * KT + 1 * H + h).to(tl.float32)
        r2 = tl.load(res_ptr + t * KT + 2 * H + h).to(tl.float32)
        r3 = tl.load(res_ptr + t * KT + 3 * H + h).to(tl.float32)
        for j in tl.static_range(4):
            cj = tl.load(pb + j) * yv + tl.load(cb + j) * r0 + tl.load(cb + 4 + j) * r1 \
                + tl.load(cb + 8 + j) * r2 + tl.load(cb + 12 + j) * r3
            cj = cj.to(tl.bfloat16)
            if tile == 0:
                tl.store(res_out_ptr + t * KT + j * H + h, cj)
            cf = cj.to(tl.float32)
            sq += cf * cf
            o0 = tile * TILE_N
            acc0 += tl.load(fn_ptr + o0 * KT + j * H + h) * cf
            if TILE_N > 1:
                acc1 += tl.load(fn_ptr + (o0 + 1) * KT + j * H + h, mask=(h * 0 + o0 + 1) < N,
                                other=0.0) * cf
            if TILE_N > 2:
                acc2 += tl.load(fn_ptr + (o0 + 2) * KT + j * H + h, mask=(h * 0 + o0 + 2) < N,
                                other=0.0) * cf
    base = mix_ptr + s * n_rows * N + t * N + tile * TILE_N
    tl.store(base, tl.sum(acc0))
    if TILE_N > 1:  # noqa: SIM102 (a constexpr test around a runtime one)
        if tile * TILE_N + 1 < N:
            tl.store(base + 1, tl.sum(acc1))
    if TILE_N > 2:  # noqa: SIM102
        if tile * TILE_N + 2 < N:
            tl.store(base + 2, tl.sum(acc2))
    if tile == 0:
        tl.store(sq_ptr + s * n_rows + t, tl.sum(sq))


def sgl_fma(y, res, post, comb, fn):
    t = res.shape[0]
    tile_n, splits = (2, 8) if t < 8 else (3, 4)  # mhc.py mhc_fused_post_pre, T <= 32
    out = torch.empty_like(res)
    mix = torch.empty(splits, t, N, device=res.device)
    sq = torch.empty(splits, t, device=res.device)
    grid = (t, triton.cdiv(N, tile_n), splits)
    _sgl_fma_kernel[grid](y, res, post, comb, fn, out, mix, sq, t, H=H, N=N, TILE_N=tile_n,
                          SPLITS=splits, BLOCK=256, num_warps=8)
    return out, mix, sq


@triton.jit
def _sgl_post_kernel(y_ptr, res_ptr, post_ptr, comb_ptr, out_ptr, H: tl.constexpr,
                     BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    KT: tl.constexpr = 4 * H
    for k0 in range(0, H, BLOCK):
        h = k0 + tl.arange(0, BLOCK)
        yv = tl.load(y_ptr + t * H + h).to(tl.float32)
        r0 = tl.load(res_ptr + t * KT + 0 * H + h).to(tl.float32)
        r1 = tl.load(res_ptr + t * KT + 1 * H + h).to(tl.float32)
        r2 = tl.load(res_ptr + t * KT + 2 * H + h).to(tl.float32)
        r3 = tl.load(res_ptr + t * KT + 3 * H + h).to(tl.float32)
        for j in tl.static_range(4):
            cj = tl.load(post_ptr + t * 4 + j) * yv + tl.load(comb_ptr + t * 16 + j) * r0 \
                + tl.load(comb_ptr + t * 16 + 4 + j) * r1 \
                + tl.load(comb_ptr + t * 16 + 8 + j) * r2 \
                + tl.load(comb_ptr + t * 16 + 12 + j) * r3
            tl.store(out_ptr + t * KT + j * H + h, cj.to(tl.bfloat16))


@triton.jit
def _sgl_gemm_kernel(x_ptr, fn_ptr, mix_ptr, sq_ptr, n_rows, K: tl.constexpr, N: tl.constexpr,
                     BM: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BM + tl.arange(0, BM)
    rm = rows < n_rows
    cols = tl.arange(0, 32)
    acc = tl.zeros([BM, 32], tl.float32)
    sq = tl.zeros([BM], tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + kk[None, :], mask=rm[:, None],
                    other=0.0).to(tl.float32)
        sq += tl.sum(x * x, axis=1)
        w = tl.load(fn_ptr + cols[None, :] * K + kk[:, None], mask=cols[None, :] < N, other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PREC)
    tl.store(mix_ptr + rows[:, None] * N + cols[None, :], acc,
             mask=rm[:, None] & (cols[None, :] < N))
    tl.store(sq_ptr + rows, sq, mask=rm)


def sgl_tile(y, res, post, comb, fn, prec="tf32"):
    t = res.shape[0]
    out = torch.empty_like(res)
    _sgl_post_kernel[(t,)](y, res, post, comb, out, H=H, BLOCK=1024, num_warps=4)
    mix = torch.empty(1, t, N, device=res.device)
    sq = torch.empty(1, t, device=res.device)
    _sgl_gemm_kernel[(triton.cdiv(t, 32),)](out, fn, mix, sq, t, K=HC * H, N=N, BM=32, BK=64,
                                            PREC=prec, num_warps=4)
    return out, mix, sq


@triton.jit
def _hc_head_kernel(x_ptr, fn_ptr, scale_ptr, base_ptr, y_ptr, hidden_size: tl.constexpr,
                    HC_MULT: tl.constexpr, K_TOTAL: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_D: tl.constexpr, norm_eps: tl.constexpr, hc_eps: tl.constexpr):
    # copied from sglang/kernels/ops/layernorm/mhc_head.py (SGLang 0.5.23), unchanged math
    pid = tl.program_id(0).to(tl.int64)
    sumsq = tl.zeros((), dtype=tl.float32)
    mix = tl.zeros((HC_MULT,), dtype=tl.float32)
    x_row = x_ptr + pid * K_TOTAL
    m_idx = tl.arange(0, HC_MULT)
    for k_off in tl.range(0, K_TOTAL, BLOCK_K):
        k_offs = k_off + tl.arange(0, BLOCK_K)
        k_mask = k_offs < K_TOTAL
        x_tile = tl.load(x_row + k_offs, mask=k_mask, other=0.0).to(tl.float32)
        sumsq += tl.sum(x_tile * x_tile, axis=0)
        fn_offs = m_idx[:, None] * K_TOTAL + k_offs[None, :]
        fn_mask = (m_idx[:, None] < HC_MULT) & k_mask[None, :]
        fn_tile = tl.load(fn_ptr + fn_offs, mask=fn_mask, other=0.0)
        mix += tl.sum(fn_tile * x_tile[None, :], axis=1)
    rsqrt = tl.rsqrt(sumsq / K_TOTAL + norm_eps)
    scale_v = tl.load(scale_ptr).to(tl.float32)
    base_v = tl.load(base_ptr + m_idx).to(tl.float32)
    pre = tl.sigmoid(mix * rsqrt * scale_v + base_v) + hc_eps
    y_row = y_ptr + pid * hidden_size
    for d_off in tl.range(0, hidden_size, BLOCK_D):
        d_offs = d_off + tl.arange(0, BLOCK_D)
        d_mask = d_offs < hidden_size
        x_offs = m_idx[:, None] * hidden_size + d_offs[None, :]
        x_mask = (m_idx[:, None] < HC_MULT) & d_mask[None, :]
        x_block = tl.load(x_row + x_offs, mask=x_mask, other=0.0).to(tl.float32)
        y_block = tl.sum(pre[:, None] * x_block, axis=0)
        tl.store(y_row + d_offs, y_block.to(y_ptr.dtype.element_ty), mask=d_mask)


def hc_head(x, fn4, scale, base):
    y = torch.empty(x.shape[0], H, dtype=x.dtype, device=x.device)
    _hc_head_kernel[(x.shape[0],)](x, fn4, scale, base, y, hidden_size=H, HC_MULT=4,
                                   K_TOTAL=4 * H, BLOCK_K=512, BLOCK_D=512, norm_eps=1e-6,
                                   hc_eps=1e-6, num_warps=4)
    return y


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def make(t: int, g: torch.Generator, dev: str):
    res = torch.randn(t, HC, H, generator=g).to(dev, torch.bfloat16)
    y = torch.randn(t, H, generator=g).to(dev, torch.bfloat16)
    post = (2 * torch.rand(t, HC, generator=g)).to(dev)
    comb = torch.softmax(torch.randn(t, HC, HC, generator=g), -1).to(dev)
    return y, res, post, comb


OURS = {  # name: keyword arguments of mhc_post_pre_partials (the default is the shipped one)
    "ours hi+lo padded s64 w2 (default)": {},
    "ours hi+lo packed s64 w2": {"packed": True},
    "ours hi+lo packed s32 w2": {"packed": True, "splits": 32},
    "ours hi+lo packed s64 w2 BK16": {"packed": True, "block_k": 16},
    "ours hi+lo padded s64 w4": {"num_warps": 4},
    "ours hi only padded s64 w2": {"use_lo": False},
}
SETS = 24  # distinct data sets per timed graph: ~110 MB of weights, so each call finds L2 cold


def graph_us(calls) -> float:
    """Median µs per call of one CUDA graph that runs ``calls`` (each on its own data) in turn."""
    for c in calls:  # compile, split weights, warm up outside the capture
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def run_rows(t, g, dev) -> list[dict]:
    """Time (graph replays, cold weights) and check every variant at T rows."""
    data = []
    for _ in range(SETS):
        fn = (torch.randn(N, HC * H, generator=g) * 0.02).to(dev)  # scale unconfirmed
        data.append((fn, *make(t, g, dev)))
    fn, y, res, post, comb = data[0]
    ref_res, ref_mix, ref_sq = post_pre_reference(res, fn, y, post, comb)
    _, r_mix, _ = post_pre_reference(res, fn)
    rows_out: list[dict] = []

    def record(name, one, check):
        us = graph_us([functools.partial(one, *d) for d in data])
        err = err_sq = mism = None
        if check == "partials":
            out, mix, sq = one(*data[0])
            err, err_sq = rel(mix.sum(0), ref_mix), rel(sq.sum(0), ref_sq)
            mism = float((out != ref_res).float().mean())
        elif check == "gemm":
            err = rel(one(*data[0]), r_mix)
        rows_out.append({"T": t, "variant": name, "us": us, "rel_err_mixes": err,
                         "rel_err_sqrsum": err_sq, "residual_mismatch_frac": mism})

    record("sgl_fma (fp32 FMA, T<=32 path)",
           lambda f, y, r, p, c: sgl_fma(y, r, p, c, f), "partials")
    record("sgl_tile tf32 (T>32 path)",
           lambda f, y, r, p, c: sgl_tile(y, r, p, c, f, "tf32"), "partials")
    record("sgl_tile ieee-fp32 (T>32 path)",
           lambda f, y, r, p, c: sgl_tile(y, r, p, c, f, "ieee"), "partials")
    for name, kw in OURS.items():
        record(name, lambda f, y, r, p, c, kw=kw: mhc_post_pre_partials(r, f, y, p, c, **kw),
               "partials")
    record("torch F.linear fp32 (layer-0 hc_pre)",
           lambda f, y, r, p, c: torch.nn.functional.linear(r.flatten(1).float(), f), "gemm")
    halves = {id(d[0]): d[0].bfloat16() for d in data}
    record("torch mm bf16->fp32 (same product)",
           lambda f, y, r, p, c: torch.mm(r.flatten(1), halves[id(f)].t(),
                                          out_dtype=torch.float32), "gemm")
    heads = {id(d[0]): d[0][:4].contiguous() for d in data}
    scale = torch.rand(1, generator=g).to(dev)
    base = torch.randn(4, generator=g).to(dev)
    record("sgl hc_head fp32 (once per step)",
           lambda f, y, r, p, c: hc_head(r, heads[id(f)], scale, base), None)
    return rows_out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--rows", default="1,8,32,64")
    args = ap.parse_args(argv)
    dev = "cuda"
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    fn = (torch.randn(N, HC * H, generator=g) * 0.02).to(dev)  # checkpoint-like scale (unconfirmed)
    rows_out: list[dict] = []
    facts: dict[str, object] = {"device": torch.cuda.get_device_name(),
                                "override_arch": os.environ.get("TRITON_OVERRIDE_ARCH"),
                                "triton": triton.__version__, "torch": torch.__version__}
    for t in [int(x) for x in args.rows.split(",")]:
        rows_out += run_rows(t, g, dev)
    # batch invariance: token rows of a 64-row batch against the same rows run alone / in 8
    y, res, post, comb = make(64, g, dev)
    full = mhc_post_pre_partials(res, fn, y, post, comb)
    inv = {}
    for t in (1, 8, 17, 33):
        part = mhc_post_pre_partials(res[:t], fn, y[:t], post[:t], comb[:t])
        inv[t] = bool(torch.equal(part[1], full[1][:, :t]) and torch.equal(part[2], full[2][:, :t])
                      and torch.equal(part[0], full[0][:t]))
    facts["batch_invariant_bitwise"] = inv
    # CUDA-graph capture and replay
    y8, res8, post8, comb8 = make(8, g, dev)
    eager = mhc_post_pre_partials(res8, fn, y8, post8, comb8)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mhc_post_pre_partials(res8, fn, y8, post8, comb8)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mhc_post_pre_partials(res8, fn, y8, post8, comb8)
    for o in captured:
        o.fill_(float("nan")) if o.is_floating_point() else None
    graph.replay()
    torch.cuda.synchronize()
    same = [torch.equal(a, b) for a, b in zip(eager, captured, strict=True)]
    facts["graph_replay_equal"] = all(same)
    report = {"facts": facts, "rows": rows_out}
    if args.out:
        with open(os.path.join(args.out, "mhc_pre_bench.json"), "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(facts))
    print(f"{'T':>3} {'variant':42} {'us':>8} {'err mixes':>10} {'err sq':>9} res!=")
    for r in rows_out:
        e = "-" if r["rel_err_mixes"] is None else f"{r['rel_err_mixes']:.2e}"
        q = "-" if r["rel_err_sqrsum"] is None else f"{r['rel_err_sqrsum']:.1e}"
        b = "-" if r["residual_mismatch_frac"] is None else f"{r['residual_mismatch_frac']:.1e}"
        print(f"{r['T']:>3} {r['variant']:42} {r['us']:8.2f} {e:>10} {q:>9} {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
