"""Compile a ``@triton.jit`` kernel of ``dsv4_kernels`` for a GPU target on the CPU (no GPU) and
summarize what ptxas made of it: for the sm_120 compile gate (``test_kernels_sm120_gate.py``)
and the bench's PTX check.

``compile_kernel(module, kernel, consts, arch=120, num_warps=..., num_stages=...)`` runs the
compile in a subprocess (the test suite sets ``TRITON_INTERPRET=1``, under which Triton does not
compile) and returns the shared memory Triton allocates, the registers a thread and the stack
bytes a thread ptxas gives the cubin (``cuobjdump -res-usage``: stack in a Triton kernel is
spills), ptxas's own spill-store/-load byte counts, the count of each ``mma.sync`` and
``wgmma`` shape in the PTX, and from the TTGIR the software pipeliner's shared-memory rings
(``buffers``: shapes with their leading buffer count) and the depths of its async waits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_COMPILE = r"""
import importlib, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

module, kernel, consts, arch, warps, stages = sys.argv[1:7]
consts = json.loads(consts)
fn = getattr(importlib.import_module(module), kernel)
ptrs = {"q_ptr": "*bf16", "a_bf16": "*bf16", "b_bf16": "*bf16", "o_ptr": "*bf16",
        "a_u8": "*u8", "b_u8": "*u8", "a_idx": "*i32", "b_idx": "*i32", "a_len": "*i32",
        "b_len": "*i32", "sink_ptr": "*fp32", "lse_ptr": "*fp32", "lp_ptr": "*fp32",
        "ks_ptr": "*fp32", "op_ptr": "*fp16" if consts.get("SCALED") else "*fp32",
        "qk_scale": "fp32",
        # the combine
        "o_part": "*fp16" if consts.get("SCALED") else "*fp32", "l_part": "*fp32",
        "k_part": "*fp32", "b_delta": "i64", "kv_ptr": "*bf16", "ok_ptr": "*i8",
        # the indexer
        "w_ptr": "*fp32", "kv_u8": "*u8", "kv_f32": "*fp32", "pt_ptr": "*i32",
        "len_ptr": "*i32", "logit_ptr": "*fp32", "hist_ptr": "*i32", "base_ptr": "*i32",
        "cnt_ptr": "*i32", "lpos_ptr": "*i32", "lkey_ptr": "*i32", "raw_ptr": "*i32"}
if module.endswith("indexer"):
    ptrs.update(q_ptr="*u8", out_ptr="*i32" if kernel != "_logits_kernel" else "*fp32")
if module.endswith("mhc_pre_gemm"):  # bf16 rows and weight halves, fp32 mixes
    ptrs.update(y_ptr="*bf16", res_ptr="*bf16", post_ptr="*fp32", comb_ptr="*fp32",
                fnh_ptr="*bf16", fnl_ptr="*bf16", res_out_ptr="*bf16", mix_ptr="*fp32",
                sq_ptr="*fp32")
sig = {n: ("constexpr" if n in consts else ptrs.get(n, "i32")) for n in fn.arg_names}
# what the launchers guarantee and Triton's runtime specialization then sees: 16-byte aligned
# pointers, page bytes and strides that are multiples of 16
aligned = [n for n in fn.arg_names if sig[n].startswith("*") or n.endswith("_pb")
           or n.startswith("stride_")]
attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", int(arch), 32),
                   options={"num_warps": int(warps), "num_stages": int(stages)})
ptx = k.asm["ptx"]
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
with tempfile.TemporaryDirectory() as d:
    cub = os.path.join(d, "k.cubin")
    with open(cub, "wb") as f:
        f.write(k.asm["cubin"])
    usage = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", cub],
                           capture_output=True, text=True).stdout
    px = os.path.join(d, "k.ptx")
    with open(px, "w") as f:
        f.write(ptx)
    gpu = "sm_%sa" % arch if int(arch) >= 90 else "sm_%s" % arch
    tool = "ptxas-blackwell" if int(arch) >= 100 and os.path.exists(
        os.path.join(bindir, "ptxas-blackwell")) else "ptxas"
    # the flags Triton's make_cubin passes (backends/nvidia/compiler.py), so that the log
    # describes the cubin Triton builds
    info = subprocess.run([os.path.join(bindir, tool), "-lineinfo", "-v",
                           "--regAllocOptLevel=2", "--gpu-name", gpu, px, "-o",
                           os.path.join(d, "v.cubin")], capture_output=True, text=True).stderr
spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
if spill is None:
    raise SystemExit("ptxas -v gave no spill line:\n" + info[-2000:])
ir = k.asm["ttgir"]
# the pipeliner's rings (shared-memory allocations with a leading buffer count) and the depths
# of its async waits: one buffer and wait 0 mean each tile's copy is waited for in full
buffers = sorted(set(re.findall(r"local_alloc : \(\) -> !ttg\.memdesc<(\d+x[0-9x]*[a-z]+\d+)", ir)))
waits = sorted(set(int(n) for n in re.findall(r"async_wait[^{]*\{num = (\d+)", ir)))
mma, wgmma = {}, {}
for m in re.findall(r"mma\.sync\.aligned\.(m\d+n\d+k\d+)\.row\.col\.(\w+)\.(\w+)", ptx):
    key = f"{m[0]}.{m[1]}.{m[2]}"
    mma[key] = mma.get(key, 0) + 1
for m in re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx):
    wgmma[m] = wgmma.get(m, 0) + 1
print(json.dumps({"shared": k.metadata.shared,
                  "regs": int(re.search(r"REG:(\d+)", usage).group(1)),
                  "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
                  "spill_stores": int(spill.group(1)) if spill else -1,
                  "spill_loads": int(spill.group(2)) if spill else -1,
                  "mma_sync": mma, "wgmma": wgmma, "buffers": buffers, "async_waits": waits}))
"""


def compile_kernel(module: str, kernel: str, consts: dict[str, Any], arch: int = 120,
                   num_warps: int = 4, num_stages: int = 1) -> dict[str, Any]:
    """Compile ``module.kernel`` with the constexprs ``consts``; see the module docstring."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "experimental")])
    res = subprocess.run([sys.executable, "-c", _COMPILE, module, kernel, json.dumps(consts),
                          str(arch), str(num_warps), str(num_stages)],
                         capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        raise RuntimeError(f"compiling {module}.{kernel} {consts} for sm_{arch} failed:\n"
                           + res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # python kernels/tests/triton_compile.py MODULE KERNEL CONSTS [ARCH W S]
    a = sys.argv[1:]
    print(json.dumps(compile_kernel(a[0], a[1], json.loads(a[2]), *(int(x) for x in a[3:]))))
