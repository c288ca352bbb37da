"""The calls that reach the bundled sparse decode on sm_120, timed under the H200 proxy.

``python kernels/tools/sm120_calls.py [--tables padded,decode,prefill] [--json out.json]``

SGLang 0.5.23 reaches ``flash_mla_sparse_decode_triton`` (what the hook replaces) with:

* ``padded``: decode calls (<= 64 tokens) with a rank's heads padded to 64 (``deepseek_v4.py``
  ``_kernel_num_heads``): 8 real heads of 64 under TP8 without attention-DP. "today" is the
  kernel computing all 64 heads; the candidates compute the 8 real ones (``real_heads=8``).
* ``decode``: B=64 decode with 64 real heads (attention-DP or TP1): today's pick vs candidates.
* ``prefill``: chunks of 2,048 and 8,192 rows of one request (``cases.make_prefill_case``) at
  top-k 1024, with 64 heads (attention-DP) and 8 (TP8: SGLang passes the native width above 64
  tokens).

Candidates include ``pg`` (``kernels/experimental``, the pipelined gather).

Like ``sm120_proxy.py``: ``TRITON_OVERRIDE_ARCH=sm89`` (mma.sync only), the sm_120 dispatch
forced (101,376 B, sm_120), graph replays with a cold L2, every output checked against the
float32 reference (in row chunks), the padded heads checked for output 0 / LSE +inf. Fractions of
the byte roofline are against the H200's copy bandwidth measured in the same run (the proxy
ranks variants; it does not predict the card). Not part of the package.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_OVERRIDE_ARCH", "sm89")

import argparse
import json
import pathlib
import sys
import time
from typing import Any

import torch
from bench import SWA, Timer, ceilings
from sm120_proxy import _LAUNCHED, force_sm120, record_launches

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "experimental"))
import dsv4_experimental.pg as pg  # registers the pg experiment

from dsv4_kernels import sparse_decode as sd
from dsv4_kernels.cases import compare_decode, make_decode_case, make_prefill_case
from dsv4_kernels.layout import BYTES_PER_TOKEN
from dsv4_kernels.reference import ref_sparse_decode

D = sd.DecodeConfig
L = "local"
PADDED = {
    "dispatch": None,
    "local bh16 bt32 ns4": D(variant=L, block_h=16, block_t=32, nsplit=4),
    "local bh16 bt32 ns8": D(variant=L, block_h=16, block_t=32, nsplit=8),
    "local bh16 bt16 w8 ns4": D(variant=L, block_h=16, block_t=16, nsplit=4),
    "local bh16 bt16 w8 ns8": D(variant=L, block_h=16, block_t=16, nsplit=8),
    "local bh16 bt16 w4 ns4": D(variant=L, block_h=16, block_t=16, num_warps=4, nsplit=4),
    "local bh16 bt16 w4 ns8": D(variant=L, block_h=16, block_t=16, num_warps=4, nsplit=8),
    "local bh16 bt16 w8 ns4 r4": D(variant=L, block_h=16, block_t=16, nsplit=4, stage_round=4),
    "pg bh16 bt32 s3 ns4": D(variant="pg", block_h=16, block_t=32, num_stages=3, nsplit=4),
}
DECODE = {
    "dispatch": None,
    "local bh32 bt32 r4": D(variant=L, block_h=32, block_t=32, stage_round=4),
    "local bh16 bt16 w8": D(variant=L, block_h=16, block_t=16),
    "local bh16 bt16 w4": D(variant=L, block_h=16, block_t=16, num_warps=4),
    "local bh16 bt16 w8 ns2": D(variant=L, block_h=16, block_t=16, nsplit=2),
    "local bh16 bt32": D(variant=L, block_h=16, block_t=32),
    "pg bh16 bt32 s3": D(variant="pg", block_h=16, block_t=32, num_stages=3),
}
PREFILL = {
    "dispatch": None,
    "local bh32 bt32 r4": D(variant=L, block_h=32, block_t=32, stage_round=4),
    "local bh16 bt16 w8": D(variant=L, block_h=16, block_t=16),
    "local bh16 bt16 w4": D(variant=L, block_h=16, block_t=16, num_warps=4),
    "local bh16 bt16 w8 r4": D(variant=L, block_h=16, block_t=16, stage_round=4),
    "pg bh16 bt32 s3": D(variant="pg", block_h=16, block_t=32, num_stages=3),
}


def reference(kw: dict[str, Any], heads: int | None, chunk: int = 512) -> tuple[torch.Tensor,
                                                                                 torch.Tensor]:
    """The float32 reference over the first ``heads`` heads, ``chunk`` rows at a time."""
    rows = kw["q"].shape[0]
    outs, lses = [], []
    for r0 in range(0, rows, chunk):
        sl = slice(r0, r0 + chunk)
        part = {k: (v[sl] if k in ("q", "indices", "topk_length", "extra_indices",
                                   "extra_topk_length") and v is not None else v)
                for k, v in kw.items()}
        if heads is not None:
            part["q"] = part["q"][:, :, :heads]
            part["attn_sink"] = part["attn_sink"][:heads]
        o, lse = ref_sparse_decode(**part)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def check(out: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor],
          real: int | None) -> dict[str, Any]:
    o, lse = out
    if real is None:
        return compare_decode(o, lse, *ref)
    res = compare_decode(o[:, :, :real], lse[:, :real], *ref)
    pad_ok = bool((o[:, :, real:] == 0).all()) and bool(torch.isposinf(lse[:, real:]).all())
    res["padded_heads_zero_inf"] = pad_ok
    res["ok"] = res["ok"] and pad_ok
    return res


def bytes_of(kw: dict[str, Any], heads: int) -> float:
    """Fewest bytes: each distinct key once, Q and O of the computed heads, the indices."""
    keys = torch.unique(kw["indices"][kw["indices"] >= 0]).numel()
    ex = kw["extra_indices"]
    keys += torch.unique(ex[ex >= 0]).numel()
    rows = kw["q"].shape[0]
    idx = kw["indices"].numel() + ex.numel()
    return float(keys * BYTES_PER_TOKEN + rows * heads * 512 * 2 * 2 + idx * 4)


def run_table(timer: Timer, name: str, kw: dict[str, Any], cands: dict[str, Any],
              real: int | None, today_kw: dict[str, Any] | None, copy_bw: float) -> dict[str, Any]:
    heads = real or kw["q"].shape[2]
    ref = reference(kw, real)
    row: dict[str, Any] = {"shape": name, "roofline_bytes": bytes_of(kw, heads)}
    row["floor_us_h200"] = row["roofline_bytes"] / copy_bw * 1e6
    if today_kw is not None:  # the same padded call, all 64 heads computed
        _LAUNCHED.clear()
        o = sd.sparse_mla_decode(**today_kw)
        row["today_ran"] = "; ".join(_LAUNCHED)
        row["today_ok"] = compare_decode(o[0][:, :, :real], o[1][:, :real], *ref)["ok"]
        row["today_us"] = timer.graph(lambda: sd.sparse_mla_decode(**today_kw))
    for cname, cfg in cands.items():
        try:
            _LAUNCHED.clear()
            extra = {"real_heads": real} if real is not None else {}
            o = sd.sparse_mla_decode(**kw, config=cfg, **extra)
            ran = "; ".join(_LAUNCHED)
            res = check(o, ref, real)
            us = timer.graph(lambda cfg=cfg, extra=extra: sd.sparse_mla_decode(**kw, config=cfg,
                                                                               **extra))
            row[f"cand {cname}"] = {"us": round(us, 1), "ok": res["ok"], "ran": ran,
                                    "err": round(res["out_rel_err"], 5),
                                    "roofline_frac": round(row["floor_us_h200"] / us, 3)}
        except Exception as exc:  # a candidate that does not build is recorded, not fatal
            row[f"cand {cname}"] = f"fail: {type(exc).__name__}: {str(exc)[:200]}"
        print(json.dumps({name: row[f"cand {cname}"], "cand": cname}), flush=True)
    torch.cuda.empty_cache()
    return row


def ir_summary() -> list[dict[str, Any]]:
    """Per compiled decode kernel: shared memory, the multi-buffered allocations and the
    async-wait depths of its TTGIR (what the sm_120 gate records on the CPU), for the Triton
    that ran here."""
    import re

    from sm120_proxy import compiled

    out = []
    for fn in (pg._sparse_decode_pg_kernel, sd._sparse_decode_local_kernel,
               sd._sparse_decode_pf_kernel):
        for k in compiled(fn):
            ir = k.asm.get("ttgir", "")
            out.append({"kernel": k.metadata.name, "shared": k.metadata.shared,
                        "num_warps": k.metadata.num_warps,
                        "buffers": sorted(set(re.findall(
                            r"local_alloc : \(\) -> !ttg.memdesc<([0-9x]+)x(?:i8|bf16|i32|f32)",
                            ir))),
                        "waits": sorted(set(int(n) for n in re.findall(
                            r"async_wait[^{]*\{num = (\d+)", ir)))})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default="padded,decode,prefill")
    ap.add_argument("--topks", default="512,1024")
    ap.add_argument("--prefill-rows", default="2048,8192")
    ap.add_argument("--final", action="store_true",
                    help="the acceptance tables only: today's call, the dispatch, and pg")
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.time()
    if args.final:
        for table in (PADDED, DECODE, PREFILL):
            for k in [k for k in table if k != "dispatch" and not k.startswith("pg")]:
                del table[k]
    force_sm120()
    record_launches()
    dev = torch.device("cuda")
    import triton

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "triton": triton.__version__,
                           "ceilings_h200": ceilings(dev), "rows": []}
    bw = res["ceilings_h200"]["copy_GBps"] * 1e9
    print(json.dumps(res), flush=True)
    timer = Timer(dev)
    g = torch.Generator().manual_seed(29)
    tables = args.tables.split(",")
    for topk in [int(x) for x in args.topks.split(",")]:
        if "padded" in tables:
            c = make_decode_case(g, batch=64, heads=64, topk=SWA, extra_topk=topk,
                                 page_size=256, extra_page_size=64, device="cuda")
            kw = c.kwargs()
            res["rows"].append(run_table(timer, f"padded 8/64 B=64 topk={topk}+{SWA}", kw,
                                         PADDED, 8, kw, bw))
        if "decode" in tables:
            c = make_decode_case(g, batch=64, heads=64, topk=SWA, extra_topk=topk,
                                 page_size=256, extra_page_size=64, device="cuda")
            res["rows"].append(run_table(timer, f"decode B=64 topk={topk}+{SWA}", c.kwargs(),
                                         DECODE, None, None, bw))
    if "prefill" in tables:
        for rows in [int(x) for x in args.prefill_rows.split(",")]:
            for heads in (64, 8):
                c = make_prefill_case(g, rows=rows, heads=heads, topk=1024, device="cuda")
                res["rows"].append(run_table(timer, f"prefill {rows} rows {heads} heads "
                                             f"topk=1024+{SWA}", c.kwargs(), PREFILL, None, None,
                                             bw))
    res["ir"] = ir_summary()
    print(json.dumps(res["ir"]), flush=True)
    res["wall_s"] = time.time() - t0
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    print_tables(res)
    return 0


def print_tables(res: dict[str, Any]) -> None:
    print(f"\n{res['device']}, Triton {res['triton']}, sm_120 dispatch forced, "
          f"TRITON_OVERRIDE_ARCH=sm89; H200 copy {res['ceilings_h200']['copy_GBps']:.0f} GB/s")
    for r in res["rows"]:
        print(f"\n{r['shape']}: byte floor {r['floor_us_h200']:.1f} µs on the H200"
              + (f"; today {r['today_us']:.1f} µs ({r['today_ran']}, ok {r['today_ok']})"
                 if "today_us" in r else ""))
        print("| candidate | µs | × today/dispatch | roofline frac | ok | err | ran |")
        print("|---|---|---|---|---|---|---|")
        base = r.get("today_us") or (r.get("cand dispatch") or {}).get("us")
        for k, v in r.items():
            if not k.startswith("cand "):
                continue
            if isinstance(v, str):
                print(f"| {k[5:]} | {v} | | | | | |")
                continue
            x = base / v["us"] if base else float("nan")
            print(f"| {k[5:]} | {v['us']} | {x:.2f} | {v['roofline_frac']} | {v['ok']} | "
                  f"{v['err']} | {v['ran']} |")


if __name__ == "__main__":
    raise SystemExit(main())
