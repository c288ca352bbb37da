"""Engine simulator: test doubles for SGLang 0.5.23, sglang-router 0.3.2 and nvidia-smi.

Owns everything a fake host runs instead of the real engine stack, which cannot run on this
machine (no weights, no sm_120 GPU). Production code never knows it talks to a simulator: the
doubles live under the same command names (`<env>/bin/sglang serve ...`,
`<env>/bin/python -m sglang_router.launch_router ...`, `nvidia-smi`) and the same HTTP
endpoints and metric names.

- `install_engine_env(dest_dir, python)`: makes `dest_dir` a venv (built from the base
  interpreter of `python`, without the real sglang: the simulator neither shadows nor needs
  `/work/main/.venv`'s sglang) whose `bin/sglang` runs `engine.main` and whose
  `python -m sglang_router.launch_router` runs **the real sglang-router 0.3.2** (the Rust router
  in the pinned wheel, requirements/parsers.txt) from `python`'s environment: its package and its
  dependency closure are linked into `dest_dir/lib/router-pkgs/`, and a thin `sglang_router`
  package in front of it (`router_shim`) records each start in `sim-runs.jsonl` and hands over to
  the real `launch_router.main`. The router double (`router.main`) runs instead only when the
  control file asks the router for a fault (`router_shim.DOUBLE_ONLY`): faults the real router
  cannot be made to show. The simulator's code is copied into `dest_dir/lib/dsv4sim-pkgs/` (a
  `.pth` file puts it on the venv's path), so the env works inside a fake host's private mount
  namespace.
- `install_fake_nvidia_smi(bin_dir, python, config=None)`: writes `bin_dir/nvidia-smi` and its
  GPU config `bin_dir/nvidia-smi.json` (see `nvidia_smi`).
- Behaviour switches: `control` (control file `<env>/sim-control.json` or `$DSV4_SIM_CONTROL`,
  read at process start). Text behaviour (token rule, needle protocol, reasoning, tool calls,
  sampling defaults): `textgen`. Each start is logged to `<env>/sim-runs.jsonl`.

Sim-only response fields (a real server does not send them; production code must not need
them): `sim_sampling` (effective temperature/top_p/top_k/min_p applied, on non-streaming
responses and the first stream chunk) and `sim_meta` (how a needle question was treated).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SIM_DIR = Path(__file__).resolve().parent
_MODULES = ("__init__.py", "control.py", "engine.py", "httpbase.py", "metrics.py", "router.py",
            "router_shim.py", "textgen.py", "nvidia_smi.py")

_ROUTER_PKG_INIT = '''"""sglang_router of a fake host: the real package joins this one (tests/sim)."""
from dsv4sim.router_shim import REAL_DIR

__path__.append(REAL_DIR)  # every module but launch_router comes from the real package
from sglang_router.version import __version__  # noqa: E402
'''
_ROUTER_LAUNCH = '''"""`python -m sglang_router.launch_router`: record the start, run the real router."""
import sys

from dsv4sim.router_shim import main

if __name__ == "__main__":
    sys.exit(main())
'''


def router_closure(python: str = sys.executable) -> tuple[str, list[str]]:
    """(the real sglang_router package dir, every top-level path of sglang-router 0.3.2 and of its
    dependency closure) in `python`'s environment; raises RuntimeError when it is not installed."""
    probe = r'''
import importlib.metadata as md, json, re, sys
seen, todo, paths = set(), ["sglang-router"], set()
while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    seen.add(key)
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        if name == "sglang-router":
            sys.exit("sglang-router is not installed: pip install --no-deps -r requirements/parsers.txt")
        continue  # a requirement for another Python (exceptiongroup, async-timeout)
    for req in dist.requires or []:
        if "extra ==" not in req:
            todo.append(re.match(r"[A-Za-z0-9_.-]+", req).group(0))
    for f in dist.files or []:
        top = f.parts[0]
        if top not in ("..", "__pycache__") and not top.endswith((".dist-info", ".data")):
            paths.add(str(dist.locate_file(top)))
import sglang_router
print(json.dumps([sglang_router.__path__[0], sorted(paths)]))
'''
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cannot find the real sglang-router in {python}: "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    real, paths = json.loads(proc.stdout)
    return real, paths


def _base_python(python: str) -> str:
    """The base interpreter behind `python` (a venv's python resolves to its base install)."""
    out = subprocess.run(
        [python, "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"],
        check=True, capture_output=True, text=True)
    return out.stdout.strip()


def install_engine_env(dest_dir: Path, python: str = sys.executable, *, with_pip: bool = False,
                       runtime_prefix: Path | None = None) -> Path:
    """Create the engine environment at `dest_dir`; return the path of its `bin/sglang`.

    `runtime_prefix` is where the env will be seen by the processes that use it (inside a fake
    host the host-side directory is bind-mounted at e.g. `/opt/sglang-env`); it defaults to
    `dest_dir`. Idempotent: re-running refreshes the simulator code.
    """
    dest_dir = Path(dest_dir)
    prefix = Path(runtime_prefix or dest_dir)
    if not (dest_dir / "pyvenv.cfg").exists():
        cmd = [_base_python(python), "-m", "venv"]
        if not with_pip:
            cmd.append("--without-pip")
        subprocess.run([*cmd, str(dest_dir)], check=True, capture_output=True, text=True)
    pkgs = dest_dir / "lib" / "dsv4sim-pkgs"
    sim = pkgs / "dsv4sim"
    router = pkgs / "sglang_router"
    sglang_cli = pkgs / "sglang"
    for d in (sim, router, sglang_cli):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    for name in _MODULES:
        shutil.copy2(SIM_DIR / name, sim / name)
    real_dir, closure = router_closure(python)
    (sim / "router_real_dir.txt").write_text(real_dir + "\n")
    deps = dest_dir / "lib" / "router-pkgs"
    if deps.exists():
        shutil.rmtree(deps)
    deps.mkdir()
    for path in closure:
        if Path(path).name != "sglang_router":  # that one is reached through the shim's __path__
            os.symlink(path, deps / Path(path).name)
    (router / "__init__.py").write_text(_ROUTER_PKG_INIT)
    (router / "launch_router.py").write_text(_ROUTER_LAUNCH)
    # `sglang.cli.main:main`, the entry point behind the real `bin/sglang`: the launch script calls
    # it directly when secret flags are appended in-process (orchestrator/render/secrets.py).
    (sglang_cli / "__init__.py").write_text('"""sglang double installed by tests/sim."""\n')
    (sglang_cli / "cli").mkdir()
    (sglang_cli / "cli" / "__init__.py").write_text("")
    (sglang_cli / "cli" / "main.py").write_text(
        '"""`sglang.cli.main:main` of the simulator: `sglang serve ARGS` from sys.argv."""\n'
        "from dsv4sim.engine import main\n")
    # The version the bundled kernels' hook is pinned to (dsv4_kernels.sglang_hook reads it from
    # the distribution metadata): with kernels.enabled the real hook installs its .pth line and
    # activates in the simulator's process, logging which release's kernels it imported.
    dist = pkgs / "sglang-0.5.23.dist-info"
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    site = next((dest_dir / "lib").glob("python3*/site-packages"))
    # the simulator first (its sglang_router shim shadows the real package it extends)
    (site / "dsv4sim.pth").write_text(str(prefix / "lib" / "dsv4sim-pkgs") + "\n"
                                      + str(prefix / "lib" / "router-pkgs") + "\n")
    sglang = dest_dir / "bin" / "sglang"
    sglang.write_text(
        "#!/bin/sh\n"
        "# sglang console script of the engine simulator (tests/sim), not the real SGLang.\n"
        f'exec "{prefix}/bin/python" -m dsv4sim.engine "$@"\n')
    sglang.chmod(0o755)
    return sglang


def install_fake_nvidia_smi(bin_dir: Path, python: str = sys.executable,
                            config: dict[str, Any] | None = None) -> Path:
    """Write `bin_dir/nvidia-smi` (+ `nvidia-smi.json` when `config` is given); return its path."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    src = (SIM_DIR / "nvidia_smi.py").read_text()
    script.write_text(f"#!{_base_python(python)} -S\n" + src)
    script.chmod(0o755)
    if config is not None:
        (bin_dir / "nvidia-smi.json").write_text(json.dumps(config, indent=2))
    return script
