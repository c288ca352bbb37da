"""Temporary: the ws variant (staged and register producers) against wg, correctness + time,
same run; then the staged producer with parts switched off (results wrong on purpose)."""
from __future__ import annotations

import json
import os

import torch

from dsv4_kernels import sparse_decode as sd
from dsv4_kernels.bench import SWA, Timer
from dsv4_kernels.cases import compare_decode, make_decode_case
from dsv4_kernels.reference import ref_sparse_decode

timer = Timer(torch.device("cuda"))
g = torch.Generator().manual_seed(3)
CFGS = [("wg", "wg", {}), ("spec", "ws", {"WS_STAGED": "3", "WS_SPEC": "1"}),
        ("nospec", "ws", {"WS_STAGED": "3", "WS_SPEC": "0"})]
shapes = [(64, 512, 64, "full", 256, 64), (64, 1024, 64, "full", 256, 64),
          (64, 512, 64, "random", 61, 64), (8, 1024, 64, "full", 256, 64),
          (128, 512, 64, "full", 256, 64), (5, 512, 32, "random", 61, 3),
          (3, 512, 64, "zero", 256, 64), (1, 512, 64, "full", 256, 64)]
only = os.environ.get("PROBE_ONLY")
for bsz, topk, heads, lengths, ps, eps in shapes:
    c = make_decode_case(g, batch=bsz, heads=heads, topk=SWA, extra_topk=topk, page_size=ps,
                         extra_page_size=eps, lengths=lengths,
                         invalid_frac=0.1 if lengths == "random" else 0.0, device="cuda")
    kw = c.kwargs()
    ro, rl = ref_sparse_decode(**kw)
    for name, var, env in CFGS + CFGS[:3]:
        if only and name not in only.split(","):
            continue
        os.environ.update(env)
        cfg = sd.DecodeConfig(variant=var)
        row = {"shape": f"{bsz}:{topk} h{heads} {lengths} ps{ps}", "cfg": name}
        try:
            o, lse = sd.sparse_mla_decode(**kw, config=cfg)
            res = compare_decode(o, lse, ro, rl)
            row["ok"] = res["ok"]
            if not res["ok"]:
                row["detail"] = {k: v for k, v in res.items() if k != "ok"}
            st: dict = {}

            def run(st: dict = st, kw: dict = kw, cfg: sd.DecodeConfig = cfg) -> None:
                st["o"], st["l"] = sd.sparse_mla_decode(**kw, config=cfg)

            row["us"] = round(timer.graph(run), 2)
            row["graph_equal"] = bool(torch.equal(st["o"], o) and torch.equal(st["l"], lse))
        except Exception as exc:
            row["err"] = f"{type(exc).__name__}: {exc}"[:400]
        print(json.dumps(row, default=str), flush=True)

