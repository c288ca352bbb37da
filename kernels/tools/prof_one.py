"""Run one sparse-decode configuration a few times (for ncu: profile the last call's kernels).

``python kernels/tools/prof_one.py VARIANT BT NUM_WARPS BATCH TOPK [field=value ...]``: extra
``DecodeConfig`` fields (``num_stages=2 nsplit=1 stage_block=64``) as integers. Four calls are
made; skip the first three calls' launches in ncu (``--launch-skip``) to profile the last.
"""

from __future__ import annotations

import sys

import torch
from bench import SWA

from dsv4_kernels.cases import make_decode_case
from dsv4_kernels.sparse_decode import DecodeConfig, sparse_mla_decode

variant = sys.argv[1]
bt, nw, bsz, topk = (int(x) for x in sys.argv[2:6])
extra = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[6:])}
c = make_decode_case(torch.Generator().manual_seed(5), batch=bsz, heads=64, topk=SWA,
                     extra_topk=topk, page_size=256, extra_page_size=64, device="cuda")
cfg = DecodeConfig(variant=variant, block_t=bt, num_warps=nw, **extra)  # type: ignore[arg-type]
for _ in range(4):
    sparse_mla_decode(**c.kwargs(), config=cfg)
torch.cuda.synchronize()
