"""Compile a Gluon decode kernel of ``dsv4_kernels`` for sm_90 on the CPU and summarize the
PTX, for the CPU tests of ``wg`` and ``ws`` (the interpreter cannot run Gluon).

``compile_sm90(module, kernel, consts)`` runs the compile in a subprocess, because the test
suite sets ``TRITON_INTERPRET=1``, under which Gluon code cannot be compiled. It returns the
shared memory Triton allocates, the count of each wgmma shape, the ``setmaxnreg`` values and
the number of ``cp.async`` copies, of cluster-barrier arrivals and waits and of fp32 divisions
in the PTX, and the bytes of stack ptxas gives it (spills; from ``cuobjdump -res-usage``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_COMPILE = r"""
import importlib, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

module, kernel, consts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
fn = getattr(importlib.import_module(module), kernel)
ptrs = {"q_ptr": "*bf16", "a_bf16": "*bf16", "b_bf16": "*bf16", "o_ptr": "*bf16",
        "a_u8": "*u8", "b_u8": "*u8", "a_idx": "*i32", "b_idx": "*i32", "a_len": "*i32",
        "b_len": "*i32", "sink_ptr": "*fp32", "lse_ptr": "*fp32", "lp_ptr": "*fp32",
        "ks_ptr": "*fp32", "op_ptr": "*fp16" if consts.get("SCALED") else "*fp32",
        "qk_scale": "fp32"}
sig = {n: ("constexpr" if n in consts else ptrs.get(n, "i32")) for n in fn.arg_names}
# What the launchers guarantee (they refuse others) and Triton's runtime specialization then
# sees: 16-byte aligned pointers, page bytes and strides that are multiples of 16.
aligned = [n for n in fn.arg_names if sig[n].startswith("*") or n.endswith("_pb")
           or n.startswith("stride_")]
attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
ptx = k.asm["ptx"]
# ptxas's spills show in the cubin's resource usage, not in the PTX
import os, subprocess, tempfile
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(k.asm["cubin"])
    f.flush()
    usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
stack = int(re.search(r"STACK:(\d+)", usage).group(1))
shapes = {}
for m in re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx):
    shapes[m] = shapes.get(m, 0) + 1
regs = sorted({int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
print(json.dumps({"shared": k.metadata.shared, "wgmma": shapes, "setmaxnreg": regs,
                  "cp_async": len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)),
                  "cluster_arrive": len(re.findall(r"barrier\.cluster\.arrive", ptx)),
                  "cluster_wait": len(re.findall(r"barrier\.cluster\.wait", ptx)),
                  "div_f32": len(re.findall(r"\bdiv\.(?:full|rn|approx)\.f32", ptx)),
                  "stack": stack}))
"""


def compile_sm90(module: str, kernel: str, consts: dict[str, Any]) -> dict[str, Any]:
    """Compile ``module.kernel`` with the constexprs ``consts``; see the module docstring."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "experimental")])
    res = subprocess.run([sys.executable, "-c", _COMPILE, module, kernel, json.dumps(consts)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
