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

The bf16 mHC pre GEMM of issue 25 (``mhc_pre_gemm._post_pre_kernel``, hooked with
``DSV4_KERNELS_BF16_GEMMS=1``) is part of the same gate, at the tiles its launcher uses.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import triton
from triton_compile import compile_kernel

from dsv4_kernels import mhc_pre_gemm as mhc
from dsv4_kernels.indexer import R3_BLOCK, R3_SEL_BLOCK, R3_SEL_WARPS, R3_WARPS, _window_consts
from dsv4_kernels.sparse_decode import _VARIANT_TILES, combine_block_h, dispatch_configs

SM120_SMEM = 101376  # opt-in shared memory per block on compute capability 12.0
TABLE = Path(__file__).with_name("sm120_gate.json")
SD, IX, MHC = "dsv4_kernels.sparse_decode", "dsv4_kernels.indexer", "dsv4_kernels.mhc_pre_gemm"
MMA_KERNELS = ("_sparse_decode_pf_kernel", "_sparse_decode_local_kernel", "_logits_kernel",
               "_post_pre_kernel")


def sm120_builds() -> dict[str, tuple[str, str, dict[str, Any], int, int]]:
    """name -> (module, kernel, constexprs, num_warps, num_stages) for everything the sm_120
    dispatch can launch: each configuration of ``dispatch_configs`` at each head block it
    takes for some head count, one split and several (fp16 partials, the default), with and
    without the extra key list; the split combine at its head blocks with the most splits; the
    indexer's logits (clean and not) and its three top-k launches at top-k 512 and 1024 with
    their default tiles; the mHC pre GEMM at DeepSeek-V4-Flash's shape with and without the
    fused post (the hook always fuses it; ``hc_pre`` callers do not) at its launcher's
    defaults (:func:`mhc_pre_build`)."""
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
    for do_post in (True, False):
        consts, warps, stages = mhc_pre_build(do_post)
        builds[f"mhc-pre bm{consts['BM']} bk{consts['BK']} splits{consts['SPLITS']} w{warps}"
               f"{' post' if do_post else ''}"] = (MHC, "_post_pre_kernel", consts, warps, stages)
    return builds


def mhc_pre_build(do_post: bool, hidden: int = 4096, n: int = 24) -> tuple[dict[str, Any], int,
                                                                             int]:
    """The constexprs, warps and stages ``mhc_post_pre_partials`` launches with by default (its
    own keyword defaults, read from its signature, so a changed default changes the build)."""
    import inspect

    d = {k: p.default for k, p in inspect.signature(mhc.mhc_post_pre_partials).parameters.items()}
    splits = d["splits"]
    bk = d["block_k"] or min(hidden // splits, 32)
    consts = dict(H=hidden, N=n, NP=mhc.N_PAD, WS=n if d["packed"] else mhc.N_PAD,
                  SPLITS=splits, BM=d["block_m"], BK=bk, DO_POST=do_post, USE_LO=d["use_lo"],
                  DOT_F32=False)
    fn = getattr(mhc._post_pre_kernel, "fn", mhc._post_pre_kernel)  # the interpreter wraps it
    want = {k for k, p in inspect.signature(fn).parameters.items()
            if "constexpr" in str(p.annotation)}
    assert set(consts) == want, f"every constexpr pinned: {sorted(want ^ set(consts))}"
    return consts, d["num_warps"], d["num_stages"]


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
    if kernel in MMA_KERNELS and not got["mma_sync"]:
        bad.append(f"{name}: no mma.sync: its products would run on CUDA cores")
    if kernel == "_post_pre_kernel" and not any(k.endswith(".bf16") for k in got["mma_sync"]):
        bad.append(f"{name}: no bf16 mma.sync ({got['mma_sync']}): the point of the kernel")
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
    keep = ("shared", "regs", "mma_sync", "wgmma", "buffers", "async_waits")
    table = {name: {k: r[k] for k in keep} for name, r in got.items()}
    if os.environ.get("DSV4_SM120_GATE_UPDATE") == "1":
        TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(TABLE.read_text())
    for name in sorted(set(table) | set(recorded)):
        if table.get(name) != recorded.get(name):
            failures.append(f"{name}: compiled {table.get(name)}, recorded "
                            f"{recorded.get(name)} in {TABLE.name}")
    assert not failures, "\n".join(failures)
