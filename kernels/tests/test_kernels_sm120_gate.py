"""The sm_120 compile gate (issue 24): every kernel the sm_120 dispatch can run, at every tile
configuration it can choose, compiled on the CPU for ``GPUTarget("cuda", 120, 32)`` (the RTX PRO
6000 the tool deploys to) with the pinned Triton.

Each build must fit sm_120's shared memory per block (101,376 B opt-in, CUDA C programming guide,
compute capability 12.0), spill nothing (ptxas's spill stores and the cubin's stack are 0), use
the pre-Hopper ``mma.sync`` tensor-core instructions (no ``wgmma``, which sm_120 lacks) where it
multiplies matrices, and match ``sm120_gate.json``: shared memory, registers a thread and the
MMA counts recorded there, so any change in what ptxas makes of a kernel shows in review. After
a deliberate change: ``DSV4_SM120_GATE_UPDATE=1 pytest kernels/tests/test_kernels_sm120_gate.py``
rewrites the table (the limits above still apply), and the diff is reviewed.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import triton
from triton_compile import compile_kernel

from dsv4_kernels.indexer import R3_BLOCK, R3_SEL_BLOCK, R3_SEL_WARPS, R3_WARPS, _window_consts
from dsv4_kernels.sparse_decode import _VARIANT_TILES, combine_block_h, dispatch_configs

SM120_SMEM = 101376  # opt-in shared memory per block on compute capability 12.0
TABLE = Path(__file__).with_name("sm120_gate.json")
SD, IX = "dsv4_kernels.sparse_decode", "dsv4_kernels.indexer"


def sm120_builds() -> dict[str, tuple[str, str, dict[str, Any], int, int]]:
    """name -> (module, kernel, constexprs, num_warps, num_stages) for everything the sm_120
    dispatch can launch: each configuration of ``dispatch_configs`` at each head block it
    takes for some head count, one split and several (fp16 partials, the default), with and
    without the extra key list; the split combine at its head blocks with the most splits; the
    indexer's logits (clean and not) and its three top-k launches at top-k 512 and 1024 with
    their default tiles."""
    builds: dict[str, tuple[str, str, dict[str, Any], int, int]] = {}
    for cfg in dispatch_configs(SM120_SMEM, 120):
        v = cfg.variant
        assert v in ("pf", "local"), f"the gate knows pf and local only; add {v}'s builds here"
        bt, stages, warps = _VARIANT_TILES[v]
        bt, stages, warps = cfg.block_t or bt, cfg.num_stages or stages, cfg.num_warps or warps
        assert cfg.block_h is not None
        for bh in sorted({min(cfg.block_h, max(16, triton.next_power_of_2(h)))
                          for h in (1, 8, 16, 32, 64, 128)}):
            # one split, several (fp16 partials, the default), SWA-only layers, and for local
            # the most splits, where each split's round is one tile
            for nsplit, has_b, rnd in ((1, True, 2), (4, True, 2), (4, False, 2), (16, True, 1)):
                if v == "pf" and rnd == 1:
                    continue
                consts: dict[str, Any] = dict(
                    A_HAS_LEN=True, HAS_B=has_b, B_HAS_LEN=has_b, HAS_SINK=True, NSPLIT=nsplit,
                    BH=bh, BT=bt, DOT_F32=False, SCALED=nsplit > 1)
                name = f"{v} bh{bh} bt{bt} w{warps} nsplit{nsplit}{'' if has_b else ' swa-only'}"
                if v == "pf":
                    consts["PREFETCH"] = True
                    builds[name] = (SD, "_sparse_decode_pf_kernel", consts, warps, stages)
                else:  # the launcher passes STAGES and leaves Triton's default num_stages (3)
                    consts.update(STAGES=stages, ROUND=rnd, BG=bt, LOAD_EV="evict_first",
                                  STORE_EV="evict_last")
                    builds[f"{name} s{stages} round{rnd}"] = (
                        SD, "_sparse_decode_local_kernel", consts, warps, 3)
    for bhc in sorted({combine_block_h(rows, 64) for rows in (1, 64)}):
        builds[f"combine bh{bhc} nsplit16"] = (SD, "_combine_kernel", dict(
            HAS_SINK=True, NSPLIT=16, BH=bhc, DC=128, SCALED=True), 4, 1)
    for clean in (False, True):
        builds[f"logits bn64 hp64{' clean' if clean else ''}"] = (IX, "_logits_kernel", dict(
            NSPLIT=8, BN=64, HP=64, CLEAN=clean, DOT_F32=False, CONTIG=False, ALIGNED=True,
            PREFETCH=True), 4, 5)
    for k in (512, 1024):
        nb, msh, anchor = _window_consts(k, R3_BLOCK, 4096, 7, 2)
        builds[f"topk-A k{k}"] = (IX, "_split_hist_kernel", dict(
            CH=R3_BLOCK, SAMPLE=1024, RUN=16, NB=nb, MSH=msh, ANCHOR=anchor, DIRECT=k, P=8),
            R3_WARPS, 3)
        builds[f"topk-B k{k}"] = (IX, "_split_compact_kernel", dict(
            K=k, CH=R3_BLOCK, CAP=4096, NB=nb, MSH=msh, DIRECT=k, P=8), R3_WARPS, 3)
        builds[f"topk-C k{k}"] = (IX, "_split_select_kernel", dict(
            K=k, KP=k, CH=R3_SEL_BLOCK, CAP=4096, NB=nb, MSH=msh, DIRECT=k, P=8,
            WRITE_RAW=True), R3_SEL_WARPS, 3)
    return builds


def gate_failures(name: str, got: dict[str, Any], kernel: str) -> list[str]:
    """What is wrong with one build, whatever the table says."""
    bad = []
    if got["shared"] > SM120_SMEM:
        bad.append(f"{name}: {got['shared']} B of shared memory > sm_120's {SM120_SMEM}")
    if got["spill_stores"] or got["spill_loads"] or got["stack"]:
        bad.append(f"{name}: spills ({got['spill_stores']} B stores, {got['spill_loads']} B "
                   f"loads, {got['stack']} B stack a thread)")
    if got["wgmma"]:
        bad.append(f"{name}: wgmma {got['wgmma']} (sm_120 has none)")
    if kernel in ("_sparse_decode_pf_kernel", "_sparse_decode_local_kernel", "_logits_kernel") \
            and not got["mma_sync"]:
        bad.append(f"{name}: no mma.sync: its products would run on CUDA cores")
    return bad


def test_sm120_compile_gate() -> None:
    builds = sm120_builds()
    with ThreadPoolExecutor(max_workers=max(1, min(4, (os.cpu_count() or 2)))) as pool:
        futs = {name: pool.submit(compile_kernel, mod, kern, consts, 120, warps, stages)
                for name, (mod, kern, consts, warps, stages) in builds.items()}
        got = {name: f.result() for name, f in futs.items()}
    print("\nsm_120 build                        shared B  regs  spill  mma.sync")
    for name, r in got.items():
        print(f"{name:35s} {r['shared']:8d} {r['regs']:5d} {r['spill_stores']:6d}  "
              f"{r['mma_sync']}")
    failures = [f for name, r in got.items() for f in gate_failures(name, r, builds[name][1])]
    keep = ("shared", "regs", "mma_sync", "wgmma")
    table = {name: {k: r[k] for k in keep} for name, r in got.items()}
    if os.environ.get("DSV4_SM120_GATE_UPDATE") == "1":
        TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(TABLE.read_text())
    for name in sorted(set(table) | set(recorded)):
        if table.get(name) != recorded.get(name):
            failures.append(f"{name}: compiled {table.get(name)}, recorded "
                            f"{recorded.get(name)} in {TABLE.name}")
    assert not failures, "\n".join(failures)
