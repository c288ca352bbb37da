"""A stand-in for NVIDIA dcgm-exporter: ``/metrics`` in dcgm-exporter's own exposition format.

Owns what the monitoring tests scrape in place of the real exporter (which needs NVIDIA GPUs and
the DCGM host engine): the default counters dsv4ctl's rules and board use, with the HELP and TYPE
lines of dcgm-exporter's ``etc/default-counters.csv`` (https://github.com/NVIDIA/dcgm-exporter) and
its per-GPU labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
as in the exporter's README sample ``DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-..."} 139``).

Values come from a JSON state file re-read on every scrape, so a test can change a GPU's memory in
use or plant an XID error while Prometheus watches::

    {"gpus": 8, "fb_used_mib": 80000, "fb_total_mib": 97887, "util": 63, "power_w": 410.5,
     "temp_c": 61, "xid": {"3": 79}, "fb_used_mib_by_gpu": {"2": 90000}}

Run: ``python -m tests.sim.dcgm --host 127.0.0.1 --port 9400 --state state.json``. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tests.sim.httpbase import Handler, Server, serve_forever

# (field, Prometheus type, help) exactly as in dcgm-exporter's etc/default-counters.csv
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
)
DEFAULTS: dict[str, Any] = {"gpus": 8, "fb_used_mib": 80000, "fb_total_mib": 97887, "util": 63,
                            "power_w": 410.5, "temp_c": 61, "xid": {}, "fb_used_mib_by_gpu": {},
                            "model": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                            "hostname": "gpu-host"}


def exposition(state: dict[str, Any]) -> str:
    st = {**DEFAULTS, **state}
    lines: list[str] = []
    for field, typ, help_ in COUNTERS:
        lines += [f"# HELP {field} {help_}", f"# TYPE {field} {typ}"]
        for g in range(int(st["gpus"])):
            used = int(st["fb_used_mib_by_gpu"].get(str(g), st["fb_used_mib"]))
            value = {
                "DCGM_FI_DEV_SM_CLOCK": 2430, "DCGM_FI_DEV_MEM_CLOCK": 14001,
                "DCGM_FI_DEV_MEMORY_TEMP": 0, "DCGM_FI_DEV_GPU_TEMP": st["temp_c"],
                "DCGM_FI_DEV_POWER_USAGE": st["power_w"],
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456789,
                "DCGM_FI_DEV_GPU_UTIL": st["util"], "DCGM_FI_DEV_MEM_COPY_UTIL": 12,
                "DCGM_FI_DEV_XID_ERRORS": int(st["xid"].get(str(g), 0)),
                "DCGM_FI_DEV_FB_FREE": int(st["fb_total_mib"]) - used,
                "DCGM_FI_DEV_FB_USED": used,
            }[field]
            labels = (f'gpu="{g}",UUID="GPU-00000000-0000-4000-8000-{g:012d}",'
                      f'pci_bus_id="00000000:{0x18 + g:02X}:00.0",device="nvidia{g}",'
                      f'modelName="{st["model"]}",Hostname="{st["hostname"]}"')
            lines.append(f"{field}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="tests.sim.dcgm", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9400)
    ap.add_argument("--state", type=Path, required=True)
    args = ap.parse_args(argv)

    class H(Handler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            try:
                state = json.loads(args.state.read_text()) if args.state.exists() else {}
            except ValueError:
                state = {}
            self.send_text(200, exposition(state), "text/plain; version=0.0.4; charset=utf-8")

    return serve_forever(Server((args.host, args.port), H))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
