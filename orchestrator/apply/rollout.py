"""Rolling and canary apply of a fleet (issue 23): the order of hosts, the waves and when to stop.

Owns the rollout's decisions, not its I/O: the per-host work goes through :class:`HostOps`
(:mod:`.fleet_ops` does it over SSH and the router's worker API; the benchmark and the unit tests
use fakes). For a fleet planned by :func:`orchestrator.planner.fleet.plan_fleet`:

1. ``prepare`` every host in parallel before the first switch: the single-host apply's prepare
   phase (connect, probe facts, refuse a stale plan, take the host lock, upload and verify the
   release, unpack its kernels into ``releases/<id>/kernels/``); one host that fails here stops
   the rollout before any switch, and the hosts already prepared are ``cancel``-led (their
   records say why, nothing serving changed).
2. Waves: the first ``canary`` hosts alone, then the rest at most ``max_unavailable`` at a time,
   hosts of a wave in parallel, ``pause_s`` between waves. For each host: ``drain`` (its workers
   out of the router, then its engines' running requests down to zero or ``drain_timeout_s``),
   ``switch`` (the single-host apply: release, lock, switch, health — the fleet of one's path,
   unchanged), ``restore`` (its workers back into the router, verified through the router).
3. A host whose apply fails was rolled back by the single-host path; it is put back into the
   router on its old release. The rollout stops after the canary wave when the canary failed, and
   after any wave once more than ``max_failures`` hosts failed. Hosts not reached stay on the
   release they were serving; the ones prepared are cancelled (their prepared release is never
   switched to, their records say why).

A host without changes is neither drained nor switched. The router's own host (a router-only
host) goes last, after every engine host moved, because restarting the router is the one step
that drops connections. The single host is the fleet of one: one wave, no drain (no router of
its own to drain from), the same switch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, Protocol

from orchestrator.errors import ApplyFailed, DsvError, ExitCode


class RolloutStopped(DsvError):
    """A fleet rollout stopped; ``exit_code`` is :attr:`RolloutResult.exit_code`."""

    def __init__(self, message: str, *, exit_code: ExitCode, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.exit_code = exit_code


State = Literal["moved", "unchanged", "rolled_back", "rollback_failed", "failed", "not_reached"]


@dataclass(frozen=True)
class Strategy:
    """``rollout.strategy`` of the profile (schema: orchestrator.profile.schema.RolloutStrategy)."""

    canary: int = 1
    max_unavailable: int = 1
    max_failures: int = 0
    pause_s: float = 0.0
    drain_timeout_s: float = 120.0
    parallelism: int = 32  # threads for the parallel phases (prepare, a wave's hosts)


class HostOps(Protocol):
    def prepare(self, host: str) -> bool: ...  # True: changes, prepared; raises on failure
    def cancel(self, host: str, why: str) -> str | None: ...  # a prepared host not switched
    def drain(self, host: str, timeout_s: float) -> bool: ...  # True: drained to zero
    def switch(self, host: str) -> None: ...  # single-host apply; raises ApplyFailed
    def restore(self, host: str) -> None: ...  # back into the router, verified through it
    # after a wave moved and is back (health and smoke passed): a reason to roll it back, or None
    def verify_wave(self, hosts: list[str]) -> str | None: ...
    # a moved host the gate failed: out of the router, back to its previous release, back in;
    # raises DsvError when that fails
    def revert(self, host: str, why: str) -> None: ...
    # every host prepared, before the first wave: the run's journal says it is under way
    def begin_waves(self, result: RolloutResult) -> None: ...


@dataclass
class HostOutcome:
    host: str
    wave: int
    state: State = "not_reached"
    message: str = ""
    drained: bool | None = None
    seconds: float = 0.0


@dataclass
class RolloutResult:
    waves: list[list[str]]
    outcomes: dict[str, HostOutcome]
    prepare_s: float = 0.0
    wave_s: list[float] = field(default_factory=list)
    stopped_after: int | None = None  # index of the wave after which the rollout stopped
    reason: str = ""
    # the error that failed each host's prepare or move, as raised (a run of one host reports
    # it as the single host always did: its exit code, its fix)
    errors: dict[str, DsvError] = field(default_factory=dict, repr=False)

    @property
    def failed(self) -> list[HostOutcome]:
        return [o for o in self.outcomes.values()
                if o.state in ("rolled_back", "rollback_failed", "failed")]

    @property
    def exit_code(self) -> ExitCode:
        """0: every host serves the new release (or had nothing to change); 3: the rollout
        stopped and every failed host serves its previous release again; 4: a failed host's
        rollback failed too; 1: a host was left neither moved nor restored for another reason
        (unreachable mid-apply, preparing, draining, putting it back into the router) — its
        outcome says where."""
        states = {o.state for o in self.failed}
        if not states:
            return ExitCode.OK
        if "rollback_failed" in states:
            return ExitCode.ROLLBACK_FAILED
        if "failed" in states:
            return ExitCode.ERROR
        return ExitCode.ROLLED_BACK


def waves(hosts: list[str], strategy: Strategy) -> list[list[str]]:
    """The canary wave, then waves of at most ``max_unavailable``, in fleet order (the planner
    owns the rule: plan and diff state the downtime of these same waves)."""
    from orchestrator.planner.rollout import waves as plan_waves

    return plan_waves(hosts, strategy.canary, strategy.max_unavailable)


def _each(pool: ThreadPoolExecutor, fn: Callable[[str], None], hosts: list[str]) -> None:
    """``fn`` for every host, in parallel; one host runs in the calling thread, so that Ctrl-C
    reaches its steps (the executor's restore defers a second one only in the main thread)."""
    if len(hosts) == 1:
        fn(hosts[0])
    else:
        list(pool.map(fn, hosts))


def run_rollout(hosts: list[str], ops: HostOps, strategy: Strategy, *,
                router_host: str | None = None, drain: bool = True,
                out: Callable[[str], None] = lambda _s: None,
                sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.perf_counter) -> RolloutResult:
    """Roll the fleet ``hosts`` (engine hosts in rollout order) and then ``router_host``.
    ``drain``: a router fronts the engine hosts (each is drained before its move and put back
    after it); the fleet of one carrying its own router is not."""
    plan = waves(hosts, strategy)
    if router_host is not None:
        plan.append([router_host])
    result = RolloutResult(waves=plan, outcomes={
        h: HostOutcome(h, i) for i, wave in enumerate(plan) for h in wave})
    every = [h for wave in plan for h in wave]
    workers = max(1, min(strategy.parallelism, len(every)))
    t0 = clock()
    changed: dict[str, bool] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        # 1. every host prepared before the first switch; nothing changes if one fails
        errors: dict[str, str] = {}

        def prep(h: str) -> None:
            try:
                changed[h] = ops.prepare(h)
            except DsvError as exc:
                errors[h] = exc.message
                result.errors[h] = exc

        _each(pool, prep, every)
        result.prepare_s = clock() - t0
        if errors:
            for h, msg in errors.items():
                result.outcomes[h].state, result.outcomes[h].message = "failed", msg
            first = sorted(errors)[0]
            result.reason = ("preparing " + ", ".join(sorted(errors)) + " failed ("
                             + (f"{first}: " if len(errors) > 1 else "") + errors[first]
                             + "); no host was switched")
            result.stopped_after = -1
            _cancel([h for h in every if changed.get(h)], ops, result, pool)
            return result
        out(f"prepared {len(every)} host(s) in {result.prepare_s:.2f}s; "
            f"{sum(changed.values())} with changes; {len(plan)} wave(s)")
        ops.begin_waves(result)
        failures = 0
        for i, wave in enumerate(plan):
            w0 = clock()
            todo = [h for h in wave if changed.get(h)]
            for h in wave:
                if not changed.get(h):
                    result.outcomes[h].state = "unchanged"
            _each(pool, lambda h: _one_host(h, ops, strategy, result, clock,
                                            drain=drain and h != router_host), todo)
            result.wave_s.append(clock() - w0)
            bad = [h for h in wave if result.outcomes[h].state != "moved"
                   and result.outcomes[h].state != "unchanged"]
            failures += len(bad)
            kind = "canary wave" if i == 0 and strategy.canary else f"wave {i + 1}/{len(plan)}"
            out(f"{kind}: {', '.join(wave)}: " + ", ".join(
                f"{h} {result.outcomes[h].state}" for h in wave)
                + f" ({result.wave_s[-1]:.2f}s)")
            gate = ops.verify_wave(todo) if todo and not bad else None
            if gate is not None:
                # a wave that serves but fails the gate (canary analysis) goes back like one
                # whose health check failed: each host to its previous release, counted as failed
                _each(pool, lambda h, why=gate: _revert(h, ops, result, why), todo)
                bad = list(todo)
                failures += len(bad)
                out(f"{kind}: {', '.join(todo)} rolled back: {gate}")
            if bad and ((i == 0 and strategy.canary) or failures > strategy.max_failures):
                result.stopped_after = i
                result.reason = (f"{'the canary' if i == 0 and strategy.canary else 'wave'} "
                                 f"{', '.join(bad)} failed ({failures} failure(s), budget "
                                 f"{strategy.max_failures}); the rollout stopped, hosts not "
                                 "reached keep their release")
                _cancel([h for w in plan[i + 1:] for h in w if changed.get(h)], ops, result,
                        pool)
                return result
            if i + 1 < len(plan) and strategy.pause_s > 0 and todo:
                sleep(strategy.pause_s)
    return result


def _revert(host: str, ops: HostOps, result: RolloutResult, why: str) -> None:
    o = result.outcomes[host]
    o.message = why
    try:
        ops.revert(host, why)
        o.state = "rolled_back"
    except DsvError as exc:
        o.state = "rollback_failed"
        o.message = f"{why}; rolling it back failed: {exc.message}"
        result.errors[host] = exc


def _cancel(hosts: list[str], ops: HostOps, result: RolloutResult,
            pool: ThreadPoolExecutor) -> None:
    """The prepared hosts the rollout will not switch: each keeps serving what it served."""
    def one(h: str) -> None:
        o = result.outcomes[h]
        try:
            release = ops.cancel(h, result.reason)
            if release:
                o.message = f"{release} was prepared, never switched to (its record: failed)"
        except DsvError as exc:
            o.message = f"{o.message + '; ' if o.message else ''}cancelling it: {exc.message}"

    _each(pool, one, hosts)


def _one_host(host: str, ops: HostOps, strategy: Strategy, result: RolloutResult,
              clock: Callable[[], float], *, drain: bool) -> None:
    """Drain, switch, put back. Whatever the switch did, a host that serves (the new release,
    its restored old one, or the old one untouched) goes back into the router."""
    o = result.outcomes[host]
    t0 = clock()
    try:
        if drain:
            try:
                o.drained = ops.drain(host, strategy.drain_timeout_s)
            except DsvError as exc:
                o.state, o.message = "failed", f"draining failed: {exc.message}"
        if o.state != "failed":
            try:
                ops.switch(host)
                o.state = "moved"
            except ApplyFailed as exc:
                o.state = "rolled_back" if exc.rolled_back else "rollback_failed"
                o.message = exc.message
                result.errors[host] = exc
            except DsvError as exc:  # refused before anything changed (lock, stale, upload)
                o.state, o.message = "failed", exc.message
                result.errors[host] = exc
        if drain and o.state != "rollback_failed":
            try:
                ops.restore(host)
            except DsvError as exc:
                if o.state == "moved":
                    o.state = "failed"
                o.message = "; ".join(m for m in (o.message, "putting it back into the router "
                                                  f"failed: {exc.message}") if m)
    finally:
        o.seconds = clock() - t0
