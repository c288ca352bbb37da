"""The per-host work of a fleet rollout over SSH and the router's worker API (issue 23).

Owns what :func:`orchestrator.apply.rollout.run_rollout` asks of each host of a
:class:`~orchestrator.planner_model.FleetPlan`: connect, take the fleet lock (on the router's host;
each host's own lock is taken by its single-host apply), drain it through the router
(:mod:`orchestrator.remote.router_api`: its workers removed, then its engines' running requests
read down to zero from their ``/metrics``), apply its plan with the single-host path in its two
phases — :func:`orchestrator.apply.prepare_apply` (preflight, upload, kernels; every host in
parallel before the first switch) and the prepared apply's switch in the host's wave, or its
cancel when the rollout stops before that wave — and put its workers back, verified through the
router (each listed healthy, then one generation through it).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from orchestrator.errors import DsvError, RemoteError
from orchestrator.planner_model import FleetPlan, Plan
from orchestrator.profile.inventory import Host

Out = Callable[[str], None]


def fleet_lock_name(profile_name: str) -> str:
    return f".dsv4ctl-fleet-{profile_name}.lock"


class FleetOps:
    """:class:`~orchestrator.apply.rollout.HostOps` over SSH; close with :meth:`close`."""

    kind = "rollout"  # the fleet journal's kind (.fleet_rollback.RollbackOps: "rollback")

    def __init__(self, fleet: FleetPlan, hosts: dict[str, Host], *, out: Out, command: str,
                 saved: bool = False, connect: Callable[[str, Host], Any] | None = None) -> None:
        from orchestrator.remote.connection import connect as ssh_connect

        self.fleet, self.hosts, self.out, self.command = fleet, hosts, out, command
        self.saved = saved
        self.releases: dict[str, str | None] = {}
        # hosts prepared (release uploaded, host lock held) and not yet switched or cancelled
        self.prepared: dict[str, Any] = {}
        self.cancelled: dict[str, str | None] = {}  # host -> the prepared release not switched
        self._router_key: str | None = None
        self.router_up = False  # set by check_router: False on the first rollout (no router yet)
        self._connect = connect or ssh_connect
        self.remotes: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.fleet_lock: Any = None
        on = fleet.router_on
        self.router_plan: Plan | None = fleet.plan(on) if on is not None else None

    # -- connections and the fleet lock -----------------------------------------------------
    def remote(self, host: str) -> Any:
        with self._lock:
            if host not in self.remotes:
                self.remotes[host] = self._connect(host, self.hosts[host])
            return self.remotes[host]

    def lock_fleet(self) -> None:
        """The fleet lock, on the router's host (else the first host): a second rollout of the
        same profile is refused with the holder shown, as a second apply of one host is."""
        from orchestrator.remote.lock import HostLock

        on = self.fleet.router_on or self.fleet.hosts[0]
        root = self.hosts[on].install_root
        self.fleet_lock = HostLock(self.remote(on), root, self.command,
                                   name=fleet_lock_name(self.fleet.profile_name))
        self.fleet_lock.acquire()

    def close(self) -> None:
        for host in list(self.prepared):  # an exception or Ctrl-C between prepare and switch
            with contextlib.suppress(Exception):
                self.cancel(host, "the rollout ended before this host's switch")
        if self.fleet_lock is not None:
            self.fleet_lock.release()
        for r in self.remotes.values():
            with contextlib.suppress(Exception):  # best effort; the lock dies with the connection
                r.close()

    # -- the router ----------------------------------------------------------------------------
    def router(self) -> Any:
        from orchestrator.remote.router_api import RouterApi

        plan = self.router_plan
        if plan is None or plan.deployment.router is None:
            raise DsvError("the fleet has no router to drain hosts from")
        from orchestrator.remote.connection import listen_http

        dep = plan.deployment
        assert dep.router is not None
        remote = self.remote(plan.host)
        if self._router_key is None:  # read once; "" when the router has no --api-key
            self._router_key = self._read_router_key(remote, plan) or ""
        headers = {"Authorization": f"Bearer {self._router_key}"} if self._router_key else None
        return RouterApi(listen_http(remote.http, dep, headers), dep.router.port,
                         name=f"the router on '{plan.host}'")

    def _read_router_key(self, remote: Any, plan: Plan) -> str | None:
        """The router's --api-key (sglang-router 0.3.2 refuses its worker API and generation
        routes without it): the router's own secret, else the engines' key it is given, read from
        the router host's 0600 secrets file over SSH (never printed)."""
        from orchestrator.release.store import ReleaseStore
        from orchestrator.render.secrets import api_key_names

        dep = plan.deployment
        _, name = api_key_names(dep)
        if name is None:
            return None
        return ReleaseStore(remote, self.hosts[plan.host].install_root).read_secret(dep.name, name)

    def _workers(self, host: str) -> list[tuple[str, str, int | None, Any]]:
        """(url, worker type, bootstrap port, role) of every engine of ``host``."""
        dep = self.fleet.plan(host).deployment
        out = []
        for role in dep.roles:
            kind = role.disaggregation_mode or "regular"
            out.append((role.url, kind, role.bootstrap_port if kind == "prefill" else None, role))
        return out

    def check_router(self) -> bool:
        """Whether the router answers its worker API. Not yet (the fleet's first rollout, the
        router starts with its host's release): hosts are applied without draining."""
        from orchestrator.remote.router_api import RouterApiError

        if self.router_plan is None or self.router_plan.deployment.router is None:
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

        self.remote(host)  # connect now: an unreachable host stops the rollout before any switch
        res = prepare_apply(self.fleet.plan(host), host, self.hosts[host],
                            out=lambda line: self.out(f"[{host}] {line}"), command=self.command,
                            saved=self.saved)
        if isinstance(res, PreparedApply):
            with self._lock:
                self.prepared[host] = res
            return True
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
        self.out(f"[{host}] {res.message}")
        return prepared.release

    def drain(self, host: str, timeout_s: float) -> bool:
        from orchestrator.remote.router_api import engine_inflight, wait_drained

        if not self.router_up:
            return True
        api = self.router()
        for url, _kind, _port, _role in self._workers(host):
            api.remove(url)
        remote = self.remote(host)

        def inflight() -> int:
            return sum(engine_inflight(remote.http("GET", role.port, "/metrics",
                                                   address=role.listen, timeout=5).text)
                       for _u, _k, _p, role in self._workers(host))

        res = wait_drained(inflight, timeout_s=timeout_s)
        self.out(f"[{host}] drained: {'0 requests left' if res.drained else 'timeout with '}"
                 f"{'' if res.drained else str(res.inflight) + ' request(s) still running'} "
                 f"after {res.waited_s:.1f}s")
        return res.drained

    def switch(self, host: str) -> None:
        from orchestrator.apply.executor import raise_for

        with self._lock:
            prepared = self.prepared.pop(host)
        res = prepared.switch()
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
            # a worker that never turns healthy; the rollout stops now, the host out of the router
            raise RemoteError(f"host '{host}' cannot be reached (the SSH connection to it was "
                              "lost): it is left out of the router",
                              fix=f"dsv4ctl status --host {host}; once it is back, apply the "
                                  "fleet again")
        api = self.router()
        for url, kind, port, _role in self._workers(host):
            api.add(url, worker_type=kind, bootstrap_port=port)
        plan = self.router_plan
        assert plan is not None
        res = smoke_generate(api.http, plan.deployment, "Reply with the single word: ready", 8,
                             timeout=60)
        if not res.ok:
            raise RemoteError(f"host '{host}' is back in the router, but a generation through "
                              f"the router failed: {res.message}",
                              fix="see the router's and the engines' logs")
        self.out(f"[{host}] back in the router; generation through it: {res.message}")

    # -- the fleet's journal -------------------------------------------------------------------
    def write_journal(self, result: Any, started: float) -> str:
        """One JSON record per rollout or fleet rollback on the router's host (else the first
        host), under ``<install_root>/fleet/``: the waves, each host's outcome, where it stopped
        and why. Each host's own journal is its release record, written by its single-host
        apply or rollback."""
        on = self.fleet.router_on or self.fleet.hosts[0]
        root = self.hosts[on].install_root
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
        # milliseconds in the file name: two runs in one second (a refused rollback right after
        # a rollout) must not overwrite each other's journal; names sort in time order
        ms = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started)) + f"{int(started * 1000) % 1000:03d}Z"
        path = f"{root}/fleet/{self.fleet.profile_name}-{ms}.json"
        record = {
            "profile": self.fleet.profile_name, "kind": self.kind, "started": stamp,
            "finished": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
            "command": self.command, "waves": result.waves,
            "outcomes": [asdict(o) for o in result.outcomes.values()],
            "stopped_after_wave": result.stopped_after, "reason": result.reason,
            "exit_code": int(result.exit_code),
            # the release each switched host now serves (a rollout: the one its apply made, its
            # record releases/ID/record.json; a rollback: the one it went back to)
            "releases": dict(sorted(self.releases.items())),
            # releases prepared (uploaded) on hosts the rollout stopped before: never switched
            "prepared_not_switched": dict(sorted(self.cancelled.items())),
        }
        from orchestrator.remote import hostfs

        remote = self.remote(on)
        res = remote.run(hostfs.ensure_dirs(root, "fleet"), timeout=30)
        if not res.ok:
            raise RemoteError(f"cannot create {root}/fleet on host '{on}': "
                              f"{(res.stderr or res.stdout).strip()[:200]}")
        remote.put_bytes((json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), path)
        return f"{on}:{path}"


def apply_fleet(fleet: FleetPlan, hosts: dict[str, Host], strategy: Any, *, out: Out,
                command: str, saved: bool) -> tuple[Any, str]:
    """Roll ``fleet`` out (:func:`~orchestrator.apply.rollout.run_rollout`) under the fleet
    lock; returns the result and where its journal was written."""

    ops = FleetOps(fleet, hosts, out=out, command=command, saved=saved)
    return drive(ops, list(fleet.hosts), strategy, router_host=fleet.router_only_host, out=out)


def drive(ops: FleetOps, engines: list[str], strategy: Any, *, router_host: str | None,
          out: Out) -> tuple[Any, str]:
    """One fleet run, a rollout or a rollback (``ops`` decides what a host's move is): take the
    fleet lock, ask the router, run the waves, write the fleet's journal, close every
    connection. Returns the result and where the journal went."""
    from orchestrator.apply.rollout import run_rollout

    started = time.time()
    try:
        ops.lock_fleet()
        ops.check_router()
        result = run_rollout(engines, ops, strategy, router_host=router_host, out=out)
        try:
            where = ops.write_journal(result, started)
        except DsvError as exc:  # the run's outcome stands; say the journal is missing
            where = f"not written ({exc.message})"
        return result, where
    finally:
        ops.close()


def fleet_status(fleet: FleetPlan, hosts: dict[str, Host], *, status: Callable[[str, Host], Any],
                 command: str = "dsv4ctl status",
                 connect: Callable[[str, Host], Any] | None = None) -> dict[str, Any]:
    """The fleet at a glance: per host its current release, health (``status``: the single-host
    status of :func:`orchestrator.apply.status`, run in parallel), host lock holder and router
    membership (each of its engines listed healthy by the router); the last rollout's (or fleet
    rollback's) journal, and the holder of the fleet lock when one is running now."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.remote.lock import is_locked, read_holder
    from orchestrator.remote.router_api import RouterApiError

    names = list(fleet.hosts) + ([fleet.router_only_host] if fleet.router_only_host else [])
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(names)))) as pool:
        reports = dict(zip(names, pool.map(lambda n: _safe_status(status, n, hosts[n]), names),
                           strict=True))
    ops = FleetOps(fleet, hosts, out=lambda _s: None, command=command, connect=connect)
    listed: dict[str, bool] | None = None
    last: dict[str, Any] | None = None
    running: str | None = None  # the fleet lock's holder: a rollout or rollback in progress
    try:
        try:
            workers = {w.url: w.is_healthy for w in ops.router().workers()}
            listed = {h: all(workers.get(u, False) for u, *_ in ops._workers(h))
                      for h in fleet.hosts}
        except (RouterApiError, DsvError):
            listed = None
        on = fleet.router_on or fleet.hosts[0]
        name = fleet_lock_name(fleet.profile_name)
        if is_locked(ops.remote(on), hosts[on].install_root, name):  # a rollout running now
            h = read_holder(ops.remote(on), hosts[on].install_root, name)
            running = h.describe() if h else "unknown holder"
        root = shlex.quote(hosts[on].install_root + "/fleet")
        res = ops.remote(on).run(f"f=$(ls -1t {root}/*.json 2>/dev/null | head -n 1); "
                                 '[ -n "$f" ] && cat -- "$f"', timeout=30)
        if res.stdout.strip():
            from orchestrator.host_data import fleet_journal

            try:  # host data, checked (issue 31): a hostile journal crashed `status`
                last = fleet_journal(res.stdout, f"the last fleet journal on host '{on}'")
            except DsvError as exc:
                last = {"kind": "unreadable", "reason": exc.message}
    except DsvError:
        pass
    finally:
        ops.close()
    rows = []
    for n in names:
        rep = reports[n]
        rows.append({
            "host": n, "role": "router" if n == fleet.router_only_host else "engine",
            "current": getattr(rep, "current", None),
            "current_status": getattr(rep, "current_status", None),
            "healthy": bool(getattr(rep, "healthy", False)),
            "locked_by": getattr(rep, "locked_by", None),
            "in_router": None if listed is None or n not in listed else listed[n],
            "error": rep if isinstance(rep, str) else None,
        })
    return {"profile": fleet.profile_name, "router_on": fleet.router_on, "hosts": rows,
            "router_answers": listed is not None, "last_rollout": last,
            "in_progress": running}


def _safe_status(status: Callable[[str, Host], Any], name: str, host: Host) -> Any:
    try:
        return status(name, host)
    except DsvError as exc:
        return exc.message


def fleet_history(fleet: FleetPlan, hosts: dict[str, Host], *,
                  command: str = "dsv4ctl history") -> list[dict[str, Any]]:
    """Every rollout of the fleet's profile, oldest first: the fleet's journals on the router's
    host (each host's own releases: ``history --host NAME``)."""
    on = fleet.router_on or fleet.hosts[0]
    ops = FleetOps(fleet, hosts, out=lambda _s: None, command=command)
    try:
        root = shlex.quote(hosts[on].install_root + "/fleet")
        prefix = shlex.quote(fleet.profile_name + "-")
        # one JSON document per line (jq-free): each journal file squeezed onto one line
        res = ops.remote(on).run(
            f"cd {root} 2>/dev/null || exit 0; for f in $(ls -1 -- {prefix}*.json 2>/dev/null "
            "| sort); do tr -d '\\n' < \"$f\"; echo; done", timeout=60)
    finally:
        ops.close()
    from orchestrator.host_data import fleet_journal

    out = []
    for n, line in enumerate(res.stdout.splitlines(), 1):
        # host data (issue 31): a hostile journal crashed `history`; one that is not a fleet
        # journal is shown as unreadable, the others as they are
        try:
            out.append(fleet_journal(line, f"fleet journal {n} on host '{on}'"))
        except DsvError as exc:
            out.append({"kind": "unreadable", "started": "?", "exit_code": None,
                        "stopped_after_wave": None, "reason": exc.message, "outcomes": []})
    return out
