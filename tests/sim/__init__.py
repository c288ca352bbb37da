"""Engine simulator: test doubles for SGLang 0.5.23, sglang-router 0.3.2 and nvidia-smi.

Owns everything a fake host runs instead of the real engine stack, which cannot run on this
machine (no weights, no sm_120 GPU). Production code never knows it talks to a simulator: the
doubles live under the same command names (`<env>/bin/sglang serve ...`,
`<env>/bin/python -m sglang_router.launch_router ...`, `nvidia-smi`) and the same HTTP
endpoints and metric names.

- `install_engine_env(dest_dir, python)`: makes `dest_dir` a venv (built from the base
  interpreter of `python`, without the real sglang: the simulator neither shadows nor needs
  `/work/main/.venv`'s sglang) whose `bin/sglang` runs `engine.main` and whose
  `python -m sglang_router.launch_router` runs `router.main`. The simulator's code is copied into
  `dest_dir/lib/dsv4sim-pkgs/` (a `.pth` file puts it on the venv's path), so the env works inside
  a fake host's private mount namespace.
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
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SIM_DIR = Path(__file__).resolve().parent
_MODULES = ("__init__.py", "control.py", "engine.py", "httpbase.py", "metrics.py", "router.py",
            "textgen.py", "nvidia_smi.py")

_ROUTER_PKG_INIT = '''"""Router double installed by tests/sim: not the real sglang-router."""
'''
_ROUTER_LAUNCH = '''"""`python -m sglang_router.launch_router`: delegates to the simulator's router double."""
import sys

from dsv4sim.router import main

if __name__ == "__main__":
    sys.exit(main())
'''


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
    site = next((dest_dir / "lib").glob("python3*/site-packages"))
    (site / "dsv4sim.pth").write_text(str(prefix / "lib" / "dsv4sim-pkgs") + "\n")
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
