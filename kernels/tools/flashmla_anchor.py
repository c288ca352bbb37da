"""FlashMLA's sparse decode (SGLang 0.5.23's sm_90 production kernel) beside the bundled sm_90 pick.

``python kernels/tools/flashmla_anchor.py [--json out.json]`` on an H200, natively (no arch
override), with ``sgl-flash-mla`` 1.0.0 importable as ``flash_mla`` (the package SGLang 0.5.23
pins; carried to the device as a wheel).

FlashMLA is called as SGLang's ``flash_mla_interface.flash_mla_with_kvcache`` calls it for the
MODEL1 FP8 cache with the SWA layout not interleaved (``use_legacy=True``, an empty
``FlashMLASchedMeta`` filled by the first call), 64 heads, SWA 128 keys (page 256) plus top-k
512 / 1024 C4 keys (page 64), B = 1, 8, 64; the bundled kernel through its own dispatch (the
H200 picks ``dsplit`` / ``ws``). Both outputs are checked against the float32 reference; times
are medians of graph replays with a cold L2 (``bench.Timer``), and each is given as a fraction
of the byte roofline (unique KV + Q + O + indices over the copy bandwidth measured in the run).
Not part of the package.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

import torch
from bench import SWA, Timer, ceilings

from dsv4_kernels import sparse_decode as sd
from dsv4_kernels.cases import compare_decode, make_decode_case
from dsv4_kernels.reference import ref_sparse_decode


def flashmla_call(flash_mla: Any, kw: dict[str, Any]) -> Any:
    meta = flash_mla.get_mla_metadata()[0]

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        return flash_mla.flash_mla_with_kvcache(
            q=kw["q"], k_cache=kw["k_cache"], block_table=None, cache_seqlens=None,
            head_dim_v=512, tile_scheduler_metadata=meta, softmax_scale=kw["sm_scale"],
            is_fp8_kvcache=True, indices=kw["indices"], attn_sink=kw["attn_sink"],
            extra_k_cache=kw["extra_k_cache"], extra_indices_in_kvcache=kw["extra_indices"],
            topk_length=kw["topk_length"], extra_topk_length=kw["extra_topk_length"],
            use_legacy=True)
    return call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0),
                           "ceilings_h200": ceilings(dev), "rows": []}
    bw = res["ceilings_h200"]["copy_GBps"] * 1e9
    try:
        import flash_mla

        res["flash_mla"] = getattr(flash_mla, "__version__", "?")
    except Exception as exc:
        res["flash_mla"] = f"fail: {type(exc).__name__}: {str(exc)[:400]}"
        flash_mla = None
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}), flush=True)
    timer = Timer(dev)
    g = torch.Generator().manual_seed(90)
    ran: list[str] = []
    rows = sd._Launch.rows

    def recording(self: Any, *a: Any, **k: Any) -> Any:
        ran.append(f"{self.variant} bh{self.block_h} bt{self.block_t} nsplit{a[-1]}")
        return rows(self, *a, **k)

    sd._Launch.rows = recording  # type: ignore[method-assign]
    for topk in (512, 1024):
        for b in (1, 8, 64):
            c = make_decode_case(g, batch=b, heads=64, topk=SWA, extra_topk=topk,
                                 page_size=256, extra_page_size=64, device="cuda")
            kw = c.kwargs()
            ref = ref_sparse_decode(**kw)
            nbytes, _ = sd.roofline_bytes_flops(b, 64, SWA + topk)
            row: dict[str, Any] = {"shape": f"B={b} topk={topk}+{SWA}",
                                   "floor_us": nbytes / bw * 1e6}
            ran.clear()
            row["ours_ok"] = compare_decode(*sd.sparse_mla_decode(**kw), *ref)["ok"]
            row["ours_ran"] = "; ".join(ran)
            row["ours_us"] = timer.graph(lambda kw=kw: sd.sparse_mla_decode(**kw))
            row["ours_frac"] = row["floor_us"] / row["ours_us"]
            if flash_mla is not None:
                try:
                    call = flashmla_call(flash_mla, kw)
                    out = call()
                    chk = compare_decode(out[0], out[1], *ref)
                    row["flashmla_ok"] = chk["ok"]
                    row["flashmla_err"] = chk["out_rel_err"]
                    row["flashmla_us"] = timer.graph(call)
                    row["flashmla_frac"] = row["floor_us"] / row["flashmla_us"]
                    row["ours_over_flashmla"] = row["ours_us"] / row["flashmla_us"]
                except Exception as exc:
                    row["flashmla_us"] = f"fail: {type(exc).__name__}: {str(exc)[:300]}"
            print(json.dumps(row), flush=True)
            res["rows"].append(row)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    print(f"\n{res['device']}, flash_mla {res['flash_mla']}, copy "
          f"{res['ceilings_h200']['copy_GBps']:.0f} GB/s (native sm_90)")
    print("| shape | ours (ran) µs | frac | FlashMLA µs | frac | ours / FlashMLA | ok ours / FM |")
    print("|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        fm = r.get("flashmla_us")
        fms = f"{fm:.1f} | {r['flashmla_frac']:.2f} | {r['ours_over_flashmla']:.2f}" \
            if isinstance(fm, float) else f"{fm} | - | -"
        print(f"| {r['shape']} | {r['ours_us']:.1f} ({r['ours_ran']}) | {r['ours_frac']:.2f} | "
              f"{fms} | {r['ours_ok']} / {r.get('flashmla_ok')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
