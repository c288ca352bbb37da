"""On-host self-test run by ``dsv4ctl apply`` before switching the engine to these kernels.

``python -m dsv4_kernels.selftest`` checks, on every visible GPU, the sparse decode (every
variant the dispatcher can pick on that device, at its tiles there: ``dispatch_configs``), the
indexer and the bf16 mHC pre GEMM (``mhc_pre_gemm``, batch invariance included) against the
float32 references (fresh random inputs, the issue's edge cases), that a CUDA-graph replay
reproduces the eager result bit for bit, and times one decode shape. It
prints one JSON document and exits 0 only if every check passed (1 on a mismatch, 2 when no
GPU is visible).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from typing import Any

import torch

from ._runtime import device_arch, device_max_shared
from .cases import check_topk, compare_decode, make_decode_case, make_indexer_case
from .indexer import indexer_logits, indexer_topk
from .mhc_pre_gemm import mhc_post_pre_partials, post_pre_reference, residual_close
from .reference import ref_indexer_logits, ref_sparse_decode
from .sparse_decode import dispatch_configs, sparse_mla_decode

DECODE_CASES: list[dict[str, Any]] = [
    dict(batch=3, heads=64, topk=128, extra_topk=512, page_size=256, extra_page_size=64),
    dict(batch=2, heads=16, topk=64, extra_topk=100, page_size=61, extra_page_size=2,
         lengths="random", invalid_frac=0.2),
    dict(batch=2, heads=64, topk=128, extra_topk=0, lengths="zero"),
    dict(batch=4, heads=128, topk=128, extra_topk=1024, page_size=256, sink=False),
]


def _decode_checks(device: str, g: torch.Generator) -> list[dict[str, Any]]:
    out = []
    for spec in DECODE_CASES:
        for nsplit in (1, 5):
            probe = torch.empty(0, device=device)
            for pick in dispatch_configs(device_max_shared(probe), device_arch(probe)):
                variant = pick.variant
                c = make_decode_case(g, device=device, **spec)
                cfg = dataclasses.replace(pick, nsplit=nsplit)
                o, lse = sparse_mla_decode(**c.kwargs(), config=cfg)
                ro, rl = ref_sparse_decode(**c.kwargs())
                res = compare_decode(o, lse, ro, rl)
                res.update(case=spec, nsplit=nsplit, variant=variant)
                out.append(res)
    return out


def _graph_checks(device: str, g: torch.Generator) -> dict[str, Any]:
    """Graph capture and replay at 8 rows (many splits and the combine launch) and 64."""
    res: dict[str, Any] = {f"batch_{b}": _graph_check(device, g, b) for b in (8, 64)}
    res["ok"] = all(r["ok"] for r in res.values())
    return res


def _graph_check(device: str, g: torch.Generator, batch: int) -> dict[str, Any]:
    c = make_decode_case(g, batch=batch, heads=64, topk=128, extra_topk=512, page_size=256,
                         lengths="random", device=device)
    eager = sparse_mla_decode(**c.kwargs())
    box: dict[str, Any] = {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparse_mla_decode(**c.kwargs())
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        box["r"] = sparse_mla_decode(**c.kwargs())
    graph.replay()
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) for a, b in zip(eager, box["r"], strict=True))
    # new lengths written into the captured tensors must be honoured by a replay
    assert c.topk_length is not None
    c.topk_length.copy_(torch.randint(0, 129, c.topk_length.shape, generator=g,
                                      dtype=torch.int32).to(device))
    graph.replay()
    eager2 = sparse_mla_decode(**c.kwargs())
    torch.cuda.synchronize()
    same2 = all(torch.equal(a, b) for a, b in zip(eager2, box["r"], strict=True))
    return {"ok": same and same2, "replay_equals_eager": same, "replay_after_length_change": same2}


def _indexer_checks(device: str, g: torch.Generator) -> list[dict[str, Any]]:
    out = []
    for lens, ps, topk in (([0, 300, 2000, 5000], 64, 512), ([1, 1023, 1024, 1500], 61, 1024)):
        max_len = 6000
        c = make_indexer_case(g, batch=len(lens), heads=64, lens=lens, max_len=max_len,
                              page_size=ps, device=device)
        lg = indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table, max_len,
                            clean=True)
        ref = ref_indexer_logits(c.q_fp8, c.index_cache, c.weights, c.seq_lens, c.page_table,
                                 max_len)
        fin = torch.isfinite(ref)
        inf_ok = bool(torch.equal(fin, torch.isfinite(lg)))
        rel = float((lg[fin] - ref[fin]).norm() / ref[fin].norm()) if bool(fin.any()) else 0.0
        raw = torch.empty(len(lens), topk, dtype=torch.int32, device=device)
        slots = indexer_topk(lg, c.seq_lens, c.page_table, ps, topk, raw_out=raw)
        tk = check_topk(slots, raw, lg, c.seq_lens, c.page_table, ps, topk)
        out.append({"ok": inf_ok and rel < 2e-3 and tk["ok"], "lens": lens, "page_size": ps,
                    "topk": topk, "logits_rel_err": rel, "topk_ok": tk["ok"]})
    return out


def _mhc_case(g: torch.Generator, t: int, device: str) -> tuple[torch.Tensor, ...]:
    res = torch.randn(t, 4, 4096, generator=g).to(device, torch.bfloat16)
    y = torch.randn(t, 4096, generator=g).to(device, torch.bfloat16)
    post = (2 * torch.rand(t, 4, generator=g)).to(device)
    comb = torch.softmax(torch.randn(t, 4, 4, generator=g), -1).to(device)
    return res, y, post, comb


def _mhc_checks(device: str, g: torch.Generator) -> dict[str, Any]:
    """The mHC pre GEMM at DeepSeek-V4-Flash's shape: error against float64, a token's result
    bit for bit whatever its batch and row, and a graph replay."""
    fn = (torch.randn(24, 16384, generator=g) * 0.02).to(device)
    out: dict[str, Any] = {"rows": []}
    for t in (1, 8, 64):
        res, y, post, comb = _mhc_case(g, t, device)
        r_out, mix, sq = mhc_post_pre_partials(res, fn, y, post, comb)
        _, ref_mix, ref_sq = post_pre_reference(r_out, fn)
        w_out = post_pre_reference(res, fn, y, post, comb)[0]
        res_ok, res_worst = residual_close(r_out, w_out)
        err = float((mix.sum(0) - ref_mix).norm() / ref_mix.norm())
        err_sq = float((sq.sum(0) - ref_sq).norm() / ref_sq.norm())
        out["rows"].append({"T": t, "rel_err": err, "rel_err_sqrsum": err_sq,
                            "residual_worst_over_tol": res_worst,
                            "ok": err < 1e-4 and err_sq < 1e-5 and res_ok})
    res, y, post, comb = _mhc_case(g, 64, device)
    full = mhc_post_pre_partials(res, fn, y, post, comb)
    idx = torch.tensor([63, 0, 17, 40, 5], device=device)  # other batch sizes, other rows
    same = True
    for sel in (idx[:1], idx[:3], idx, torch.arange(8, device=device)):
        part = mhc_post_pre_partials(res[sel], fn, y[sel], post[sel], comb[sel])
        same = same and torch.equal(part[0], full[0][sel]) and \
            torch.equal(part[1], full[1][:, sel]) and torch.equal(part[2], full[2][:, sel])
    out["batch_invariant"] = bool(same)
    res, y, post, comb = _mhc_case(g, 8, device)
    eager = mhc_post_pre_partials(res, fn, y, post, comb)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mhc_post_pre_partials(res, fn, y, post, comb)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mhc_post_pre_partials(res, fn, y, post, comb)
    for c in captured:
        c.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    out["graph_replay_equal"] = all(torch.equal(a, b) for a, b in zip(eager, captured,
                                                                      strict=True))
    out["ok"] = all(r["ok"] for r in out["rows"]) and same and out["graph_replay_equal"]
    return out


def _timing(device: str, g: torch.Generator) -> dict[str, Any]:
    c = make_decode_case(g, batch=64, heads=64, topk=128, extra_topk=512, page_size=256,
                         device=device)
    for _ in range(3):
        sparse_mla_decode(**c.kwargs())
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        sparse_mla_decode(**c.kwargs())
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return {"shape": "B=64 H=64 topk=512+128 (eager, warm L2)", "median_us": statistics.median(ts)}


OPS = ("attention", "indexer", "mhc_pre")


def run_device(index: int, ops: tuple[str, ...] = OPS) -> dict[str, Any]:
    """The checks of ``ops`` (what the release uses: dsv4ctl passes --ops) on one GPU."""
    device = f"cuda:{index}"
    with torch.cuda.device(index):
        g = torch.Generator().manual_seed(int(time.time_ns()) & 0xFFFFFFFF)
        res: dict[str, Any] = {"device": index, "name": torch.cuda.get_device_name(index),
                               "ops": list(ops)}
        try:
            ok = True
            if "attention" in ops:
                res["decode"] = _decode_checks(device, g)
                res["graph"] = _graph_checks(device, g)
                res["timing"] = _timing(device, g)
                ok = ok and all(r["ok"] for r in res["decode"]) and res["graph"]["ok"]
            if "indexer" in ops:
                res["indexer"] = _indexer_checks(device, g)
                ok = ok and all(r["ok"] for r in res["indexer"])
            if "mhc_pre" in ops:
                res["mhc_pre"] = _mhc_checks(device, g)
                ok = ok and res["mhc_pre"]["ok"]
            res["ok"] = ok
        except Exception as exc:
            res["ok"] = False
            res["error"] = f"{type(exc).__name__}: {exc}"
    return res


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Self-test of the bundled kernels on every GPU.")
    ap.add_argument("--ops", default=",".join(OPS),
                    help="comma list of the ops to check (default: all): " + ", ".join(OPS))
    args = ap.parse_args(argv)
    ops = tuple(o for o in OPS if o in {x.strip() for x in args.ops.split(",")})
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(json.dumps({"ok": False, "error": "no CUDA device visible",
                          "fix": "run on the GPU host with the engine's environment"}))
        return 2
    import triton

    t0 = time.monotonic()
    devices = [run_device(i, ops) for i in range(torch.cuda.device_count())]
    ok = all(d["ok"] for d in devices)
    print(json.dumps({"ok": ok, "torch": torch.__version__, "triton": triton.__version__,
                      "wall_s": round(time.monotonic() - t0, 1), "devices": devices},
                     indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
