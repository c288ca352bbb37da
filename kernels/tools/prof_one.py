"""Run one sparse-decode configuration a few times (for ncu: profile the last launch)."""

from __future__ import annotations

import sys

import torch

from dsv4_kernels.bench import SWA
from dsv4_kernels.cases import make_decode_case
from dsv4_kernels.sparse_decode import DecodeConfig, sparse_mla_decode

variant = sys.argv[1]
bt, nw, bsz, topk = (int(x) for x in sys.argv[2:6])
c = make_decode_case(torch.Generator().manual_seed(5), batch=bsz, heads=64, topk=SWA,
                     extra_topk=topk, page_size=256, extra_page_size=64, device="cuda")
cfg = DecodeConfig(variant=variant, block_t=bt, num_warps=nw)
for _ in range(3):
    sparse_mla_decode(**c.kwargs(), config=cfg)
torch.cuda.synchronize()
