"""The driver of every host-changing run: one host or many, apply or rollback (issue 23, 30).

Owns what :func:`orchestrator.apply.rollout.run_rollout` asks of each host the target resolver
(:func:`orchestrator.planner.targets.resolve_targets`) chose: one SSH connection per host (the
probe's when the caller probed, reused through prepare and switch, closed at the end), the fleet
lock (on the lock host; each host's own lock is taken by its prepare), draining a host through the
router (:mod:`orchestrator.remote.router_api`: its workers removed, then its engines' running
requests read down to zero from their ``/metrics``) where a router fronts the engines, the host's
move in its two phases — :func:`orchestrator.apply.prepare_apply` (preflight, upload, kernels;
every host in parallel before the first switch) and the prepared apply's switch in the host's
wave, or its cancel when the run stops before that wave — and putting its workers back, verified
through the router (each listed healthy, then one generation through it with the profile's smoke
prompt). A rollback (:mod:`.fleet_rollback`) is the same driver with another move.

The seam between waves: :meth:`FleetOps.verify_wave` runs after a wave's hosts are back (health
and smoke passed) and asks the canary analysis (``rollout.analysis``); a failed verdict has the
driver :meth:`FleetOps.revert` the wave (drain, previous release, back in) and count it failed, as
a failed health check is. The journal's layout and reader are :mod:`.fleet_journal`'s, the
fleet's status and history :mod:`.fleet_view`'s. Past 400 lines (~475): a host's moves, its
revert, the router and the journal writes share one table of connections and one fleet lock.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from orchestrator.apply.fleet_journal import journal_dir, read_journals, sequence_of
from orchestrator.errors import DsvError, RemoteError
from orchestrator.planner.targets import Targets, fleet_lock_name
from orchestrator.planner_model import FleetPlan, Plan
from orchestrator.profile.inventory import Host

Out = Callable[[str], None]

__all__ = ["FleetOps", "apply_fleet", "drive", "fleet_lock_name"]


class FleetOps:
    """:class:`~orchestrator.apply.rollout.HostOps` over SSH; close with :meth:`close`.

    ``plans``: each host's plan (a rollback needs only the router's, to drain; none at all for a
    host named without a profile). ``remotes``: connections already open (the probe's), owned
    from here on: :meth:`close` closes them with the ones it opened."""

    kind = "rollout"  # the fleet journal's kind (.fleet_rollback.RollbackOps: "rollback")

    def __init__(self, targets: Targets, hosts: Mapping[str, Host],
                 plans: Mapping[str, Plan] | None = None, *, out: Out, command: str,
                 saved: bool = False, remotes: Mapping[str, Any] | None = None,
                 connect: Callable[[str, Host], Any] | None = None) -> None:
        self.targets, self.hosts, self.out, self.command = targets, hosts, out, command
        self.plans = dict(plans or {})
        self.profiles: dict[str, Any] = {}  # each moved host's profile, from :meth:`check`
        self.saved = saved
        self.releases: dict[str, str | None] = {}
        # each host's own result (the executor's Result): what a one-host run prints
        self.results: dict[str, Any] = {}
        # hosts prepared (release uploaded, host lock held) and not yet switched or cancelled
        self.prepared: dict[str, Any] = {}
        self.cancelled: dict[str, str | None] = {}  # host -> the prepared release not switched
        # canary analysis (verify_wave): each wave's verdict, and the engines already compared
        self.analyses: list[dict[str, Any]] = []
        self.analysed: list[str] = []
        self._router_http: Any = None  # the router's authenticated client, made once
        # the run's journal (open_journal): its number and path on the lock host, the journal
        # of the run before it, and the number of the interrupted run this one resumes
        self.sequence: int | None = None
        self.journal_path: str | None = None
        self.previous: dict[str, Any] | None = None
        self.resumed: int | None = None
        self.started = time.time()
        self.router_up = False  # set by check_router: False on the first rollout (no router yet)
        self._connect = connect
        self.remotes: dict[str, Any] = dict(remotes or {})
        # each host's facts as this run's probe read them over that connection (apply_fleet)
        self.facts: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.fleet_lock: Any = None
        on = targets.router_on
        self.router_plan: Plan | None = self.plans.get(on) if on is not None else None

    def check(self) -> None:
        """Before any connection: each moved host's plan is its own and, saved, re-derives from
        its profile (:func:`orchestrator.apply.checked_profile`); a hostile or stale plan never
        reaches a host."""
        from orchestrator.apply import checked_profile

        for host in self.targets.moved:
            self.profiles[host] = checked_profile(self.plans[host], host, self.hosts[host],
                                                  saved=self.saved)

    def say(self, host: str) -> Out:
        """``out`` for one host's lines: prefixed with its name, except in the fleet of one."""
        if self.targets.single:
            return self.out
        return lambda line: self.out(f"[{host}] {line}")

    # -- connections and the fleet lock -----------------------------------------------------
    def remote(self, host: str) -> Any:
        with self._lock:
            if host not in self.remotes:
                if self._connect is None:
                    from orchestrator.remote.connection import connect

                    self._connect = connect
                self.remotes[host] = self._connect(host, self.hosts[host])
            return self.remotes[host]

    @property
    def inner_fleet_lock(self) -> str | None:
        """The fleet lock a host's own lock is taken inside of: the fleet of one takes both in
        its host lock's one command (``HostLock(outer=)``), the fleet lock first, so its
        no-change apply stays one round trip after the probe. None for a fleet of many (its
        fleet lock is held apart, :meth:`lock_fleet`)."""
        return self.targets.fleet_lock if self.targets.single else None

    def lock_fleet(self) -> None:
        """The fleet lock, on the lock host, before any host lock: a second run of the same
        profile is refused with the holder shown, as a second apply of one host is. The fleet of
        one takes it with its host lock (:attr:`inner_fleet_lock`); a host named without a
        profile knows no fleet: its host lock alone guards it."""
        from orchestrator.remote.lock import HostLock

        name = self.targets.fleet_lock
        if name is None or self.inner_fleet_lock is not None:
            return
        on = self.targets.lock_on
        self.fleet_lock = HostLock(self.remote(on), self.hosts[on].install_root, self.command,
                                   name=name)
        self.fleet_lock.acquire()

    def close(self) -> None:
        for host in list(self.prepared):  # an exception or Ctrl-C between prepare and switch
            with contextlib.suppress(Exception):
                self.cancel(host, "the run ended before this host's switch")
        if self.fleet_lock is not None:
            self.fleet_lock.release()
        for r in self.remotes.values():
            with contextlib.suppress(Exception):  # best effort; the lock dies with the connection
                r.close()

    # -- the router ----------------------------------------------------------------------------
    def router(self) -> Any:
        """The router's worker API, through the deployment's one authenticated client (the
        router's --api-key, which sglang-router 0.3.2 demands on its worker API and generation
        routes, read once from the router host's 0600 secrets file over SSH, never printed)."""
        from orchestrator.apply.context import engine_client
        from orchestrator.release.store import ReleaseStore
        from orchestrator.remote.router_api import RouterApi

        plan = self.router_plan
        if plan is None or plan.deployment.router is None:
            raise DsvError("the fleet has no router to drain hosts from")
        dep = plan.deployment
        assert dep.router is not None
        if self._router_http is None:
            remote = self.remote(plan.host)
            store = ReleaseStore(remote, self.hosts[plan.host].install_root)
            self._router_http = engine_client(remote, dep,
                                              lambda name: store.read_secret(dep.name, name))
        return RouterApi(self._router_http, dep.router.port, name=f"the router on '{plan.host}'")

    def _workers(self, host: str) -> list[tuple[str, str, int | None, Any]]:
        """(url, worker type, bootstrap port, role) of every engine of ``host``."""
        dep = self.plans[host].deployment
        out = []
        for role in dep.roles:
            kind = role.disaggregation_mode or "regular"
            out.append((role.url, kind, role.bootstrap_port if kind == "prefill" else None, role))
        return out

    def check_router(self) -> bool:
        """Whether the router answers its worker API. Not asked when nothing is drained (the
        fleet of one, its router its own). Not yet up (the fleet's first rollout, the router
        starts with its host's release): hosts are applied without draining."""
        from orchestrator.remote.router_api import RouterApiError

        if (not self.targets.drain or not self.targets.engines or self.router_plan is None
                or self.router_plan.deployment.router is None):
            self.router_up = False
        else:
            try:
                self.router().workers()
                self.router_up = True
            except RouterApiError as exc:
                self.out(f"the router does not answer yet ({exc.message}); hosts are applied "
                         "without draining (nothing routes to them)")
                self.router_up = False
        return self.router_up

    # -- HostOps -------------------------------------------------------------------------------
    def prepare(self, host: str) -> bool:
        """The host's apply up to its switch (preflight under its host lock, upload, verify,
        kernels): True when it has changes and is now prepared, False when there is nothing to
        change. A failure raises, with nothing serving changed on the host."""
        from orchestrator.apply import PreparedApply, prepare_apply
        from orchestrator.apply.executor import raise_for

        # connected here at the latest: an unreachable host stops the run before any switch
        res = prepare_apply(self.plans[host], host, self.hosts[host],
                            profile=self.profiles[host], out=self.say(host),
                            command=self.command, saved=self.saved, remote=self.remote(host),
                            fleet=tuple(self.plans[h] for h in sorted(self.plans)),
                            fleet_lock=self.inner_fleet_lock,
                            probed=self.facts.get(host))
        if isinstance(res, PreparedApply):
            with self._lock:
                self.prepared[host] = res
            return True
        self.results[host] = res
        raise_for(res)  # a prepare step failed: journaled in the host's record
        return False  # no changes

    def cancel(self, host: str, why: str) -> str | None:
        """A prepared host that will not be switched: its record says so, its lock is freed.
        Returns the release that was prepared (None: the host was not prepared)."""
        with self._lock:
            prepared = self.prepared.pop(host, None)
        if prepared is None:
            return None
        self.cancelled[host] = prepared.release
        res = prepared.cancel(why)
        self.say(host)(res.message)
        return prepared.release

    def drain(self, host: str, timeout_s: float) -> bool:
        from orchestrator.remote.router_api import engine_inflight, wait_drained

        if not self.router_up:
            return True
        api = self.router()
        removed = [api.remove(url) for url, _kind, _port, _role in self._workers(host)]
        if all(w is None for w in removed):
            # not in the router (a run that was lost took it out): nothing routes to it
            self.say(host)("drained: not in the router")
            return True
        remote = self.remote(host)

        def inflight() -> int:
            return sum(engine_inflight(remote.http("GET", role.port, "/metrics",
                                                   address=role.listen, timeout=5).text)
                       for _u, _k, _p, role in self._workers(host))

        res = wait_drained(inflight, timeout_s=timeout_s)
        self.say(host)(f"drained: {'0 requests left' if res.drained else 'timeout with '}"
                       f"{'' if res.drained else str(res.inflight) + ' request(s) still running'}"
                       f" after {res.waited_s:.1f}s")
        return res.drained

    def switch(self, host: str) -> None:
        from orchestrator.apply.executor import raise_for

        with self._lock:
            prepared = self.prepared.pop(host)
        res = prepared.switch()
        self.results[host] = res
        self.releases[host] = res.release
        if res.status not in ("healthy", "no-changes"):
            raise_for(res)

    def restore(self, host: str) -> None:
        from orchestrator.health import smoke_generate

        if not self.router_up:
            return
        remote = self.remotes.get(host)
        if remote is not None and not remote.alive:
            # the host went away during its switch (its sshd or the machine died): nothing can
            # say its engines serve, and adding them would have the router wait add()'s 60 s for
            # a worker that never turns healthy; the run stops now, the host out of the router
            raise RemoteError(f"host '{host}' cannot be reached (the SSH connection to it was "
                              "lost): it is left out of the router",
                              fix=f"dsv4ctl status --host {host}; once it is back, apply the "
                                  "fleet again")
        api = self.router()
        for url, kind, port, _role in self._workers(host):
            api.add(url, worker_type=kind, bootstrap_port=port)
        plan = self.router_plan
        assert plan is not None
        prompt, max_tokens = self._smoke()
        res = smoke_generate(api.http, plan.deployment, prompt, max_tokens, timeout=60)
        if not res.ok:
            raise RemoteError(f"host '{host}' is back in the router, but a generation through "
                              f"the router failed: {res.message}",
                              fix="see the router's and the engines' logs")
        self.say(host)(f"back in the router; generation through it: {res.message}")

    def _smoke(self) -> tuple[str, int]:
        """The profile's smoke prompt and its token budget (``health.smoke_prompt``), the one
        each host's own smoke step sends."""
        from orchestrator.apply.context import profile_from_plan

        assert self.router_plan is not None
        health = profile_from_plan(self.router_plan).health
        return health.smoke_prompt, health.smoke_max_tokens

    def verify_wave(self, hosts: list[str]) -> str | None:
        """After a wave's hosts moved and are back behind the router (their health and smoke
        passed): the canary analysis (``rollout.analysis``,
        :mod:`orchestrator.monitoring.analysis`) compares the wave's engines with those not yet
        moved, in the fleet's Prometheus; its verdict goes into the journal, and a failed one is
        the reason the driver rolls the wave back. None: go on (no analysis configured, or a
        wave without engines, as the router's own host)."""
        from orchestrator.monitoring import analysis
        from orchestrator.monitoring.prometheus import engine_targets

        profile = next((self.profiles[h] for h in hosts if h in self.profiles), None)
        wave = [i for h in hosts if h in self.plans
                for i in analysis.engine_instances(self.plans[h].deployment)]
        if profile is None or not wave:
            return None
        a, url = profile.rollout.analysis, profile.monitoring.prometheus_url
        if not analysis.enabled(a, url):
            return None
        every = ([t for _, t in engine_targets(self.router_plan.deployment)]
                 if self.router_plan is not None else
                 [i for p in self.plans.values() for i in analysis.engine_instances(p.deployment)])
        baseline = [i for i in every if i not in wave and i not in self.analysed]
        if not self.router_up:
            reason = ("not run: the fleet's router is not up yet (a first rollout), so no "
                      "traffic reaches the wave to compare")
            with self._lock:
                self.analyses.append({"hosts": list(hosts), "passed": True, "reason": reason,
                                      "requests": None, "comparisons": []})
            self.say(hosts[0])(f"canary analysis {reason}")
            return None
        self.say(hosts[0])(f"canary analysis: {', '.join(hosts)} serve for "
                           f"{analysis.wait_seconds(a):g} s, then {url} compares them with "
                           f"{len(baseline)} engine(s) not yet moved")
        verdict = analysis.run(a, url, profile.name, wave, baseline)
        assert verdict is not None
        with self._lock:
            self.analysed.extend(wave)
            self.analyses.append({"hosts": list(hosts), **verdict.to_dict()})
        self.say(hosts[0])(f"canary analysis {'passed' if verdict.passed else 'FAILED'}: "
                           f"{verdict.reason}")
        return None if verdict.passed else f"canary analysis failed: {verdict.reason}"

    def revert(self, host: str, why: str) -> None:
        """A moved host whose wave failed the analysis: drained, back to the release it served
        before (the single-host rollback and its rule, :func:`orchestrator.apply.rollback`),
        then back into the router, verified through it."""
        from orchestrator.apply import rollback
        from orchestrator.apply.executor import raise_for
        from orchestrator.release.record import rollback_target
        from orchestrator.release.store import ReleaseStore

        profile = self.profiles.get(host)
        timeout = profile.rollout.strategy.drain_timeout_s if profile is not None else 120.0
        if self.router_up:
            self.drain(host, timeout)
        store = ReleaseStore(self.remote(host), self.hosts[host].install_root)
        target = rollback_target(store.read_records(), store.current())
        res = rollback(host, self.hosts[host], target, out=self.say(host),
                       command=f"{self.command} (canary analysis failed)",
                       remote=self.remote(host))
        self.results[host] = res
        self.releases[host] = res.rolled_back_to
        if res.status != "healthy":
            raise_for(res)
        self.restore(host)

    # -- the fleet's journal -------------------------------------------------------------------
    def open_journal(self) -> None:
        """Number this run (under the fleet lock: the next number after the highest on the lock
        host) and read the journal of the run before it (:attr:`previous`). Runs are ordered by
        that number, never by a clock: a controller a day behind or a host clock ahead cannot
        reorder them. The fleet of one keeps no fleet journal (its record is the host's)."""
        if self.targets.single or self.targets.profile_name is None:
            return
        on = self.targets.lock_on
        root = self.hosts[on].install_root
        name = self.targets.profile_name
        from orchestrator.remote import hostfs

        remote = self.remote(on)
        d = journal_dir(root, name)
        res = remote.run(hostfs.ensure_dirs(root, "fleet", f"fleet/{name}") + "\n"
                         + f"ls -1 -- {shlex.quote(d)}", timeout=30)
        if not res.ok:
            raise RemoteError(f"cannot create {d} on host '{on}': "
                              f"{(res.stderr or res.stdout).strip()[:200]}")
        seq = 1 + max((sequence_of(n) or 0 for n in res.stdout.split()), default=0)
        self.journal_path = f"{d}/{seq:08d}.json"
        self.sequence = seq
        if seq > 1:
            found = read_journals(remote, root, name, last=True)
            self.previous = found[-1] if found else None

    def begin_waves(self, result: Any) -> None:
        """Every host prepared: the journal says the run is under way, with each host's target
        (a run killed from here on leaves it 'running': the next rollback resumes from it)."""
        try:
            self._write(result, finished=False)
        except DsvError as exc:  # the run goes on; its end is journaled (or said missing) then
            self.out(f"(the fleet's journal could not be written yet: {exc.message})")

    def write_journal(self, result: Any, started: float) -> str | None:
        """The run's journal at its end, on the lock host, under
        ``<install_root>/fleet/<profile>/<sequence>.json``: the waves, each host's outcome,
        where it stopped and why (None: the fleet of one, nothing written)."""
        self.started = started
        return self._write(result, finished=True)

    def _write(self, result: Any, *, finished: bool) -> str | None:
        if self.journal_path is None:
            return None
        on = self.targets.lock_on
        record = {
            "profile": self.targets.profile_name, "kind": self.kind, "sequence": self.sequence,
            "state": "finished" if finished else "running",
            # wall-clock times are for people reading the journal, not for its order
            "started": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.started)),
            "finished": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) if finished else None,
            "command": self.command, "waves": result.waves,
            "selected": list(self.targets.selected),
            "targets": dict(sorted(self.target_releases().items())),
            "outcomes": [asdict(o) for o in result.outcomes.values()],
            "stopped_after_wave": result.stopped_after, "reason": result.reason,
            "exit_code": int(result.exit_code) if finished else None,
            # the release each switched host now serves (a rollout: the one its apply made, its
            # record releases/ID/record.json; a rollback: the one it went back to)
            "releases": dict(sorted(self.releases.items())),
            # releases prepared (uploaded) on hosts the rollout stopped before: never switched
            "prepared_not_switched": dict(sorted(self.cancelled.items())),
            # canary analysis between waves: each wave's verdict, with both numbers
            "analysis": self.analyses,
        }
        if self.resumed is not None:
            record["resumes"] = self.resumed
        self.remote(on).put_bytes((json.dumps(record, indent=2, sort_keys=True) + "\n").encode(),
                                  self.journal_path)
        return f"{on}:{self.journal_path}"

    def target_releases(self) -> dict[str, str]:
        """The release each host is moving to (a rollout: the one prepared; a rollback: its
        target), as the journal keeps it."""
        return {h: p.release for h, p in self.prepared.items() if p.release} | {
            h: r for h, r in self.releases.items() if r}


def apply_fleet(targets: Targets, hosts: Mapping[str, Host], plans: Mapping[str, Plan],
                strategy: Any, *, out: Out, command: str, saved: bool,
                remotes: Mapping[str, Any] | None = None, facts: Mapping[str, Any] | None = None
                ) -> tuple[Any, FleetOps, str | None]:
    """Apply the plans to the targets (one host or many) through :func:`drive`; returns the
    result, the ops (each host's own result) and where the fleet's journal was written.
    ``facts``: each host's facts, probed for this run over its connection in ``remotes``."""
    ops = FleetOps(targets, hosts, plans, out=out, command=command, saved=saved, remotes=remotes)
    ops.facts = dict(facts or {})
    result, where = drive(ops, strategy, out=out)
    return result, ops, where


def drive(ops: FleetOps, strategy: Any, *, out: Out) -> tuple[Any, str | None]:
    """One run, a rollout or a rollback (``ops`` decides what a host's move is), of one host or
    many: take the fleet lock, ask the router (where one fronts the engines), run the waves,
    write the fleet's journal, close every connection. Returns the result and where the journal
    went (None: the fleet of one keeps none)."""
    from orchestrator.apply.rollout import run_rollout

    t = ops.targets
    started = time.time()
    try:
        ops.check()
        ops.lock_fleet()
        ops.open_journal()
        ops.check_router()
        result = run_rollout(list(t.engines), ops, strategy, router_host=t.router_host,
                             drain=t.drain, out=(lambda _s: None) if t.single else out)
        try:
            where = ops.write_journal(result, started)
        except DsvError as exc:  # the run's outcome stands; say the journal is missing
            where = f"not written ({exc.message})"
        return result, where
    finally:
        ops.close()


def targets_of(fleet: FleetPlan, *, selector: str | None = None,
               groups: Mapping[str, Any] | None = None) -> Targets:
    """The targets of a planned fleet (:func:`~orchestrator.planner.targets.resolve_targets`)."""
    from orchestrator.planner.targets import resolve_targets

    return resolve_targets(fleet.profile_name, fleet.hosts, fleet.router_on,
                           fleet.router_only_host, selector=selector, groups=groups)
