"""On-host self-test run by ``dsv4ctl apply`` before switching the engine to these kernels.

``python -m dsv4_kernels.selftest`` checks, on every visible GPU, the sparse decode (every
variant the dispatcher can pick on that device: ``dispatch_variants``) and the indexer against
the float32 references (fresh random inputs, the issue's edge cases), that a
CUDA-graph replay reproduces the eager result bit for bit, and times one decode shape. It
prints one JSON document and exits 0 only if every check passed (1 on a mismatch, 2 when no
GPU is visible).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch

from ._runtime import device_arch, device_max_shared
from .cases import check_topk, compare_decode, make_decode_case, make_indexer_case
from .indexer import indexer_logits, indexer_topk
from .reference import ref_indexer_logits, ref_sparse_decode
from .sparse_decode import DecodeConfig, dispatch_variants, sparse_mla_decode

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
        for nsplit in (1, 2, 5):
            probe = torch.empty(0, device=device)
            for variant in dispatch_variants(device_max_shared(probe), device_arch(probe)):
                if nsplit == 2 and variant != "ws":
                    continue  # two splits take ws's cluster merge; elsewhere the combine, as 5
                c = make_decode_case(g, device=device, **spec)
                cfg = DecodeConfig(nsplit=nsplit, variant=variant)
                o, lse = sparse_mla_decode(**c.kwargs(), config=cfg)
                ro, rl = ref_sparse_decode(**c.kwargs())
                res = compare_decode(o, lse, ro, rl)
                res.update(case=spec, nsplit=nsplit, variant=variant)
                out.append(res)
    return out


def _graph_checks(device: str, g: torch.Generator) -> dict[str, Any]:
    """Graph capture and replay at 8 rows (many splits and the combine launch) and 64 (on an
    H200, two splits merged in a cluster of two CTAs)."""
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


def run_device(index: int) -> dict[str, Any]:
    """All checks on one GPU."""
    device = f"cuda:{index}"
    with torch.cuda.device(index):
        g = torch.Generator().manual_seed(int(time.time_ns()) & 0xFFFFFFFF)
        res: dict[str, Any] = {"device": index, "name": torch.cuda.get_device_name(index)}
        try:
            res["decode"] = _decode_checks(device, g)
            res["graph"] = _graph_checks(device, g)
            res["indexer"] = _indexer_checks(device, g)
            res["timing"] = _timing(device, g)
            res["ok"] = (all(r["ok"] for r in res["decode"]) and res["graph"]["ok"]
                         and all(r["ok"] for r in res["indexer"]))
        except Exception as exc:
            res["ok"] = False
            res["error"] = f"{type(exc).__name__}: {exc}"
    return res


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(json.dumps({"ok": False, "error": "no CUDA device visible",
                          "fix": "run on the GPU host with the engine's environment"}))
        return 2
    import triton

    t0 = time.monotonic()
    devices = [run_device(i) for i in range(torch.cuda.device_count())]
    ok = all(d["ok"] for d in devices)
    print(json.dumps({"ok": ok, "torch": torch.__version__, "triton": triton.__version__,
                      "wall_s": round(time.monotonic() - t0, 1), "devices": devices},
                     indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
