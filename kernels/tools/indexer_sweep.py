"""Device sweep of the DSA indexer: top-k methods and logits tunables at the 128K acceptance point.

``python kernels/tools/indexer_sweep.py`` (one GPU, a few minutes including compiles) builds the
bench's indexer case (B=64, 64 heads, C4 keys = ctx / 4, page 64, top-512, max context 1M; the
same pool, seeds and Timer as ``bench.bench_indexer``), then prints one table:

* top-k at 128K (32768 keys per row): the six-launch ``radix6``, the one-launch ``radix1`` and
  the split ``radix3`` under a few tunables, each checked bit for bit against ``radix6`` and by
  ``check_topk`` against ``torch.topk`` on a few rows, plus radix3's per-launch breakdown;
* top-k on tie-heavy logits (the 128K logits rounded to quarters) and at B=8 with 1M-token rows
  (262144 keys, random logits), where one program per row has the least parallelism;
* logits configurations at 128K, each judged against the fp32 reference;
* logits + top-k at 128K, 64K, 16K and 4K under a 1M maximum and at 4K@4K, old and new
  defaults and radix3 alternatives side by side, timed
  as ``bench._indexer_point`` times them (graph replays of logits then top-k, L2 flushed; the
  top-k share is the difference to the logits alone).

A variant that fails to compile or run prints ``fail: <reason>`` and the rest continue. Exit
status: 0 when every variant that ran was correct, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from bench import Timer, _index_pool, ceilings, indexer_point_inputs
from experiments import topk

from dsv4_kernels.cases import check_topk
from dsv4_kernels.indexer import (
    R3_BLOCK,
    R3_SEL_BLOCK,
    R3_SEL_WARPS,
    R3_WARPS,
    _topk_radix3,
    indexer_logits,
    radix3_nprog,
)
from dsv4_kernels.layout import INDEX_BYTES_PER_TOKEN
from dsv4_kernels.reference import ref_indexer_logits

BATCH, HEADS, PAGE, TOPK, RATIO, MAX_CTX = 64, 64, 64, 512, 4, 2**20

R3 = "radix3"
TOPK_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("radix6 block=2048 (older default)", dict(method="radix6")),
    ("radix1 default (previous default)", dict(method="radix1")),
    ("radix3 default", dict(method=R3)),
    ("radix3 fuse (B+C in one launch)", dict(method=R3, fuse=True)),
    ("radix3 direct=4096 (row select for rows <= 4096)", dict(method=R3, direct=4096)),
    ("radix3 sel_block=2048 sel_warps=8 (run 2 default)",
     dict(method=R3, sel_block=2048, sel_warps=8)),
    ("radix3 nprog=16", dict(method=R3, nprog=16)),
    ("radix3 block=512", dict(method=R3, block=512)),
]

# logits + top-k side by side at each (context, maximum context) point: (name, logits keywords,
# top-k keywords); the first is the previous package default
OLD_LOGITS: dict[str, Any] = dict(aligned=False, prefetch=False)
POINT_METHODS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("old defaults: logits unaligned, radix1", OLD_LOGITS, dict(method="radix1")),
    ("logits default, radix1", {}, dict(method="radix1")),
    ("defaults (auto = radix3)", {}, {}),
    ("logits default, radix3 fuse", {}, dict(method=R3, fuse=True)),
    ("logits default, radix3 direct=4096", {}, dict(method=R3, direct=4096)),
]

# logits settings (keywords of indexer_logits); the first is the package default. Run 11
# (notes v4) covered stages 5-8, nsplit 4-12, contiguous, block_n 32/128 and 8 warps.
LOGITS_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    # run 2: stages 4 108.8 µs, 6 85.7, nsplit 12 105.8, 6 90.7 (default 85.9)
    ("default (aligned, prefetch, 5 stages)", {}),
    ("old default (unaligned, no prefetch)", OLD_LOGITS),
    ("aligned, no prefetch", dict(prefetch=False)),
    ("contiguous", dict(contiguous=True)),
]


def _fail(exc: BaseException) -> str:
    return f"fail: {type(exc).__name__}: {str(exc).splitlines()[0][:140] if str(exc) else ''}"


class Sweep:
    """Collects rows of (section, variant, µs, ok, note) and prints them as one table."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, section: str, variant: str, us: float | None, ok: bool | None,
            note: str = "") -> None:
        row = {"section": section, "variant": variant, "us": us, "ok": ok, "note": note}
        self.rows.append(row)
        print(json.dumps(row), flush=True)

    def table(self) -> None:
        print("\n| section | variant | µs | ok | note |\n|---|---|---|---|---|")
        for r in self.rows:
            us = f"{r['us']:.1f}" if isinstance(r["us"], float) else "-"
            print(f"| {r['section']} | {r['variant']} | {us} | {r['ok']} | {r['note']} |")


def _time_topk(sw: Sweep, timer: Timer, section: str, logits: torch.Tensor, lens: torch.Tensor,
               pt: torch.Tensor, variants: list[tuple[str, dict[str, Any]]],
               check_rows: int = 4) -> None:
    """Time each top-k variant; the first variant's output is the reference for the others."""
    rows = logits.shape[0]
    ref: torch.Tensor | None = None
    for name, kw in variants:
        try:
            out = torch.empty(rows, TOPK, dtype=torch.int32, device=logits.device)
            raw = torch.empty_like(out)
            topk(logits, lens, pt, PAGE, TOPK, out=out, raw_out=raw, **kw)
            torch.cuda.synchronize()
            sub = slice(0, check_rows)
            tk = check_topk(out[sub], raw[sub], logits[sub], lens[sub], pt[sub], PAGE, TOPK)
            same = True if ref is None else bool(torch.equal(out, ref))
            if ref is None:
                ref = out.clone()
            t = timer.graph(lambda kw=kw, out=out: topk(logits, lens, pt, PAGE, TOPK,
                                                                out=out, **kw))
            note = "" if same else "differs from the first variant"
            sw.add(section, name, t, bool(tk["ok"]) and same, note)
        except Exception as exc:
            sw.add(section, name, None, None, _fail(exc))
        torch.cuda.empty_cache()


def _radix3_breakdown(sw: Sweep, timer: Timer, logits: torch.Tensor, lens: torch.Tensor,
                      pt: torch.Tensor) -> None:
    """radix3 (defaults, unfused) stopped after launch A, after B, and whole: the share of each
    launch (the stopped runs write no output)."""
    from dsv4_kernels._runtime import device_sms

    rows, max_len = logits.shape
    nprog = radix3_nprog(rows, device_sms(logits))
    out = torch.empty(rows, TOPK, dtype=torch.int32, device=logits.device)
    for stages in (1, 2, 3):
        try:
            t = timer.graph(lambda stages=stages: _topk_radix3(
                logits, lens, pt, PAGE, TOPK, out, out, False, max_len, nprog, R3_BLOCK,
                R3_WARPS, R3_SEL_BLOCK, R3_SEL_WARPS, 4096, TOPK, 7, 2, False, stages))
            sw.add("topk 128K B=64", f"radix3 launches 1..{stages} only", t, None)
        except Exception as exc:
            sw.add("topk 128K B=64", f"radix3 launches 1..{stages} only", None, None, _fail(exc))


def _time_point(sw: Sweep, timer: Timer, ceil: dict[str, float], setup: dict[str, Any], ctx: int,
                max_ctx: int) -> None:
    """Logits + top-k at one point for every method in ``POINT_METHODS`` (as ``bench``'s
    ``_indexer_point``: the top-k share is the total minus the logits alone)."""
    q, w, cache = setup["q"], setup["w"], setup["cache"]
    n, mk, pt, lens, ws, out, must = indexer_point_inputs(setup["used_pt"], BATCH, PAGE, TOPK,
                                                          RATIO, ctx, max_ctx)
    section = f"logits+topk {ctx // 1024}K@{max_ctx // 1024}K"
    t_logs: dict[bool, float] = {}
    for old in (True, False):
        name = "logits alone, " + ("old settings" if old else "default")
        try:
            t_logs[old] = timer.graph(lambda old=old: indexer_logits(
                q, cache, w, lens, pt, mk, out=ws, **(OLD_LOGITS if old else {})))
            sw.add(section, name, t_logs[old], None)
        except Exception as exc:
            sw.add(section, name, None, None, _fail(exc))
            return
    first: torch.Tensor | None = None
    for name, lkw, kw in POINT_METHODS:
        t_log = t_logs[lkw == OLD_LOGITS]

        def run_all(lkw: dict[str, Any] = lkw, kw: dict[str, Any] = kw) -> None:
            indexer_logits(q, cache, w, lens, pt, mk, out=ws, **lkw)
            topk(ws, lens, pt, PAGE, TOPK, out=out, **kw)
        try:
            t_all = timer.graph(run_all)
            replay_ok = timer.replay_matches_eager(run_all, out)
            same = first is None or bool(torch.equal(out, first))
            if first is None:
                first = out.clone()
            sub = slice(0, 4)
            tk = check_topk(out[sub], None, ws[sub, :n], lens[sub], pt[sub], PAGE, TOPK)
            ok = bool(tk["ok"]) and same and replay_ok
            frac = must / t_all / 1e3 / ceil["copy_GBps"]
            sw.add(section, name, t_all, ok, f"logits {t_log:.1f} topk {t_all - t_log:.1f} "
                   f"bw_frac {frac:.3f}" + ("" if same else " differs from the first"))
        except Exception as exc:
            sw.add(section, name, None, None, _fail(exc))
    torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="indexer sweep (one GPU)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--skip", default="", help="comma list: topk,ties,small,logits,points")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible; the sweep needs a GPU"}))
        return 2
    skip = set(args.skip.split(","))
    t0 = time.time()
    device = torch.device("cuda", torch.cuda.current_device())
    ceil = ceilings(device)
    print(json.dumps({"device": torch.cuda.get_device_name(device), **ceil}), flush=True)
    timer = Timer(device)
    sw = Sweep()

    # the bench's indexer setup (bench_indexer with ctxs up to 128K)
    n = 2**17 // RATIO
    mk = MAX_CTX // RATIO
    cache, used_pt = _index_pool(device, BATCH, n, PAGE)
    g = torch.Generator(device=device).manual_seed(11)
    q = (torch.randn(BATCH, HEADS, 128, device=device, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(BATCH, HEADS, device=device, generator=g) * HEADS ** -0.5
    pt = torch.zeros(BATCH, -(-mk // PAGE), dtype=torch.int32, device=device)
    pt[:, :used_pt.shape[1]] = used_pt
    lens = torch.full((BATCH,), n, dtype=torch.int32, device=device)
    ws = torch.empty(BATCH, mk, dtype=torch.float32, device=device)
    indexer_logits(q, cache, w, lens, pt, mk, out=ws)
    torch.cuda.synchronize()
    sub = slice(0, 4)
    ref = ref_indexer_logits(q[sub], cache, w[sub], lens[sub], pt[sub], n)
    rel = float((ws[sub, :n] - ref).norm() / ref.norm())
    logits_default = ws[:, :n].clone()

    if "topk" not in skip:
        _time_topk(sw, timer, "topk 128K B=64", ws, lens, pt, TOPK_VARIANTS)
        _radix3_breakdown(sw, timer, ws, lens, pt)
    if "logits" not in skip:
        for name, lkw in LOGITS_VARIANTS:
            def run(lkw: dict[str, Any] = lkw) -> None:
                indexer_logits(q, cache, w, lens, pt, mk, out=ws, **lkw)
            try:
                ws[:, :n].fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                err = float((ws[:, :n] - logits_default).norm() / logits_default.norm())
                # Judged against the fp32 reference, not the default: another tile shape can
                # take another MMA path (mma.sync instead of sm_90's imprecise fp8 wgmma
                # accumulation) and round differently (run 11: block_n 32 differed by 1.3e-4).
                err_ref = float((ws[sub, :n] - ref).norm() / ref.norm())
                written = bool(torch.isfinite(ws[:, :n]).all())
                t = timer.graph(run)
                ok = written and err_ref < 2e-3
                sw.add("logits 128K B=64", name, t, ok, f"rel err vs fp32 ref {err_ref:.1e} "
                       f"(default {rel:.1e}), vs default {err:.1e}")
            except Exception as exc:
                sw.add("logits 128K B=64", name, None, None, _fail(exc))
    if "points" not in skip:
        setup = {"q": q, "w": w, "cache": cache, "used_pt": used_pt}
        for ctx, max_ctx in ((2**17, MAX_CTX), (2**16, MAX_CTX), (2**14, MAX_CTX), (4096, MAX_CTX),
                             (4096, 4096)):
            _time_point(sw, timer, ceil, setup, ctx, max_ctx)
    if "small" not in skip:
        b8, n8 = 8, MAX_CTX // RATIO
        lg8 = torch.randn(b8, n8, device=device, generator=g)
        pt8 = torch.arange(b8 * (n8 // PAGE), dtype=torch.int32, device=device).view(b8, -1)
        lens8 = torch.full((b8,), n8, dtype=torch.int32, device=device)
        _time_topk(sw, timer, "topk 1M B=8", lg8, lens8, pt8,
                   [*TOPK_VARIANTS[:4], ("radix3 nprog=64", dict(method=R3, nprog=64))],
                   check_rows=2)
        del lg8
    if "ties" not in skip:
        tied = torch.round(ws * 4) / 4
        _time_topk(sw, timer, "topk 128K ties", tied, lens, pt, TOPK_VARIANTS[:4])
        del tied
    sw.table()
    print(f"\nwall {time.time() - t0:.0f} s, copy {ceil['copy_GBps']:.0f} GB/s; 128K target: "
          f"total <= {BATCH * n * INDEX_BYTES_PER_TOKEN / (0.5 * ceil['copy_GBps'] * 1e3):.0f} µs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceilings": ceil, "rows": sw.rows}, f, indent=1)
    return 1 if any(r["ok"] is False for r in sw.rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
