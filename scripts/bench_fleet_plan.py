#!/usr/bin/env python3
"""Benchmark: how long `dsv4ctl plan` takes for a fleet of N hosts with declared facts (issue 23).

Writes a generated inventory (one group of N members over shared defaults) and the shipped
fleet-3x profile pointed at it into a temporary directory, then times loading and planning the
fleet (every host planned and rendered, the router's worker list built) and rendering the text
plan. Prints a table; it asserts nothing about speed (speed is measured, not tested).

    .venv/bin/python scripts/bench_fleet_plan.py            # 1, 10, 100, 500 hosts
    .venv/bin/python scripts/bench_fleet_plan.py 500 1000   # chosen sizes
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.planner.fleet import load_fleet, plan_fleet  # noqa: E402
from orchestrator.planner.fleet_report import render_fleet_json, render_fleet_text  # noqa: E402


def inventory(n: int) -> dict:
    inv = yaml.safe_load((REPO / "profiles" / "inventory.yaml").read_text())
    group = inv["groups"]["fleet-3x"]
    group["hosts"] = {f"gpu-{i:04d}": {"address": f"10.{1 + i // 65536}.{i // 256 % 256}.{i % 256}",
                                       "known_hosts": "/etc/dsv4ctl/known_hosts"}
                      for i in range(n)}
    inv["groups"] = {"big": group, "routers": inv["groups"]["routers"]}
    return inv


def bench(n: int, work: Path) -> tuple[int, float, float, float, int]:
    d = work / str(n)
    d.mkdir()
    (d / "inventory.yaml").write_text(yaml.safe_dump(inventory(n), sort_keys=False))
    prof = yaml.safe_load((REPO / "profiles" / "fleet-3x.yaml").read_text())
    prof["hosts"] = "big"
    (d / "fleet.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    t0 = time.perf_counter()
    fctx = load_fleet(d / "fleet.yaml", None)
    t1 = time.perf_counter()
    fleet = plan_fleet(fctx)
    t2 = time.perf_counter()
    text = render_fleet_text(fleet)
    render_fleet_json(fleet)
    t3 = time.perf_counter()
    assert not fleet.errors, [c.message for c in fleet.errors][:3]
    assert len(fleet.plans) == n + 1 and text
    return n, t1 - t0, t2 - t1, t3 - t2, len(fleet.plan("router-1").deployment.router.worker_urls)


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [1, 10, 100, 500]
    print(f"{'hosts':>6} {'load s':>8} {'plan s':>8} {'render s':>9} {'total s':>8} "
          f"{'ms/host':>8} {'workers':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            n, load, plan, render, workers = bench(n, Path(tmp))
            total = load + plan + render
            print(f"{n:>6} {load:>8.2f} {plan:>8.2f} {render:>9.2f} {total:>8.2f} "
                  f"{1000 * total / n:>8.1f} {workers:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
