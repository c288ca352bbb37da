"""Benchmark: the rollout engine's own cost on a fleet of N fake hosts (issue 23, Deliver 5).

Drives :func:`orchestrator.apply.rollout.run_rollout` against a fake remote layer whose
operations (drain, switch, restore) take ``--op-ms`` milliseconds of sleep and whose prepare
(the single-host apply's prepare phase: preflight, upload, verify, kernels) takes
``--prepare-ms``, and prints the prepare phase's wall time against its ideal (every host in
parallel, ``--parallelism`` at a time) and against what the same work would add inside the waves
(one prepare per wave, computed: how the rollout ran before the prepare phase held the uploads),
then per wave the wall time, the time the operations themselves need when a wave's hosts run in
parallel (the longest host: drain + switch + restore), and the difference: the orchestration
overhead. Then the same with zero-time operations (pure overhead). The rollout must cost O(hosts)
and its parallel phases (prepare, a wave's hosts) must run in parallel: prepare of N hosts takes
about ceil(N / parallelism) * op time, not N * op time.

    .venv/bin/python scripts/bench_rollout.py [--hosts 500] [--max-unavailable 50] [--op-ms 20]
        [--prepare-ms 200]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.apply.rollout import Strategy, run_rollout


class FakeRemote:
    """Every operation sleeps ``op_s`` (an SSH round trip, a router call, an apply)."""

    def __init__(self, op_s: float, prepare_s: float) -> None:
        self.op_s, self.prepare_s = op_s, prepare_s

    def _op(self) -> None:
        if self.op_s:
            time.sleep(self.op_s)

    def prepare(self, host: str) -> bool:
        if self.prepare_s:
            time.sleep(self.prepare_s)
        return True

    def drain(self, host: str, timeout_s: float) -> bool:
        self._op()
        return True

    def cancel(self, host: str, why: str) -> str | None:
        self._op()
        return None

    def switch(self, host: str) -> None:
        self._op()

    def restore(self, host: str) -> None:
        self._op()

    def verify_wave(self, hosts: list[str]) -> str | None:
        return None

    def begin_waves(self, result: object) -> None:
        pass


def run(hosts: int, strategy: Strategy, op_s: float, prepare_s: float) -> None:
    names = [f"gpu-{i:04d}" for i in range(hosts)]
    t0 = time.perf_counter()
    res = run_rollout(names, FakeRemote(op_s, prepare_s), strategy)
    total = time.perf_counter() - t0
    assert res.exit_code == 0 and all(o.state == "moved" for o in res.outcomes.values())
    prep_ideal = math.ceil(hosts / strategy.parallelism) * prepare_s
    print(f"\n{hosts} hosts, canary {strategy.canary}, max_unavailable "
          f"{strategy.max_unavailable}, parallelism {strategy.parallelism}, op {op_s * 1e3:g} ms, "
          f"prepare {prepare_s * 1e3:g} ms")
    print(f"{'phase':<14}{'hosts':>6}{'wall s':>10}{'ops s':>10}{'overhead ms':>13}"
          f"{'per host us':>13}")
    print(f"{'prepare':<14}{hosts:>6}{res.prepare_s:>10.3f}{prep_ideal:>10.3f}"
          f"{(res.prepare_s - prep_ideal) * 1e3:>13.1f}"
          f"{(res.prepare_s - prep_ideal) / hosts * 1e6:>13.1f}")
    in_waves = sum(math.ceil(len(w) / strategy.parallelism) for w in res.waves) * prepare_s
    print(f"{'  in waves':<14}{hosts:>6}{'-':>10}{in_waves:>10.3f}   (computed: the same "
          f"prepare inside each of the {len(res.waves)} waves, after the drain: each host out "
          f"of the router {prepare_s * 1e3:g} ms longer)")
    overheads = []
    for i, (wave, wall) in enumerate(zip(res.waves, res.wave_s, strict=True)):
        batches = math.ceil(len(wave) / strategy.parallelism)
        ideal = batches * 3 * op_s  # drain, switch, restore in sequence per host
        over = wall - ideal
        overheads.append(over)
        if i < 3 or i == len(res.waves) - 1:
            print(f"{'wave ' + str(i + 1):<14}{len(wave):>6}{wall:>10.3f}{ideal:>10.3f}"
                  f"{over * 1e3:>13.1f}{over / len(wave) * 1e6:>13.1f}")
        elif i == 3:
            print(f"{'...':<14}")
    print(f"total {total:.3f} s over {len(res.waves)} waves; overhead per wave: mean "
          f"{sum(overheads) / len(overheads) * 1e3:.2f} ms, max {max(overheads) * 1e3:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=500)
    ap.add_argument("--max-unavailable", type=int, default=50)
    ap.add_argument("--op-ms", type=float, default=20.0)
    ap.add_argument("--prepare-ms", type=float, default=200.0)
    ap.add_argument("--parallelism", type=int, default=32)
    a = ap.parse_args()
    for op_s, prep_s in ((a.op_ms / 1e3, a.prepare_ms / 1e3), (0.0, 0.0)):
        run(a.hosts, Strategy(canary=1, max_unavailable=a.max_unavailable,
                              parallelism=a.parallelism), op_s, prep_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
