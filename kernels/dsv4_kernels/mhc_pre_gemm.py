"""The mHC "pre" mix GEMM of DeepSeek-V4 on bf16 tensor cores (issue 25).

Each hyper-connection of DeepSeek-V4 (two per layer, ``hc_mult = 4`` residual streams) starts
with ``mixes = F.linear(R.flatten(1).float(), fn)`` and ``sqrsum = (R.float() ** 2).sum()``: a
``[T, 16384] x [24, 16384]^T`` GEMM whose weight ``fn`` is FP32. SGLang 0.5.23 runs it on sm_120
at the sublayer boundary inside ``sglang.kernels.ops.layernorm.mhc.mhc_fused_post_pre``: a
scalar-FMA TileLang kernel (one token per CTA, ``fn`` re-read for every token) up to 32 rows,
one 32-row CTA over all of K beyond (docs/fp32-gemms-sglang-0.5.23.md has the table).

Here the residual rows are bf16 already (SGLang rounds the post-mapped residual to bf16 before
the GEMM), so only ``fn`` carries more than bf16 precision. It is split once into two bf16
halves, ``fn = hi + lo`` with ``hi = bf16(fn)`` and ``lo = bf16(fn - hi)``; a product of two
bf16 numbers is exact in the FP32 accumulator, so ``x @ hi + x @ lo`` keeps ``fn`` to about
2^-16 relative (~FP32 for this use) while both products run on tensor cores (``mma.sync``
bf16 on sm_120). The kernel also applies the pending mHC *post* of the previous sublayer,
``R'[j] = post[j] * y + sum_k comb[k, j] * R[k]`` (rounded to bf16 as SGLang does), writes
``R'`` and emits split-K partials ``[SPLIT, T, 24]`` and ``[SPLIT, T]`` in the layout SGLang's
``mhc_pre_big_fuse*`` finalization reads.

Batch invariance: the tile shape, the split count and the K order are constants, and each
output row depends only on its own input row, so a token gets bit-identical partials whatever
the batch it is in (checked on the GPU by ``tools/mhc_pre_bench.py`` and the self-test).
Capture-safe: a fixed grid per row count, no host synchronisation; the weight split is made
eagerly on first use and cached per weight version.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import interpreting

HC = 4  # DeepSeek-V4 hc_mult; the kernel is written for four streams
N_PAD = 32  # 24 mix outputs padded to a tensor-core-friendly 32
BLOCK_M = 16  # rows per program (the smallest bf16 mma M)
SPLIT = 64  # split-K programs per row block (fixed: batch invariance; H200, issue 25)
WARPS = 2  # H200 (issue 25): 6.4 µs at 64 rows against 7.9 with 4 warps, equal below
PACKED = False  # weight halves stored [4H, 24] (packed) or padded to [4H, 32]


@triton.jit
def _round_bf16(v, EMULATE: tl.constexpr):
    """FP32 -> bf16, round to nearest even. The CPU interpreter truncates on ``.to``, so there
    the rounding is done on the bits (finite inputs) before the then-exact conversion."""
    if EMULATE:
        b = v.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        v = b.to(tl.float32, bitcast=True)
    return v.to(tl.bfloat16)


@triton.jit(do_not_specialize=["n_rows"])
def _post_pre_kernel(
    y_ptr, res_ptr, post_ptr, comb_ptr, fnh_ptr, fnl_ptr, res_out_ptr, mix_ptr, sq_ptr,
    n_rows,
    H: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, WS: tl.constexpr, SPLITS: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr, DO_POST: tl.constexpr, USE_LO: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < n_rows
    r64 = rows.to(tl.int64)
    cols = tl.arange(0, NP)
    HS: tl.constexpr = H // SPLITS
    KT: tl.constexpr = 4 * H  # flattened K of the GEMM: stream-major, then hidden

    acc = tl.zeros([BM, NP], dtype=tl.float32)
    sq = tl.zeros([BM], dtype=tl.float32)
    if DO_POST:
        pb = post_ptr + r64 * 4
        p0 = tl.load(pb + 0, mask=rmask, other=0.0)[:, None]
        p1 = tl.load(pb + 1, mask=rmask, other=0.0)[:, None]
        p2 = tl.load(pb + 2, mask=rmask, other=0.0)[:, None]
        p3 = tl.load(pb + 3, mask=rmask, other=0.0)[:, None]
        cb = comb_ptr + r64 * 16  # comb[m, k, j]: old stream k -> new stream j
        c00 = tl.load(cb + 0, mask=rmask, other=0.0)[:, None]
        c01 = tl.load(cb + 1, mask=rmask, other=0.0)[:, None]
        c02 = tl.load(cb + 2, mask=rmask, other=0.0)[:, None]
        c03 = tl.load(cb + 3, mask=rmask, other=0.0)[:, None]
        c10 = tl.load(cb + 4, mask=rmask, other=0.0)[:, None]
        c11 = tl.load(cb + 5, mask=rmask, other=0.0)[:, None]
        c12 = tl.load(cb + 6, mask=rmask, other=0.0)[:, None]
        c13 = tl.load(cb + 7, mask=rmask, other=0.0)[:, None]
        c20 = tl.load(cb + 8, mask=rmask, other=0.0)[:, None]
        c21 = tl.load(cb + 9, mask=rmask, other=0.0)[:, None]
        c22 = tl.load(cb + 10, mask=rmask, other=0.0)[:, None]
        c23 = tl.load(cb + 11, mask=rmask, other=0.0)[:, None]
        c30 = tl.load(cb + 12, mask=rmask, other=0.0)[:, None]
        c31 = tl.load(cb + 13, mask=rmask, other=0.0)[:, None]
        c32 = tl.load(cb + 14, mask=rmask, other=0.0)[:, None]
        c33 = tl.load(cb + 15, mask=rmask, other=0.0)[:, None]

    for kk in tl.range(0, HS, BK):
        hk = pid_s * HS + kk + tl.arange(0, BK)
        m2 = rmask[:, None]
        rb = res_ptr + r64[:, None] * KT + hk[None, :]
        r0 = tl.load(rb + 0 * H, mask=m2, other=0.0)
        r1 = tl.load(rb + 1 * H, mask=m2, other=0.0)
        r2 = tl.load(rb + 2 * H, mask=m2, other=0.0)
        r3 = tl.load(rb + 3 * H, mask=m2, other=0.0)
        if DO_POST:
            yv = tl.load(y_ptr + r64[:, None] * H + hk[None, :], mask=m2, other=0.0)
            yv = yv.to(tl.float32)
            f0 = r0.to(tl.float32)
            f1 = r1.to(tl.float32)
            f2 = r2.to(tl.float32)
            f3 = r3.to(tl.float32)
            # SGLang's order: post * y first, then old streams 0..3 (mhc.py, FMA kernel step A)
            a0 = _round_bf16(p0 * yv + c00 * f0 + c10 * f1 + c20 * f2 + c30 * f3, DOT_F32)
            a1 = _round_bf16(p1 * yv + c01 * f0 + c11 * f1 + c21 * f2 + c31 * f3, DOT_F32)
            a2 = _round_bf16(p2 * yv + c02 * f0 + c12 * f1 + c22 * f2 + c32 * f3, DOT_F32)
            a3 = _round_bf16(p3 * yv + c03 * f0 + c13 * f1 + c23 * f2 + c33 * f3, DOT_F32)
            ob = res_out_ptr + r64[:, None] * KT + hk[None, :]
            tl.store(ob + 0 * H, a0, mask=m2)
            tl.store(ob + 1 * H, a1, mask=m2)
            tl.store(ob + 2 * H, a2, mask=m2)
            tl.store(ob + 3 * H, a3, mask=m2)
        else:
            a0 = r0.to(tl.bfloat16)
            a1 = r1.to(tl.bfloat16)
            a2 = r2.to(tl.bfloat16)
            a3 = r3.to(tl.bfloat16)
        g0 = a0.to(tl.float32)
        g1 = a1.to(tl.float32)
        g2 = a2.to(tl.float32)
        g3 = a3.to(tl.float32)
        sq += tl.sum(g0 * g0 + g1 * g1 + g2 * g2 + g3 * g3, axis=1)
        # weights stored K-major, [4H, WS] bf16 (WS = N packed, or NP padded with zeros): a
        # [BK, WS] tile is one contiguous block; columns past N read as zeros
        wb = hk[:, None] * WS + cols[None, :]
        wm = (cols[None, :] < N) & (hk[:, None] >= 0)
        w0 = tl.load(fnh_ptr + wb + 0 * H * WS, mask=wm, other=0.0)
        w1 = tl.load(fnh_ptr + wb + 1 * H * WS, mask=wm, other=0.0)
        w2 = tl.load(fnh_ptr + wb + 2 * H * WS, mask=wm, other=0.0)
        w3 = tl.load(fnh_ptr + wb + 3 * H * WS, mask=wm, other=0.0)
        if DOT_F32:
            acc = tl.dot(g0, w0.to(tl.float32), acc, input_precision="ieee")
            acc = tl.dot(g1, w1.to(tl.float32), acc, input_precision="ieee")
            acc = tl.dot(g2, w2.to(tl.float32), acc, input_precision="ieee")
            acc = tl.dot(g3, w3.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a0, w0, acc)
            acc = tl.dot(a1, w1, acc)
            acc = tl.dot(a2, w2, acc)
            acc = tl.dot(a3, w3, acc)
        if USE_LO:
            v0 = tl.load(fnl_ptr + wb + 0 * H * WS, mask=wm, other=0.0)
            v1 = tl.load(fnl_ptr + wb + 1 * H * WS, mask=wm, other=0.0)
            v2 = tl.load(fnl_ptr + wb + 2 * H * WS, mask=wm, other=0.0)
            v3 = tl.load(fnl_ptr + wb + 3 * H * WS, mask=wm, other=0.0)
            if DOT_F32:
                acc = tl.dot(g0, v0.to(tl.float32), acc, input_precision="ieee")
                acc = tl.dot(g1, v1.to(tl.float32), acc, input_precision="ieee")
                acc = tl.dot(g2, v2.to(tl.float32), acc, input_precision="ieee")
                acc = tl.dot(g3, v3.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a0, v0, acc)
                acc = tl.dot(a1, v1, acc)
                acc = tl.dot(a2, v2, acc)
                acc = tl.dot(a3, v3, acc)

    mp = mix_ptr + pid_s.to(tl.int64) * n_rows * N + r64[:, None] * N + cols[None, :]
    tl.store(mp, acc, mask=rmask[:, None] & (cols[None, :] < N))
    tl.store(sq_ptr + pid_s.to(tl.int64) * n_rows + r64, sq, mask=rmask)


_CACHE_ATTR = "_dsv4_kernels_bf16_split"


def split_fn_bf16(fn: torch.Tensor, packed: bool = PACKED) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn [24, 4H]`` FP32 as two bf16 halves ``hi + lo``, each stored transposed, K-major:
    ``[4H, 24]`` packed, or ``[4H, 32]`` with the columns padded with zeros.

    Cached on the weight tensor itself (as SGLang caches its own bf16xfp32 weight split), keyed
    by its storage and version: an in-place weight update bumps the version and the next call
    splits again. A cache keyed by address alone would hand a freed weight's split to a new
    tensor at the same address (seen on the H200 in issue 25).
    """
    key = (fn.data_ptr(), tuple(fn.shape), fn._version, packed)
    got = getattr(fn, _CACHE_ATTR, None)
    if got is not None and got[0] == key:
        return got[1], got[2]
    n, k = fn.shape
    f = fn.detach().float()
    cols = n if packed else N_PAD
    hi = torch.zeros(k, cols, dtype=torch.bfloat16, device=fn.device)
    lo = torch.zeros(k, cols, dtype=torch.bfloat16, device=fn.device)
    hi[:, :n] = f.t().to(torch.bfloat16)
    lo[:, :n] = (f.t() - hi[:, :n].float()).to(torch.bfloat16)
    setattr(fn, _CACHE_ATTR, (key, hi, lo))
    return hi, lo


def mhc_post_pre_partials(
    residual: torch.Tensor,
    fn: torch.Tensor,
    y: torch.Tensor | None = None,
    post: torch.Tensor | None = None,
    comb: torch.Tensor | None = None,
    *,
    splits: int = SPLIT,
    use_lo: bool = True,
    block_k: int | None = None,
    block_m: int = BLOCK_M,
    num_warps: int = WARPS,
    num_stages: int = 3,
    packed: bool = PACKED,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Post-map the residual (when ``y``/``post``/``comb`` are given) and take the mix partials.

    ``residual [T, 4, H]`` bf16, ``fn [24, 4H]`` FP32, ``y [T, H]`` bf16, ``post [T, 4]`` and
    ``comb [T, 4, 4]`` FP32. Returns ``(residual_out [T, 4, H] bf16, mixes [splits, T, 24] FP32,
    sqrsum [splits, T] FP32)``; summing the partials over the first axis gives
    ``F.linear(residual_out.flatten(1).float(), fn)`` and its row sums of squares.
    """
    t, hc, h = residual.shape
    n = fn.shape[0]
    if hc != HC or fn.shape[1] != hc * h or n > N_PAD:
        raise ValueError(f"mHC pre GEMM wants residual [T, 4, H] and fn [<=32, 4H]; got "
                         f"{tuple(residual.shape)} and {tuple(fn.shape)}")
    if h % splits:
        raise ValueError(f"hidden size {h} is not a multiple of splits {splits}")
    hs = h // splits
    bk = block_k or min(hs, 32)
    if hs % bk or bk & (bk - 1) or bk < 16:
        raise ValueError(f"split width {hs} needs a power-of-two block_k >= 16 that divides it")
    hi, lo = split_fn_bf16(fn, packed)
    do_post = y is not None
    residual = residual.contiguous()
    res_out = torch.empty_like(residual) if do_post else residual
    mixes = torch.empty(splits, t, n, dtype=torch.float32, device=residual.device)
    sqrsum = torch.empty(splits, t, dtype=torch.float32, device=residual.device)
    if t == 0:
        return res_out, mixes, sqrsum
    if do_post:
        assert post is not None and comb is not None
        y_ = y.contiguous()
        post_ = post.reshape(t, hc).float().contiguous()
        comb_ = comb.reshape(t, hc, hc).float().contiguous()
    else:
        y_, post_, comb_ = residual, mixes, mixes  # unused pointers
    grid = (triton.cdiv(t, block_m), splits)
    _post_pre_kernel[grid](
        y_, residual, post_, comb_, hi, lo, res_out, mixes, sqrsum, t,
        H=h, N=n, NP=N_PAD, WS=hi.shape[1], SPLITS=splits, BM=block_m, BK=bk, DO_POST=do_post,
        USE_LO=use_lo, DOT_F32=interpreting(), num_warps=num_warps, num_stages=num_stages,
    )
    return res_out, mixes, sqrsum


def post_pre_reference(
    residual: torch.Tensor,
    fn: torch.Tensor,
    y: torch.Tensor | None = None,
    post: torch.Tensor | None = None,
    comb: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's math in FP32 (``_mhc_post_torch`` then ``hc_pre_torch_impl``'s GEMM):
    ``(residual_out bf16, mixes [T, 24] FP32, sqrsum [T] FP32)``, the GEMM done in float64."""
    if y is not None:
        assert post is not None and comb is not None
        t, hc, _ = residual.shape
        out = post.reshape(t, hc, 1).float() * y.float().unsqueeze(1) + (
            comb.reshape(t, hc, hc).float().unsqueeze(-1) * residual.float().unsqueeze(2)
        ).sum(dim=1)
        residual = out.to(torch.bfloat16)
    x = residual.flatten(1).double()
    mixes = (x @ fn.double().t()).float()
    sqrsum = (x * x).sum(-1).float()
    return residual, mixes, sqrsum


def residual_close(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float]:
    """The post-mapped bf16 residual against the FP32-then-bf16 reference: equal up to one bf16
    rounding of a slightly different FP32 sum (the kernel's order and FMA contraction differ from
    torch's), i.e. ``|out - ref| <= 2^-7 |ref| + 1e-4``; the absolute term covers sums that cancel
    to near zero, where a few FP32 ulps of the terms are many bf16 ulps of the result. Returns
    (ok, the worst ratio of difference to tolerance)."""
    d = (out.float() - ref.float()).abs()
    tol = ref.float().abs() * 2.0**-7 + 1e-4
    worst = float((d / tol).max()) if d.numel() else 0.0
    return worst <= 1.0, worst
