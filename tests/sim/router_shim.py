"""`python -m sglang_router.launch_router` on a fake host: the real sglang-router 0.3.2, recorded.

Owns choosing what a fake host's router unit runs. Normally that is the real router (the Rust
router of the pinned sglang-router 0.3.2 wheel, its own `launch_router.main`), after one line in
`sim-runs.jsonl` (`"mode": "router", "impl": "real"`) so tests can count router starts and read
its argv like the engines'. The router double (`router.main`, `"impl": "double"`) runs instead
only when the control file addresses the router itself (`by_mode.router`, `by_port[PORT]` of
the router's `--port`, or a rule matching `"mode": "router"`): the faults the real router cannot
be made to show on demand (listen_delay_s, start_delay_s, never_ready with healthy workers,
crash_after_s, fail_generate while its workers are healthy). Every other behaviour — readiness,
`/workers`, the worker API, PD bootstrap fields, health checks — comes from the real router.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from . import control

# the real package directory, written by install_engine_env next to this module
REAL_DIR = (Path(__file__).with_name("router_real_dir.txt").read_text().strip()
            if Path(__file__).with_name("router_real_dir.txt").exists() else "")


def _port(argv: list[str]) -> int:
    for i, word in enumerate(argv):
        if word == "--port" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if word.startswith("--port="):
            return int(word.split("=", 1)[1])
    return 30000


def addresses_router(data: dict[str, Any], port: int) -> bool:
    """Whether a (validated) control file sets switches for the router itself."""
    if data.get("by_mode", {}).get("router"):
        return True
    if data.get("by_port", {}).get(str(port)):
        return True
    return any(r.get("match", {}).get("mode") == "router" for r in data.get("rules", []))


def main() -> int:
    argv = sys.argv[1:]
    env_dir = Path(os.environ.get("DSV4_SIM_ENV_DIR") or sys.prefix)
    port = _port(argv)
    try:
        data = control.load_control(control.control_path(env_dir))
    except control.ControlError as exc:
        sys.stderr.write(f"sglang_router (simulator): error: {exc}\n")
        return 2
    if addresses_router(data, port) or not REAL_DIR:
        from .router import main as double_main

        return double_main(argv)
    try:
        with open(control.runs_log_path(env_dir), "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "time": time.time(), "argv": argv,
                                 "mode": "router", "impl": "real", "port": port,
                                 "switches": {}, "unknown_args": []}) + "\n")
    except OSError as exc:
        sys.stderr.write(f"sglang_router (simulator): warning: cannot record run: {exc}\n")
    real = runpy.run_path(str(Path(REAL_DIR) / "launch_router.py"),
                          run_name="sglang_router._launch_router_real")
    real["main"]()
    return 0
