"""Drop-in for SGLang 0.5.23's ``sglang.kernels.ops.layernorm.mhc.mhc_fused_post_pre`` (issue 25).

On sm_120 every DeepSeek-V4 sublayer boundary but the first of a step reaches that function
(``deepseek_v4_fused_mhc.apply_mhc_post_pre_boundary``, through ``deepseek_v4.get_mhc_ops``,
which imports the module attribute on its first call). There it applies the previous
sublayer's mHC post and takes the next pre's mix GEMM in FP32: scalar FMA per token up to 32
rows, one 32-row TileLang CTA over all of K beyond (docs/fp32-gemms-sglang-0.5.23.md).

This replacement keeps the parameter list, the shapes, dtypes and buffers it returns, and
SGLang's own numerically sensitive finalization (``mhc_pre_big_fuse_tilelang`` or
``..._with_norm_tilelang``: sigmoid gates, Sinkhorn, the stream collapse and the optional norm),
and swaps only the post + GEMM + square-sum stage for ``mhc_pre_gemm.mhc_post_pre_partials``
(bf16 tensor cores, weight split hi + lo, fixed split-K: batch-invariant, capture-safe). Inputs it
was not written for (``hc_mult != 4``, other dtypes, a hidden size the split does not divide,
zero rows) go to the original unchanged. The hook installs it only when
``DSV4_KERNELS_BF16_GEMMS=1`` (profile ``kernels.bf16_gemms``) as well as
``DSV4_KERNELS_SGLANG=1``.
"""

from __future__ import annotations

from typing import Any

import torch

from ._runtime import interpreting
from .mhc_pre_gemm import HC, SPLIT, mhc_post_pre_partials

# Parameter list of the 0.5.23 function; the hook refuses to patch if it differs.
MHC_PARAMS = (
    "x", "residual", "post_layer_mix", "comb_res_mix", "fn", "hc_scale", "hc_base", "rms_eps",
    "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult_value", "sinkhorn_repeat", "n_splits",
    "tile_n", "norm_weight", "norm_eps",
)


def _original() -> Any:
    orig = getattr(mhc_fused_post_pre, "__dsv4_original__", None)
    if orig is None:
        raise RuntimeError("dsv4_kernels.sglang_mhc.mhc_fused_post_pre runs only in place of "
                           "SGLang's function (installed by dsv4_kernels.sglang_hook)")
    return orig


def handles(x: torch.Tensor, residual: torch.Tensor, fn: torch.Tensor) -> bool:
    """Whether the bf16 path takes these inputs (else the original runs)."""
    hidden = residual.shape[-1]
    return (
        residual.dim() >= 3 and residual.shape[-2] == HC
        and residual.dtype == torch.bfloat16 and x.dtype == torch.bfloat16
        and fn.dtype == torch.float32 and tuple(fn.shape) == (HC * (2 + HC), HC * hidden)
        and hidden % SPLIT == 0 and (hidden // SPLIT) % 32 == 0
        and residual.numel() > 0 and (residual.is_cuda or interpreting())
    )


def mhc_fused_post_pre(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    n_splits: int = 1,
    tile_n: int = 1,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's contract: ``(residual_cur, post_mix_cur [.., hc, 1], comb_mix_cur [.., hc, hc],
    layer_input_cur [.., hidden] bf16)``."""
    orig = _original()
    if not handles(x, residual, fn):
        return orig(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps,
                    hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits,
                    tile_n, norm_weight=norm_weight, norm_eps=norm_eps)
    g = orig.__globals__  # SGLang's own finalization kernels and allocator helpers
    hc_mult, hidden = residual.shape[-2], residual.shape[-1]
    hc_mult2, hc_mult3 = hc_mult * hc_mult, hc_mult * (2 + hc_mult)
    outer_shape = residual.shape[:-2]
    residual_flat = residual.reshape(-1, hc_mult, hidden)
    num_tokens = residual_flat.shape[0]
    residual_cur, gemm_out_mul, gemm_out_sqrsum = mhc_post_pre_partials(
        residual_flat, fn, x.reshape(num_tokens, hidden),
        post_layer_mix.reshape(num_tokens, hc_mult), comb_res_mix.reshape(num_tokens, hc_mult,
                                                                         hc_mult))
    splits = gemm_out_mul.shape[0]
    dev = residual.device
    post_mix_cur = torch.empty(num_tokens, hc_mult, dtype=torch.float32, device=dev)
    comb_mix_cur = torch.empty(num_tokens, hc_mult2, dtype=torch.float32, device=dev)
    # as SGLang: the MoE input lives in the symmetric pool when the all-reduce can use it
    with g["use_symmetric_memory"](g["get_parallel"]().tp_group,
                                   disabled=not g["is_allocation_symmetric"]()):
        layer_input_cur = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device=dev)
    if norm_weight is not None:
        assert norm_eps is not None and norm_weight.shape == (hidden,)
        w = norm_weight if norm_weight.dtype == torch.bfloat16 else norm_weight.bfloat16()
        g["mhc_pre_big_fuse_with_norm_tilelang"](
            gemm_out_mul, gemm_out_sqrsum, hc_scale, hc_base, residual_cur, post_mix_cur,
            comb_mix_cur, layer_input_cur, w.contiguous(), hidden, rms_eps, hc_pre_eps,
            hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_eps, splits, hc_mult,
            hc_mult3)
    else:
        g["mhc_pre_big_fuse_tilelang"](
            gemm_out_mul, gemm_out_sqrsum, hc_scale, hc_base, residual_cur, post_mix_cur,
            comb_mix_cur, layer_input_cur, hidden, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
            hc_post_mult_value, sinkhorn_repeat, splits, hc_mult, hc_mult3)
    return (
        residual_cur.view(*outer_shape, hc_mult, hidden),
        post_mix_cur.view(*outer_shape, hc_mult, 1),
        comb_mix_cur.view(*outer_shape, hc_mult, hc_mult),
        layer_input_cur.view(*outer_shape, hidden),
    )
