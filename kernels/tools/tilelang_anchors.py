"""SGLang 0.5.23's real TileLang kernels beside the bundled ones, natively on the H200.

``python kernels/tools/tilelang_anchors.py --sglang-files DIR [--json out.json]``

``DIR`` holds SGLang 0.5.23's ``kernels/ops/attention/dsa/tilelang_kernel.py`` and
``kernels/ops/layernorm/mhc.py``, copied from the installed package (the device has TileLang
0.1.15 carried as wheels but not SGLang and its CUDA-only dependencies). The indexer file is
executed whole as a module, with its two SGLang imports answered for an NVIDIA part
(``is_hip`` / ``is_gfx95_supported`` / ``is_fp8_fnuz`` all false); from ``mhc.py`` only the
TileLang kernels are compiled (``load_sglang_functions``), with ``is_arch_support_pdl`` true, as
SGLang answers on sm_90 and sm_120.

* Indexer: SGLang's ``tilelang_fp8_paged_mqa_logits`` (its sm_120 default with
  ``SGLANG_OPT_USE_TILELANG_INDEXER``) against ``sglang_compat.fp8_paged_mqa_logits_sm120``
  (what the hook installs), B=64, 64 heads, every row 1K / 8K / 32K / 262K compressed keys
  (page 64), ``clean_logits=False`` (what SGLang's caller passes); both checked against the
  float32 reference on each row's valid prefix.
* mHC pre GEMM: SGLang's ``mhc_fused_post_pre`` small-batch launch
  (``mhc_fused_post_pre_fma_tilelang`` with its own tile/split rule, T <= 32) and, at T = 64,
  its large-batch TileLang path without DeepGEMM (``mhc_post_tilelang`` then
  ``mhc_pre_gemm_sqrsum_tilelang`` re-wrapped as on sm_120), against
  ``mhc_pre_gemm.mhc_post_pre_partials``; DeepSeek-V4-Flash shapes (hidden 4096, hc 4, 24
  mixes); errors of the summed mixes against the float64 reference.

Times: medians of CUDA-graph replays, cold L2 (``bench.Timer``); natively sm_90 (no arch
override): these anchors rank our kernels against the engine's on the same chip. Not part of
the package.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import time
import types
from typing import Any

import torch
from bench import Timer

from dsv4_kernels import sglang_compat
from dsv4_kernels.layout import quantize_index_keys
from dsv4_kernels.mhc_pre_gemm import mhc_post_pre_partials, post_pre_reference
from dsv4_kernels.reference import ref_indexer_logits


def _stub(name: str, **attrs: Any) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod


def load_indexer(folder: pathlib.Path) -> Any:
    no = lambda *a, **k: False  # noqa: E731
    for pkg in ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.quantization",
                "sglang.srt"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg))
    _stub("sglang.kernels.ops.quantization.fp8_kernel", is_fp8_fnuz=no)
    _stub("sglang.srt.utils", is_hip=no, is_gfx95_supported=no)
    spec = importlib.util.spec_from_file_location("sgl_tilelang_kernel",
                                                  folder / "tilelang_kernel.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def load_mhc(folder: pathlib.Path) -> dict[str, Any]:
    import ast
    import math

    import tilelang
    import tilelang.language as T

    globs = {"tilelang": tilelang, "T": T, "math": math, "is_arch_support_pdl": lambda: True}
    fns = sglang_compat.load_sglang_functions(
        folder / "mhc.py", ["mhc_fused_post_pre_fma_tilelang", "mhc_post_tilelang"], globs)
    # the GEMM undecorated: SGLang re-wraps its ``__wrapped__`` on sm_120, which TileLang 0.1.15's
    # JIT object no longer has
    tree = ast.parse((folder / "mhc.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name == "mhc_pre_gemm_sqrsum_tilelang")
    node.decorator_list = []
    ns = dict(globs)
    exec(compile(ast.Module(body=[node], type_ignores=[]), "mhc.py", "exec"), ns)
    fns["mhc_pre_gemm_sqrsum_raw"] = ns["mhc_pre_gemm_sqrsum_tilelang"]
    return fns


def indexer_case(g: torch.Generator, batch: int, keys: int, dev: str) -> dict[str, Any]:
    ps = 64
    pages = batch * (keys // ps)
    kv = torch.randn(pages, ps, 128, generator=g, device=dev)
    cache = quantize_index_keys(kv)
    del kv
    perm = torch.randperm(pages, generator=g, device=dev).to(torch.int32)
    pt = perm.view(batch, keys // ps)
    q = (torch.randn(batch, 1, 64, 128, generator=g, device=dev) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(batch, 64, generator=g, device=dev) * 64 ** -0.5
    lens = torch.full((batch,), keys, dtype=torch.int32, device=dev)
    return dict(q_fp8=q, kvcache_fp8=cache, weight=w, seq_lens=lens, page_table=pt,
                deep_gemm_metadata=None, max_seq_len=keys, clean_logits=False)


def timed(timer: Timer, fn: Any) -> tuple[float, str]:
    """Graph replays; eager launches where the kernel cannot be captured (said in the row)."""
    try:
        return timer.graph(fn), "graph"
    except Exception as exc:
        torch.cuda.synchronize()
        return timer.eager(fn), f"eager ({type(exc).__name__})"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _indexer_row(timer: Timer, mod: Any, g: torch.Generator, keys: int,
                 dev: str) -> dict[str, Any]:
    c = indexer_case(g, 64, keys, dev)
    row: dict[str, Any] = {"keys": keys, "batch": 64,
                           "bytes": 64 * keys * 132 + 64 * 64 * 128 + 64 * keys * 4}
    ref_rows = 8  # the reference on a few rows (its float32 gather of 262K keys is large)
    ref = ref_indexer_logits(c["q_fp8"][:ref_rows, 0], c["kvcache_fp8"], c["weight"][:ref_rows],
                             c["seq_lens"][:ref_rows], c["page_table"][:ref_rows], keys)
    for name, fn in (("ours", sglang_compat.fp8_paged_mqa_logits_sm120),
                     ("sglang_tilelang", mod.tilelang_fp8_paged_mqa_logits)):
        try:
            out = fn(**c)
            row[f"{name}_err"] = rel(out[:ref_rows], ref)
            row[f"{name}_us"], row[f"{name}_timing"] = timed(timer, lambda fn=fn: fn(**c))
        except Exception as exc:
            row[f"{name}_us"] = f"fail: {type(exc).__name__}: {str(exc)[:300]}"
    return row


def run_indexer(timer: Timer, mod: Any, dev: str) -> list[dict[str, Any]]:
    g = torch.Generator(device=dev).manual_seed(7)
    rows = []
    for keys in (1024, 8192, 32768, 262144):
        rows.append(_indexer_row(timer, mod, g, keys, dev))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    return rows


def _sglang_mhc(fns: dict[str, Any], t: int, res: torch.Tensor, fn: torch.Tensor,
                y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> tuple[Any, str]:
    """SGLang's mhc_fused_post_pre launch sequence for ``t`` tokens (mhc.py, 0.5.23)."""
    n, hc, h = fn.shape[0], res.shape[1], res.shape[2]
    dev = res.device
    if t <= 32:  # its small-batch rule: one FMA launch with these tiles and splits
        tile_n = 2 if t < 8 else 3
        splits = 8 if (t < 8 and h <= 4096) else 4

        def small() -> tuple[torch.Tensor, ...]:
            mix = torch.empty(splits, t, n, dtype=torch.float32, device=dev)
            sq = torch.empty(splits, t, dtype=torch.float32, device=dev)
            out = torch.empty_like(res)
            fns["mhc_fused_post_pre_fma_tilelang"](
                comb, res, post, y, fn.view(n, hc, h), mix, sq, out, hc, h, n,
                tile_mix_outputs=tile_n, split_k=splits)
            return out, mix, sq
        return small, f"fma tilelang tile_n {tile_n} split_k {splits}"
    import tilelang

    # its large-batch path without DeepGEMM, the GEMM re-wrapped without warp specialization
    # as its sm_120 dispatch does (_mhc_pre_gemm_sqrsum_dispatch)
    gemm = tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True})(
        fns["mhc_pre_gemm_sqrsum_raw"])

    def large() -> tuple[torch.Tensor, ...]:
        out = torch.empty_like(res)
        fns["mhc_post_tilelang"](comb, res, post, y, out, hc, h)
        mix = torch.empty(t, n, dtype=torch.float32, device=dev)
        sq = torch.empty(t, dtype=torch.float32, device=dev)
        gemm(out.view(t, hc * h), fn, mix, sq, n, hc * h)
        return out, mix.unsqueeze(0), sq.unsqueeze(0)
    return large, "mhc_post_tilelang + mhc_pre_gemm_sqrsum_tilelang (no DeepGEMM)"


def _mhc_row(timer: Timer, fns: dict[str, Any], g: torch.Generator, t: int, fn: torch.Tensor,
             dev: str) -> dict[str, Any]:
    h, hc = 4096, 4
    res = torch.randn(t, hc, h, generator=g, device=dev).to(torch.bfloat16)
    y = torch.randn(t, h, generator=g, device=dev).to(torch.bfloat16)
    post = torch.rand(t, hc, generator=g, device=dev) * 2
    comb = torch.softmax(torch.randn(t, hc, hc, generator=g, device=dev), -1)
    ref_res, ref_mix, ref_sq = post_pre_reference(res, fn, y, post, comb)
    row: dict[str, Any] = {"T": t}
    try:
        theirs, row["sglang_path"] = _sglang_mhc(fns, t, res, fn, y, post, comb)
    except Exception as exc:
        theirs, row["sglang_path"] = None, f"fail: {type(exc).__name__}: {str(exc)[:300]}"
    for name, f in (("ours", lambda: mhc_post_pre_partials(res, fn, y, post, comb)),
                    ("sglang_tilelang", theirs)):
        if f is None:
            continue
        try:
            out, mix, sq = f()
            row[f"{name}_mix_err"] = rel(mix.sum(0), ref_mix)
            row[f"{name}_sq_err"] = rel(sq.sum(0), ref_sq)
            row[f"{name}_res_equal"] = bool(torch.equal(out, ref_res))
            row[f"{name}_us"], row[f"{name}_timing"] = timed(timer, f)
        except Exception as exc:
            row[f"{name}_us"] = f"fail: {type(exc).__name__}: {str(exc)[:300]}"
    return row


def run_mhc(timer: Timer, fns: dict[str, Any], dev: str) -> list[dict[str, Any]]:
    g = torch.Generator(device=dev).manual_seed(11)
    fn = torch.randn(24, 4 * 4096, generator=g, device=dev) * 0.02
    rows = []
    for t in (1, 8, 32, 64):
        rows.append(_mhc_row(timer, fns, g, t, fn, dev))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-files", required=True)
    ap.add_argument("--json")
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    t0 = time.time()
    folder = pathlib.Path(args.sglang_files)
    dev = "cuda"
    timer = Timer(torch.device(dev))
    import tilelang

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0),
                           "tilelang": tilelang.__version__}
    if "indexer" not in args.skip:
        try:
            res["indexer"] = run_indexer(timer, load_indexer(folder), dev)
        except Exception as exc:
            res["indexer"] = f"fail: {type(exc).__name__}: {str(exc)[:500]}"
    if "mhc" not in args.skip:
        try:
            res["mhc"] = run_mhc(timer, load_mhc(folder), dev)
        except Exception as exc:
            res["mhc"] = f"fail: {type(exc).__name__}: {str(exc)[:500]}"
    res["wall_s"] = time.time() - t0
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    print_tables(res)
    return 0


def print_tables(res: dict[str, Any]) -> None:
    print(f"\n{res['device']}, TileLang {res['tilelang']}, native sm_90")
    if isinstance(res.get("indexer"), list):
        print("| indexer B=64, keys/row | ours µs | SGLang TileLang µs | ours / theirs | "
              "ours err | theirs err |")
        print("|---|---|---|---|---|---|")
        for r in res["indexer"]:
            o, t = r.get("ours_us"), r.get("sglang_tilelang_us")
            x = o / t if isinstance(o, float) and isinstance(t, float) else "-"
            print(f"| {r['keys']} | {o} | {t} | {x} | {r.get('ours_err')} | "
                  f"{r.get('sglang_tilelang_err')} |")
    else:
        print("indexer:", res.get("indexer"))
    if isinstance(res.get("mhc"), list):
        print("\n| mHC pre, T | ours µs | SGLang TileLang µs | ours / theirs | SGLang path | "
              "ours mix err | theirs mix err |")
        print("|---|---|---|---|---|---|---|")
        for r in res["mhc"]:
            o, t = r.get("ours_us"), r.get("sglang_tilelang_us")
            x = o / t if isinstance(o, float) and isinstance(t, float) else "-"
            print(f"| {r['T']} | {o} | {t} | {x} | {r['sglang_path']} | "
                  f"{r.get('ours_mix_err')} | {r.get('sglang_tilelang_mix_err')} |")
    else:
        print("mhc:", res.get("mhc"))


if __name__ == "__main__":
    raise SystemExit(main())
