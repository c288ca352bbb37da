"""Fake `nvidia-smi` for fake hosts: prints the GPU list a test configures, in the real formats.

Owns the GPU facts a fake host reports, so the orchestrator's GPU probe (a command plus a
parser) runs unchanged against fake hosts. Standalone (no package imports): it is copied as an
executable script next to its config file `nvidia-smi.json` (or `$DSV4_FAKE_GPUS`).

Config: `{"driver_version": "580.95.05", "cuda_version": "13.0", "gpus": [{"name": ...,
"memory_total_mib": 97887, "memory_used_mib": 0, "compute_cap": "12.0", "uuid": ...,
"pci_bus_id": ...}], "fail": null}`. A missing file means the default: 8x "NVIDIA RTX PRO 6000
Blackwell Server Edition", 97887 MiB, compute capability 12.0, driver 580.95.05. `"fail": "..."`
makes every call print the real "couldn't communicate with the NVIDIA driver" text and exit 9.

Supported: `--query-gpu=F1,F2 --format=csv[,noheader][,nounits]` (also `--query-gpu F`,
`--format csv`), `-L`/`--list-gpus`, and a bare call (a short table). Unknown query fields are
rejected the way the real tool does (message, exit 2).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def default_config(count: int = 8) -> dict[str, Any]:
    return {
        "driver_version": "580.95.05",
        "cuda_version": "13.0",
        "gpus": [
            {"name": DEFAULT_NAME, "memory_total_mib": 97887, "memory_used_mib": 0,
             "compute_cap": "12.0",
             "uuid": f"GPU-5e1f0c2a-0000-4000-8000-{i:012x}",
             "pci_bus_id": f"00000000:{0x18 + i * 0x10:02X}:00.0"}
            for i in range(count)
        ],
        "fail": None,
    }


# field -> (header unit suffix, value getter)
def _fields(cfg: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    return {
        "index": ("", lambda i, g: str(i)),
        "name": ("", lambda i, g: g["name"]),
        "gpu_name": ("", lambda i, g: g["name"]),
        "uuid": ("", lambda i, g: g["uuid"]),
        "gpu_uuid": ("", lambda i, g: g["uuid"]),
        "pci.bus_id": ("", lambda i, g: g.get("pci_bus_id", f"00000000:{i:02X}:00.0")),
        "memory.total": (" [MiB]", lambda i, g: int(g["memory_total_mib"])),
        "memory.used": (" [MiB]", lambda i, g: int(g.get("memory_used_mib", 0))),
        "memory.free": (" [MiB]", lambda i, g: int(g["memory_total_mib"])
                        - int(g.get("memory_used_mib", 0))),
        "compute_cap": ("", lambda i, g: g["compute_cap"]),
        "driver_version": ("", lambda i, g: cfg["driver_version"]),
        "utilization.gpu": (" [%]", lambda i, g: int(g.get("utilization_gpu", 0))),
        "temperature.gpu": ("", lambda i, g: int(g.get("temperature_gpu", 35))),
        "power.draw": (" [W]", lambda i, g: float(g.get("power_draw_w", 60.0))),
        "count": ("", lambda i, g: str(len(cfg["gpus"]))),
    }


def _unit(value: Any, suffix: str, nounits: bool) -> str:
    if nounits or not suffix:
        return str(value)
    unit = suffix.strip(" []")
    return f"{value} {unit}"


def main(argv: list[str]) -> int:
    path = Path(os.environ.get("DSV4_FAKE_GPUS") or Path(__file__).with_name("nvidia-smi.json"))
    cfg = json.loads(path.read_text()) if path.is_file() else default_config()
    if cfg.get("fail"):
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        return 9
    gpus = cfg["gpus"]
    query, fmt, i = None, "", 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--query-gpu="):
            query = a.split("=", 1)[1]
        elif a == "--query-gpu" and i + 1 < len(argv):
            i += 1
            query = argv[i]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format" and i + 1 < len(argv):
            i += 1
            fmt = argv[i]
        elif a in ("-L", "--list-gpus"):
            for n, g in enumerate(gpus):
                print(f"GPU {n}: {g['name']} (UUID: {g['uuid']})")
            return 0
        else:
            print(f"Invalid combination of input arguments: {a}. "
                  "Please run 'nvidia-smi -h' for help.")
            return 2
        i += 1
    if query is None:
        print(f"NVIDIA-SMI (simulated)   Driver Version: {cfg['driver_version']}   "
              f"CUDA Version: {cfg.get('cuda_version', '13.0')}")
        for n, g in enumerate(gpus):
            print(f"|  {n}  {g['name']}  {g.get('memory_used_mib', 0)}MiB / "
                  f"{g['memory_total_mib']}MiB |")
        return 0
    opts = {o.strip() for o in fmt.split(",") if o.strip()}
    if "csv" not in opts:
        print('"--format" must be given with "csv" when querying.')
        return 2
    table = _fields(cfg)
    names = [f.strip() for f in query.split(",") if f.strip()]
    for f in names:
        if f not in table:
            print(f'Field "{f}" is not a valid field to query.')
            return 2
    nounits = "nounits" in opts
    if "noheader" not in opts:
        print(", ".join(f + ("" if nounits else table[f][0]) for f in names))
    for n, g in enumerate(gpus):
        print(", ".join(_unit(table[f][1](n, g), table[f][0], nounits) for f in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
