"""Fetch SGLang 0.5.23's own sm_120 kernels from PyPI into a git-ignored folder for the benchmark.

The benchmark compares against the engine's shipped kernels, but their code must not be
committed here. This script downloads the pinned wheel with ``pip download --no-deps``, copies
out only the files the benchmark imports, and writes empty package ``__init__`` files plus one
stub (``sglang.srt.utils.common.is_gfx942_supported``, which the split-K kernel imports only to
pick AMD configs) so that those files import without the rest of SGLang.

Usage: ``python kernels/tools/fetch_baselines.py [--dest .baselines] [--wheel PATH]``
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import zipfile

VERSION = "0.5.23"
FILES = [
    "sglang/kernels/ops/attention/flash_mla_sm120_triton.py",
    "sglang/kernels/ops/attention/dsv4/triton_sparse_decode/__init__.py",
    "sglang/kernels/ops/attention/dsv4/triton_sparse_decode/triton_mla_kernels_decode_fused.py",
    "sglang/kernels/ops/attention/dsv4/triton_sparse_decode/triton_mla_kernels_decode_optimized.py",
    "sglang/srt/layers/attention/dsv4/indexer.py",
]
PACKAGES = [
    "sglang", "sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/attention",
    "sglang/kernels/ops/attention/dsv4", "sglang/srt", "sglang/srt/utils",
]
STUB = '"""Benchmark stub: the real helper detects AMD gfx942; the H200 is not one."""\n\n\n' \
       "def is_gfx942_supported() -> bool:\n    return False\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=".baselines")
    ap.add_argument("--wheel", help="use this sglang wheel instead of downloading one")
    args = ap.parse_args(argv)
    dest = pathlib.Path(args.dest)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                            f"sglang=={VERSION}", "-d", tmp], check=True)
            wheel = str(next(pathlib.Path(tmp).glob("sglang-*.whl")))
        if f"sglang-{VERSION}-" not in pathlib.Path(wheel).name:
            print(f"error: {wheel} is not sglang {VERSION}", file=sys.stderr)
            return 2
        with zipfile.ZipFile(wheel) as zf:
            for name in FILES:
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    for pkg in PACKAGES:
        init = dest / pkg / "__init__.py"
        init.parent.mkdir(parents=True, exist_ok=True)
        if not init.exists():
            init.write_text("")
    (dest / "sglang/srt/utils/common.py").write_text(STUB)
    (dest / "VERSION").write_text(VERSION + "\n")
    print(f"baselines from sglang {VERSION} in {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
