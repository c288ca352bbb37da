"""Benchmark: how long a no-change `dsv4ctl apply` takes against a fake host (issue 20 #10).

Brings up one fake host of the integration harness (real sshd and `systemd --user` in network
namespaces, the engine simulator; needs root, like `tests/integration`), applies the integration
test profile once, then times ``--runs`` no-change applies end to end, each a fresh
``dsv4ctl apply`` process (start-up, probe, plan, preflight), both from the profile and from a
saved plan. Prints a table (median, min, max in seconds) and, from one more run of each mode,
how many SSH connections and commands (round trips) it made. Python's bytecode is cached (in the
temp dir) as for an installed dsv4ctl. Nothing is asserted: the target (<= 1.0 s median) is read
off the table.

    sudo .venv/bin/python scripts/bench_noop_apply.py --runs 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# dsv4ctl with its SSH connections and commands (each a round trip) counted, printed at exit
COUNTED = """
import atexit, sys
from orchestrator.remote import connection as c
n = {"connect": 0, "command": 0}
def counted(orig, key):
    def call(self, *a, **k):
        n[key] += 1
        return orig(self, *a, **k)
    return call
for name, key in (("connect", "connect"), ("run", "command"), ("open_process", "command")):
    setattr(c.RemoteHost, name, counted(getattr(c.RemoteHost, name), key))
atexit.register(lambda: print("@@round-trips", n["connect"], n["command"], file=sys.stderr))
from orchestrator.cli import entrypoint
entrypoint()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="timed no-change applies per mode (>= 5)")
    args = ap.parse_args()
    if args.runs < 5:
        ap.error("--runs must be at least 5 (the table reports a median)")

    import yaml

    from tests.harness import HostCluster
    from tests.integration.test_apply import MODEL, ROOT, TOTAL_SIZE, profile_dict

    with tempfile.TemporaryDirectory(prefix="bench-noop-") as tmp, \
            HostCluster(n=1, workdir=Path(tmp) / "hosts") as hosts:
        h = hosts[0]
        h.exec(f"mkdir -p {MODEL} && printf '%s' '{{\"metadata\": {{\"total_size\": "
               f"{TOTAL_SIZE}}}, \"weight_map\": {{}}}}' > {MODEL}/model.safetensors.index.json",
               check=True)
        inv = h.inventory_dict()
        inventory = Path(tmp) / "inventory.yaml"
        inventory.write_text(yaml.safe_dump({"apiVersion": "dsv4ctl/v1", "hosts": {"h": {
            "address": inv["address"], "port": inv["port"], "user": inv["user"],
            "key": inv["key"], "known_hosts": inv["known_hosts"], "scope": "user",
            "install_root": ROOT, "connect_timeout_s": 5,
            "gpus": {"model": "rtx-pro-6000-se", "count": 8}}}}))
        profile = Path(tmp) / "profile.yaml"
        profile.write_text(yaml.safe_dump(profile_dict()))
        plan = Path(tmp) / "plan.json"
        # bytecode cached as an installed dsv4ctl has it (pip compiles it at install): kept in the
        # temp dir, written by the first, untimed apply; without it (PYTHONDONTWRITEBYTECODE=1,
        # as in this repository's dev shells) every run compiles each module again
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"))
        dsv4ctl = [sys.executable, "-c", "from orchestrator.cli import entrypoint; entrypoint()"]

        def run(*argv: str, counted: bool = False) -> tuple[float, str]:
            cmd = [sys.executable, "-c", COUNTED] if counted else dsv4ctl
            t0 = time.perf_counter()
            p = subprocess.run([*cmd, *argv, "-i", str(inventory)], env=env, cwd=REPO,
                               capture_output=True, text=True, stdin=subprocess.DEVNULL)
            dt = time.perf_counter() - t0
            if p.returncode != 0:
                raise SystemExit(f"dsv4ctl {' '.join(argv)} failed ({p.returncode}):\n"
                                 f"{p.stdout}\n{p.stderr}")
            return dt, p.stdout + (p.stderr if counted else "")

        run("apply", str(profile), "--yes")  # the first release
        run("plan", str(profile), "--host", "h", "--live", "-o", str(plan))
        rows = []
        for label, argv in (("apply PROFILE", ("apply", str(profile), "--yes")),
                            ("apply PLAN.json", ("apply", str(plan), "--yes"))):
            times = []
            for _ in range(args.runs):
                dt, out = run(*argv)
                if "No changes." not in out:
                    raise SystemExit(f"expected a no-change apply, got:\n{out}")
                times.append(dt)
            _, out = run(*argv, counted=True)
            trips = out.rsplit("@@round-trips", 1)[1].split()
            rows.append((label, times, f"{trips[0]} + {trips[1]}"))
        t0 = time.perf_counter()
        subprocess.run([*dsv4ctl, "--help"], env=env, cwd=REPO, capture_output=True, check=True)
        startup = time.perf_counter() - t0

    print(f"no-change apply against a fake host ({args.runs} runs each, seconds, wall clock of a "
          f"fresh dsv4ctl process)")
    print(f"{'mode':<18} {'median':>7} {'min':>7} {'max':>7}  SSH connections + commands")
    for label, times, trips in rows:
        print(f"{label:<18} {statistics.median(times):7.3f} {min(times):7.3f} {max(times):7.3f}  "
              f"{trips}")
    print(f"{'(dsv4ctl --help)':<18} {startup:7.3f}   process start-up and imports alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
