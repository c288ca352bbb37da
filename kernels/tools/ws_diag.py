"""Temporary: ws with the producer's conversion or gather switched off (results wrong)."""
from __future__ import annotations

import json
import os

import torch

from dsv4_kernels import sparse_decode as sd
from dsv4_kernels.bench import SWA, Timer
from dsv4_kernels.cases import make_decode_case

timer = Timer(torch.device("cuda"))
g = torch.Generator().manual_seed(3)
for topk in (512, 1024):
    c = make_decode_case(g, batch=64, heads=64, topk=SWA, extra_topk=topk, page_size=256,
                         extra_page_size=64, device="cuda")
    kw = c.kwargs()
    for name, v, d in [("wg", "wg", "0"), ("ws", "ws", "0"), ("ws no conversion", "ws", "1"),
                       ("ws no gather", "ws", "2"), ("wg", "wg", "0"), ("ws", "ws", "0")]:
        os.environ["WS_DIAG"] = d
        cfg = sd.DecodeConfig(variant=v)
        us = timer.graph(lambda cfg=cfg: sd.sparse_mla_decode(**kw, config=cfg))
        print(json.dumps({"topk": topk, "cfg": name, "us": round(us, 2)}), flush=True)
