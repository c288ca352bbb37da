"""SGLang 0.5.23's two Triton sparse-MLA decode kernels on the same inputs (H200, sm_120 proxy).

``PYTHONPATH=kernels:.baselines python3 kernels/tools/sglang_triton_pair.py [--json out.json]``
(``.baselines`` from ``kernels/tools/fetch_baselines.py``).

* ``flash_mla_sm120_triton.flash_mla_sparse_decode_triton``: the one SGLang calls on sm_120 with
  ``SGLANG_SM120_FLASHMLA_BACKEND=triton`` (``flash_mla_sm120.flash_mla_with_kvcache_sm120``),
  and the function the bundled hook replaces. Grid (rows, heads), CUDA-core dots, no split-K.
* ``dsv4/triton_sparse_decode.triton_fp8_attention_fwd``: the fused split-K kernel, reached only
  from ``srt/layers/attention/hip_flash_mla.py`` (``SGLANG_HACK_FLASHMLA_BACKEND=triton``, the
  ROCm path); ``kernels/tools/bench.py`` and ``sm120_proxy.py`` time it as baseline (b).

Each is checked against the float32 reference and timed with ``qualify.Timer`` (CUDA-graph
replays, a 256 MiB flush before each) and, to rule out a timer fault, eagerly without a flush.
``TRITON_OVERRIDE_ARCH=sm89`` as in the proxy. Top-k 1024 + SWA 128, 64 and 16 heads, B=64 (B=8
and B=1 follow with ``--all``). Not part of the package.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_OVERRIDE_ARCH", "sm89")

import argparse
import json
import statistics
from typing import Any

import torch
from sglang.kernels.ops.attention import flash_mla_sm120_triton as tri
from sglang.kernels.ops.attention.dsv4.triton_sparse_decode import triton_fp8_attention_fwd

from dsv4_kernels import qualify
from dsv4_kernels.cases import make_decode_case
from dsv4_kernels.reference import ref_sparse_decode


def _eager_us(fn: Any, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--all", action="store_true", help="also B=8 and B=1 (64 heads)")
    args = ap.parse_args()
    timer = qualify.Timer()
    g = torch.Generator().manual_seed(7)
    shapes = [(64, 64), (64, 16)] + ([(8, 64), (1, 64)] if args.all else [])
    rows = []
    for bsz, heads in shapes:
        c = make_decode_case(g, batch=bsz, heads=heads, topk=qualify.SWA, extra_topk=1024,
                             page_size=256, extra_page_size=64, device="cuda")
        ro, _ = ref_sparse_decode(**c.kwargs())
        pos = qualify._args(c)
        kw = dict(q=c.q, k_cache=c.k_cache, head_dim_v=512, softmax_scale=c.sm_scale,
                  indices=c.indices, attn_sink=c.attn_sink, extra_k_cache=c.extra_k_cache,
                  extra_indices_in_kvcache=c.extra_indices, topk_length=c.topk_length,
                  extra_topk_length=c.extra_topk_length)
        for name, fn in (("flash_mla_sparse_decode_triton",
                          lambda p=pos: tri.flash_mla_sparse_decode_triton(*p)),
                         ("triton_fp8_attention_fwd", lambda k=kw: triton_fp8_attention_fwd(**k))):
            o = fn()[0]
            err = float((o.float().reshape(ro.shape) - ro).norm() / ro.norm())
            us, note = timer.time(fn)
            row = {"B": bsz, "H": heads, "kernel": name, "graph_cold_us": round(us, 1),
                   "note": note, "eager_warm_us": round(_eager_us(fn), 1),
                   "err": float(f"{err:.3g}")}
            print(json.dumps(row), flush=True)
            rows.append(row)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
