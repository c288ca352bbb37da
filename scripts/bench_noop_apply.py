"""Benchmark: how long a no-change `dsv4ctl apply` takes against a fake host (issue 20 #10).

Brings up one fake host of the integration harness (real sshd and `systemd --user` in network
namespaces, the engine simulator; needs root, like `tests/integration`), applies the integration
test profile once, then times ``--runs`` no-change applies end to end, each a fresh
``dsv4ctl apply`` process (start-up, probe, plan, preflight), both from the profile and from a
saved plan. Prints a table (median, min, max in seconds) and, from one more run of each mode,
how many SSH connections and commands (round trips) it made. Python's bytecode is cached (in the
temp dir) as for an installed dsv4ctl. Nothing is asserted: the target (<= 1.0 s median) is read
off the table.

With ``--baseline REV`` it also times the dsv4ctl of another revision (a worktree of it, against a
second fake host), run by run interleaved with this tree's, and prints this tree's median over
the baseline's: on a machine whose speed drifts from minute to minute (a shared VM), the ratio of
one interleaved run is the comparison that holds, not two medians taken minutes apart.

    sudo .venv/bin/python scripts/bench_noop_apply.py --runs 7
    sudo .venv/bin/python scripts/bench_noop_apply.py --runs 9 --baseline 661fcb8 --trace
"""

from __future__ import annotations

import argparse
import json
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


DSV4CTL = [sys.executable, "-c", "from orchestrator.cli import entrypoint; entrypoint()"]


class Tree:
    """One checkout whose dsv4ctl is timed, against a fake host of its own (its records, its
    releases): this repository, or the ``--baseline`` revision's worktree."""

    def __init__(self, label: str, root: Path, tmp: Path, host: object) -> None:
        self.label, self.root, self.host = label, root, host
        self.dir = tmp / ("baseline" if root != REPO else "this-tree")  # a label may hold '/'
        self.dir.mkdir()
        # bytecode cached as an installed dsv4ctl has it (pip compiles it at install): kept in
        # the temp dir, written by the first, untimed apply; without it (PYTHONDONTWRITEBYTECODE=1,
        # as in this repository's dev shells) every run compiles each module again
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env.update(PYTHONPATH=f"{root}:{root / 'kernels'}",
                        PYTHONPYCACHEPREFIX=str(self.dir / "pycache"))
        self.inventory = self.dir / "inventory.yaml"
        self.profile = self.dir / "profile.yaml"
        self.plan = self.dir / "plan.json"

    def setup(self) -> None:
        """The host's model index, this tree's own test profile, a first release, a saved plan."""
        import yaml

        # the profile as this tree's integration tests write it (a baseline may predate a field)
        got = subprocess.run(
            [sys.executable, "-c", "import json, yaml; from tests.integration.test_apply import "
             "MODEL, ROOT, TOTAL_SIZE, profile_dict; print(json.dumps([MODEL, ROOT, TOTAL_SIZE]))"
             "; print(yaml.safe_dump(profile_dict()))"],
            env=self.env, cwd=self.root, capture_output=True, text=True, check=True).stdout
        first, _, text = got.partition("\n")
        model, root, total = json.loads(first)
        self.profile.write_text(text)
        h = self.host
        h.exec(f"mkdir -p {model} && printf '%s' '{{\"metadata\": {{\"total_size\": "
               f"{total}}}, \"weight_map\": {{}}}}' > {model}/model.safetensors.index.json",
               check=True)
        inv = h.inventory_dict()
        self.inventory.write_text(yaml.safe_dump({"apiVersion": "dsv4ctl/v1", "hosts": {"h": {
            "address": inv["address"], "port": inv["port"], "user": inv["user"],
            "key": inv["key"], "known_hosts": inv["known_hosts"], "scope": "user",
            "install_root": root, "connect_timeout_s": 5,
            "gpus": {"model": "rtx-pro-6000-se", "count": 8}}}}))
        self.run("apply", str(self.profile), "--yes")  # the first release
        self.run("plan", str(self.profile), "--host", "h", "--live", "-o", str(self.plan))

    def argv(self, mode: str) -> tuple[str, ...]:
        return ("apply", str(self.profile if mode == "PROFILE" else self.plan), "--yes")

    def run(self, *argv: str, counted: bool = False, profile: Path | None = None
            ) -> tuple[float, str]:
        cmd = [sys.executable, "-c", COUNTED] if counted else DSV4CTL
        if profile is not None:
            main = self.dir / "dsv4ctl_main.py"  # cProfile runs a file, not -c
            main.write_text(DSV4CTL[2] + "\n")
            cmd = [sys.executable, "-m", "cProfile", "-o", str(profile), str(main)]
        t0 = time.perf_counter()
        p = subprocess.run([*cmd, *argv, "-i", str(self.inventory)], env=self.env, cwd=self.root,
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"[{self.label}] dsv4ctl {' '.join(argv)} failed ({p.returncode}):\n"
                             f"{p.stdout}\n{p.stderr}")
        return dt, p.stdout + (p.stderr if counted else "")


def baseline_tree(rev: str, tmp: Path) -> Path:
    """A detached worktree of ``rev`` (removed at exit by the caller: ``git worktree remove``)."""
    where = tmp / "baseline-tree"
    p = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(where),
                        rev], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"--baseline {rev}: git cannot check it out ({p.stderr.strip()}); name "
                         "a commit, tag or branch of this repository")
    return where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="timed no-change applies per mode (>= 5)")
    ap.add_argument("--baseline", metavar="REV",
                    help="also time the dsv4ctl of git revision REV (a worktree of it, against a "
                         "fake host of its own), its runs interleaved with this tree's so both "
                         "meet the same machine noise; the table gets a ratio column")
    ap.add_argument("--trace", action="store_true",
                    help="print each SSH connection and command of the counted run, with its time")
    ap.add_argument("--profile", metavar="DIR", type=Path,
                    help="also run one apply of each mode under cProfile: DIR/<mode>.prof, and the "
                         "top functions by cumulative time printed (where the time goes)")
    args = ap.parse_args()
    if args.runs < 5:
        ap.error("--runs must be at least 5 (the table reports a median)")

    from tests.harness import HostCluster

    with tempfile.TemporaryDirectory(prefix="bench-noop-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            roots = [("this tree", REPO)]
            if args.baseline:
                roots.append((args.baseline, baseline_tree(args.baseline, tmp)))
            with HostCluster(n=len(roots), workdir=tmp / "hosts") as hosts:
                trees = [Tree(label, root, tmp, hosts[i]) for i, (label, root) in enumerate(roots)]
                for t in trees:
                    t.setup()
                rows, traces, profiles = measure(trees, args)
                t0 = time.perf_counter()
                subprocess.run([*DSV4CTL, "--help"], env=trees[0].env, cwd=REPO,
                               capture_output=True, check=True)
                startup = time.perf_counter() - t0
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(tmp / "baseline-tree")], check=False, capture_output=True)

    print(f"no-change apply against a fake host ({args.runs} runs each, seconds, wall clock of a "
          f"fresh dsv4ctl process" + (f"; runs of this tree and {args.baseline} interleaved"
                                      if args.baseline else "") + ")")
    ratio = " ratio" if args.baseline else ""
    print(f"{'mode':<18} {'tree':<12} {'median':>7} {'min':>7} {'max':>7}{ratio:>7}  "
          "SSH connections + commands")
    for mode, label, times, trips, r in rows:
        shown = f"{r:7.2f}" if r is not None else (" " * 7 if ratio else "")
        print(f"apply {mode:<12} {label[:12]:<12} {statistics.median(times):7.3f} "
              f"{min(times):7.3f} {max(times):7.3f}{shown}  {trips}")
    print(f"{'(dsv4ctl --help)':<31} {startup:7.3f}   process start-up and imports alone")
    if args.trace:
        for label, lines in traces:
            print(f"\n{label}: each round trip of the counted run (seconds, what ran)")
            print("\n".join(lines))
    for label, prof in profiles:
        import pstats

        print(f"\n{label}: top 30 by cumulative time ({prof})")
        pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(30)
    return 0


def measure(trees: list[Tree], args: argparse.Namespace) -> tuple[list, list, list]:
    """Each mode's timed runs, tree after tree within a round (so each round's machine state is
    shared), then one counted run (round trips) and, with --profile, one profiled run."""
    rows: list[tuple[str, str, list[float], str, float | None]] = []
    traces: list[tuple[str, list[str]]] = []
    profiles: list[tuple[str, Path]] = []
    for mode in ("PROFILE", "PLAN.json"):
        times: dict[str, list[float]] = {t.label: [] for t in trees}
        for _ in range(args.runs):
            for t in trees:
                dt, out = t.run(*t.argv(mode))
                if "No changes." not in out:
                    raise SystemExit(f"[{t.label}] expected a no-change apply, got:\n{out}")
                times[t.label].append(dt)
        base = statistics.median(times[trees[-1].label]) if len(trees) > 1 else None
        for t in trees:
            _, out = t.run(*t.argv(mode), counted=True)
            trips = out.rsplit("@@round-trips", 1)[1].split()
            traces.append((f"apply {mode} ({t.label})",
                           [ln.split("@@trace ", 1)[1] for ln in out.splitlines()
                            if ln.startswith("@@trace ")]))
            r = statistics.median(times[t.label]) / base if base and t is trees[0] else None
            rows.append((mode, t.label, times[t.label], f"{trips[0]} + {trips[1]}", r))
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            prof = args.profile / (mode.replace(".", "_").lower() + ".prof")
            trees[0].run(*trees[0].argv(mode), profile=prof)
            profiles.append((f"apply {mode}", prof))
    return rows, traces, profiles


if __name__ == "__main__":
    raise SystemExit(main())
