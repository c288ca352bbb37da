"""The bf16 mHC pre GEMM (issue 25): tolerance against FP32, batch invariance, the weight-split
cache, and the hook end to end through SGLang 0.5.23's real sm_120 call site."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from dsv4_kernels import sglang_hook, sglang_mhc
from dsv4_kernels.mhc_pre_gemm import (
    mhc_post_pre_partials,
    post_pre_reference,
    residual_close,
    split_fn_bf16,
)

H = 256  # small hidden for the interpreter; the kernel is the same for 4096


def _case(g: torch.Generator, t: int, h: int = H):
    res = torch.randn(t, 4, h, generator=g).bfloat16()
    fn = torch.randn(24, 4 * h, generator=g) * 0.02
    y = torch.randn(t, h, generator=g).bfloat16()
    post = 2 * torch.rand(t, 4, generator=g)
    comb = torch.softmax(torch.randn(t, 4, 4, generator=g), -1)
    return res, fn, y, post, comb


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("t", [1, 5, 19])
def test_partials_match_fp32(gen: torch.Generator, t: int) -> None:
    res, fn, y, post, comb = _case(gen, t)
    out, mix, sq = mhc_post_pre_partials(res, fn, y, post, comb, splits=4)
    ref_out, ref_mix, ref_sq = post_pre_reference(res, fn, y, post, comb)
    assert mix.shape == (4, t, 24) and sq.shape == (4, t) and out.shape == res.shape
    # the post is rounded to bf16 as SGLang does; its FP32 sum order may flip a last bit
    assert residual_close(out, ref_out)[0]
    assert float((out != ref_out).float().mean()) < 1e-2
    _, mix_own, sq_own = post_pre_reference(out, fn)
    assert _rel(mix.sum(0), mix_own) < 2e-5  # hi + lo keeps FP32-level accuracy
    assert _rel(sq.sum(0), sq_own) < 1e-6
    assert _rel(mix.sum(0), ref_mix) < 5e-3 and _rel(sq.sum(0), ref_sq) < 5e-3


def test_lo_half_carries_the_precision(gen: torch.Generator) -> None:
    res, fn, _, _, _ = _case(gen, 7)
    _, ref_mix, ref_sq = post_pre_reference(res, fn)
    _, both, sq = mhc_post_pre_partials(res, fn, splits=4)
    _, hi_only, _ = mhc_post_pre_partials(res, fn, splits=4, use_lo=False)
    assert _rel(both.sum(0), ref_mix) < 2e-5
    assert _rel(hi_only.sum(0), ref_mix) > 2e-4  # bf16 weight alone: ~1e-3
    assert _rel(sq.sum(0), ref_sq) < 1e-6


def test_same_token_same_result_whatever_the_batch(gen: torch.Generator) -> None:
    res, fn, y, post, comb = _case(gen, 21)
    full = mhc_post_pre_partials(res, fn, y, post, comb, splits=4)
    for t in (1, 6, 17):
        part = mhc_post_pre_partials(res[:t], fn, y[:t], post[:t], comb[:t], splits=4)
        assert torch.equal(part[0], full[0][:t])
        assert torch.equal(part[1], full[1][:, :t]) and torch.equal(part[2], full[2][:, :t])
    # A token moved to another row of the tile is checked on the GPU (selftest): here numpy's
    # matmul, which stands in for mma, may block rows differently by position.


def test_weight_split_follows_in_place_updates(gen: torch.Generator) -> None:
    fn = torch.randn(24, 4 * H, generator=gen)
    hi, lo = split_fn_bf16(fn)
    assert split_fn_bf16(fn)[0] is hi  # cached
    both = (hi[:, :24].float() + lo[:, :24].float()).t()
    assert bool(((both - fn).abs() <= fn.abs() * 2.0**-16).all())  # ~FP32 for this use
    assert torch.equal(hi[:, :24].t(), fn.bfloat16()) and not bool(hi[:, 24:].any())
    fn.copy_(torch.randn(24, 4 * H, generator=gen))  # an online weight update
    hi2, _ = split_fn_bf16(fn)
    assert hi2 is not hi and torch.equal(hi2[:, :24].t(), fn.bfloat16())
    other = fn.clone()  # a different tensor never sees fn's split
    assert split_fn_bf16(other)[0] is not hi2


def test_bad_shapes_are_refused(gen: torch.Generator) -> None:
    res, fn, _, _, _ = _case(gen, 2)
    with pytest.raises(ValueError, match="residual"):
        mhc_post_pre_partials(res[:, :3], fn)
    with pytest.raises(ValueError, match="multiple of splits"):
        mhc_post_pre_partials(res, fn, splits=3)


# The sm_120 build (shared memory, no spills, bf16 mma.sync) is in the one sm_120 compile gate:
# test_kernels_sm120_gate.py (``mhc-pre ...`` builds).


def test_pinned_signature_is_sglangs() -> None:
    import inspect

    from dsv4_kernels.sglang_compat import load_sglang_functions

    root = pathlib.Path(importlib.util.find_spec("sglang").origin).parent  # type: ignore[union-attr]
    real = load_sglang_functions(root / "kernels/ops/layernorm/mhc.py", ["mhc_fused_post_pre"],
                                 {"use_symmetric_memory": None})["mhc_fused_post_pre"]
    assert tuple(inspect.signature(real).parameters) == sglang_mhc.MHC_PARAMS
    assert tuple(inspect.signature(sglang_mhc.mhc_fused_post_pre).parameters) == \
        sglang_mhc.MHC_PARAMS


# Runs in a fresh interpreter with the .pth line: the hook patches SGLang's real mhc module at
# import; SGLang's real sm_120 call path (deepseek_v4_fused_mhc.apply_mhc_post_pre_boundary ->
# deepseek_v4.get_mhc_ops, compiled from the installed files because their modules import CUDA
# packages) then reaches the replacement; its result is checked against SGLang's own torch path
# (_mhc_post_torch then _mhc_pre_torch). Only tvm_ffi (CUDA-only) is stubbed, and the TileLang
# finalization, which cannot run on a CPU, is replaced by its torch equivalent.
_E2E = r"""
import contextlib, importlib.abc, importlib.machinery, json, pathlib, sys, types
class _Stub:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else _Stub()
    def __getattr__(self, n): return _Stub()
    def __mro_entries__(self, bases): return (object,)
class _StubModule(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__"): raise AttributeError(n)
        return _Stub()
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "tvm_ffi":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = _StubModule(spec.name); m.__path__ = []; return m
    def exec_module(self, module): pass
sys.meta_path.append(_Finder())
import torch
import sglang.kernels.ops.layernorm.mhc as mhc
from sglang.srt.environ import envs
from dsv4_kernels.sglang_compat import load_sglang_functions
from dsv4_kernels.mhc_pre_gemm import residual_close
report = {"patched_by": mhc.mhc_fused_post_pre.__module__}
if report["patched_by"] != "dsv4_kernels.sglang_mhc":
    print(json.dumps(report)); sys.exit(0)

def finalize(mul, sq, scale, base, res, post_out, comb_out, layer_in, hidden, rms_eps, pre_eps,
             sk_eps, post_mult, repeat, n_splits, hc_mult, hc_mult3, norm=None):
    assert mul.shape[0] == sq.shape[0] == n_splits and hc_mult3 == mul.shape[2] == 24
    s, n = res.shape[0], res.shape[1]
    mixes = mul.sum(0) * torch.rsqrt(sq.sum(0, keepdim=True).t() / (n * hidden) + rms_eps)
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + pre_eps
    post = post_mult * torch.sigmoid(mixes[:, n:2 * n] * scale[1] + base[n:2 * n])
    comb = (mixes[:, 2 * n:].view(s, n, n) * scale[2] + base[2 * n:].view(n, n)).softmax(-1)
    comb = comb + sk_eps
    comb = comb / (comb.sum(-2, keepdim=True) + sk_eps)
    for _ in range(repeat - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + sk_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + sk_eps)
    x = (pre.unsqueeze(-1) * res.float()).sum(1)
    if norm is not None:
        x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm[1]) * norm[0].float()
    post_out.copy_(post); comb_out.copy_(comb.flatten(1)); layer_in.copy_(x)
    report["finalize_splits"] = int(mul.shape[0])

def finalize_norm(mul, sq, scale, base, res, post_out, comb_out, layer_in, weight, hidden,
                  rms_eps, pre_eps, sk_eps, post_mult, repeat, norm_eps, *rest):
    finalize(mul, sq, scale, base, res, post_out, comb_out, layer_in, hidden, rms_eps, pre_eps,
             sk_eps, post_mult, repeat, *rest, norm=(weight, norm_eps))

calls = []
mhc.mhc_pre_big_fuse_tilelang = finalize
mhc.mhc_pre_big_fuse_with_norm_tilelang = finalize_norm
mhc.get_parallel = lambda: types.SimpleNamespace(tp_group=None)
mhc.is_allocation_symmetric = lambda: False
mhc.use_symmetric_memory = (
    lambda group, disabled: calls.append(disabled) or contextlib.nullcontext())

root = pathlib.Path(mhc.__file__).parents[3]
v4 = load_sglang_functions(root / "srt/models/deepseek_v4.py", ["get_mhc_ops"],
                           {"_is_xpu": False, "functools": __import__("functools"),
                            "MhcOps": lambda **k: types.SimpleNamespace(**k)})
stub = types.ModuleType("sglang.srt.models.deepseek_v4")
stub.get_mhc_ops = v4["get_mhc_ops"]
sys.modules["sglang.srt.models.deepseek_v4"] = stub
platform = types.SimpleNamespace(is_sm120=True)
fm = load_sglang_functions(
    root / "srt/models/deepseek_common/amd/deepseek_v4_fused_mhc.py",
    ["apply_mhc_post_pre_boundary", "try_mhc_fused_post_pre_boundary",
     "try_aiter_fused_mhc_post_pre", "try_fused_hc_post_pre", "_is_fused_mhc_post_pre_enabled",
     "_is_aiter_gfx95_mhc_available"],
    {"envs": envs, "get_platform": lambda: platform, "_is_gfx95_supported": False,
     "_is_gfx1250_supported": False, "_is_hip": False, "get_bool_env_var": lambda n: False,
     "is_gfx95_supported": lambda: False, "_TRITON_MHC_POST_PRE_RUNTIME_DISABLED": False,
     "_AITER_MHC_FUSED_POST_PRE_RUNTIME_DISABLED": False, "_FUSED_HC_POST_PRE_M_THRESHOLD": 64})
report["sm120_fusion_enabled"] = fm["_is_fused_mhc_post_pre_enabled"]()

g = torch.Generator().manual_seed(int(sys.argv[1]))
t, h = 3, 2048
res = torch.randn(t, 4, h, generator=g).bfloat16()
y = torch.randn(t, h, generator=g).bfloat16()
post = 2 * torch.rand(t, 4, generator=g)
comb = torch.softmax(torch.randn(t, 4, 4, generator=g), -1)
fn = torch.randn(24, 4 * h, generator=g) * 0.02
scale, base = torch.rand(3, generator=g), torch.randn(24, generator=g) * 0.1
nw = (1 + 0.1 * torch.randn(h, generator=g)).bfloat16()
out = fm["apply_mhc_post_pre_boundary"](y, res, post, comb, fn, scale, base, 4, 1e-6, 1e-6, 2.0,
                                        20, nw, 1e-6, fn_transpose=False)
new_res, layer_in, post_o, comb_o, normed = out
want_res = mhc._mhc_post_torch(y, res, post.unsqueeze(-1), comb)
want_post, want_comb, want_in = mhc._mhc_pre_torch(want_res, fn, scale, base, 1e-6, 1e-6, 1e-6,
                                                   2.0, 20)
want_in = want_in.float()
want_in = want_in * torch.rsqrt(want_in.square().mean(-1, keepdim=True) + 1e-6) * nw.float()
rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())
report.update(normed=bool(normed), symmetric_disabled=calls,
              res_worst=residual_close(new_res, want_res)[1],
              post_err=rel(post_o, want_post.squeeze(-1)), comb_err=rel(comb_o, want_comb),
              input_err=rel(layer_in, want_in), input_dtype=str(layer_in.dtype))
print(json.dumps(report))
"""


def _run_e2e(bf16_gemms: bool, seed: int) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items()
           if k not in (sglang_hook.ENV_VAR, sglang_hook.BF16_GEMMS_ENV)}
    env[sglang_hook.ENV_VAR] = "1"
    env["TRITON_INTERPRET"] = "1"
    if bf16_gemms:
        env[sglang_hook.BF16_GEMMS_ENV] = "1"
    res = subprocess.run([sys.executable, "-c", sglang_hook.PTH_LINE + _E2E, str(seed)],
                         capture_output=True, text=True, env=env, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_switch_reaches_sglangs_sm120_call_site(gen: torch.Generator) -> None:
    got = _run_e2e(True, int(torch.randint(0, 2**31, (1,), generator=gen)))
    assert got["patched_by"] == "dsv4_kernels.sglang_mhc"
    assert got["sm120_fusion_enabled"] is True
    assert got["finalize_splits"] == 64  # our split-K partials reached SGLang's finalization
    assert got["normed"] is True and got["input_dtype"] == "torch.bfloat16"
    assert got["symmetric_disabled"] == [True]  # SGLang's allocator helper was asked
    assert got["res_worst"] <= 1.0
    assert got["post_err"] < 1e-4 and got["comb_err"] < 1e-4
    assert got["input_err"] < 1e-2  # bf16 output of a bf16 norm


def test_switch_off_leaves_sglang_alone() -> None:
    got = _run_e2e(False, 1)
    assert got == {"patched_by": "sglang.kernels.ops.layernorm.mhc"}
