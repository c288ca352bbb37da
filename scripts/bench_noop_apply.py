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
import atexit, sys, time
from orchestrator.remote import connection as c
n = {"connect": 0, "command": 0}
trace = []
def counted(orig, key):
    def call(self, *a, **k):
        n[key] += 1
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            what = " ".join(str(a[0]).split())[:90] if a else key
            trace.append(f"{time.perf_counter() - t0:7.3f}  {key:<8} {what}")
    return call
for name, key in (("connect", "connect"), ("run", "command"), ("open_process", "command")):
    setattr(c.RemoteHost, name, counted(getattr(c.RemoteHost, name), key))
def report():
    for line in trace:
        print("@@trace", line, file=sys.stderr)
    print("@@round-trips", n["connect"], n["command"], file=sys.stderr)
atexit.register(report)
from orchestrator.cli import entrypoint
entrypoint()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="timed no-change applies per mode (>= 5)")
    ap.add_argument("--trace", action="store_true",
                    help="print each SSH connection and command of the counted run, with its time")
    ap.add_argument("--profile", metavar="DIR", type=Path,
                    help="also run one apply of each mode under cProfile: DIR/<mode>.prof, and the "
                         "top functions by cumulative time printed (where the time goes)")
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

        def run(*argv: str, counted: bool = False, profile: Path | None = None
                ) -> tuple[float, str]:
            cmd = [sys.executable, "-c", COUNTED] if counted else dsv4ctl
            if profile is not None:
                main = Path(tmp) / "dsv4ctl_main.py"  # cProfile runs a file, not -c
                main.write_text(dsv4ctl[2] + "\n")
                cmd = [sys.executable, "-m", "cProfile", "-o", str(profile), str(main)]
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
        profiles: list[tuple[str, Path]] = []
        traces: list[tuple[str, list[str]]] = []
        for label, argv in (("apply PROFILE", ("apply", str(profile), "--yes")),
                            ("apply PLAN.json", ("apply", str(plan), "--yes"))):
            times = []
            for _ in range(args.runs):
                dt, out = run(*argv)
                if "No changes." not in out:
                    raise SystemExit(f"expected a no-change apply, got:\n{out}")
                times.append(dt)
            _, out = run(*argv, counted=True)
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                prof = args.profile / (label.split()[1].replace(".", "_").lower() + ".prof")
                run(*argv, profile=prof)
                profiles.append((label, prof))
            trips = out.rsplit("@@round-trips", 1)[1].split()
            traces.append((label, [ln.split("@@trace ", 1)[1] for ln in out.splitlines()
                                   if ln.startswith("@@trace ")]))
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
    if args.trace:
        for label, lines in traces:
            print(f"\n{label}: each round trip of the counted run (seconds, what ran)")
            print("\n".join(lines))
    for label, prof in profiles:
        import pstats

        print(f"\n{label}: top 30 by cumulative time ({prof})")
        pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
