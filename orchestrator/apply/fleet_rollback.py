"""Rollback of a fleet, or of one of its hosts, behind its router (issue 23, Deliver 4).

Owns what a fleet rollback asks of each host; the order, the waves and when to stop are the
rollout's (:func:`orchestrator.apply.rollout.run_rollout`, the same strategy), and draining a host
and putting it back through the router are :class:`~orchestrator.apply.fleet_ops.FleetOps`'
own. Per host:

- ``prepare`` (every host in parallel before the first switch): connect, read its records and
  its current release, and pick the release it goes back to: the one asked for (one host,
  ``RELEASE``), else the newest healthy release before current
  (:func:`orchestrator.release.record.rollback_target`, the single host's rule). A host with no
  previous release, or without the release asked for, stops the rollback before any host moved.
- ``switch``: the single-host rollback (:func:`orchestrator.apply.rollback`: lock, transition,
  health, smoke, records), unchanged.

The fleet's journal (``kind: rollback``) says which hosts went back, to which release, and where
it stopped, beside the rollouts' journals.
"""

from __future__ import annotations

from typing import Any

from orchestrator.apply.fleet_ops import FleetOps, Out, drive
from orchestrator.errors import DsvError
from orchestrator.planner_model import FleetPlan
from orchestrator.profile.inventory import Host


class RollbackOps(FleetOps):
    """:class:`~orchestrator.apply.rollout.HostOps` of a fleet rollback over SSH."""

    kind = "rollback"

    def __init__(self, fleet: FleetPlan, hosts: dict[str, Host], *, out: Out, command: str,
                 release: str | None = None, connect: Any = None) -> None:
        super().__init__(fleet, hosts, out=out, command=command, connect=connect)
        self.release = release  # one host's explicit target
        self.targets: dict[str, str] = {}

    def prepare(self, host: str) -> bool:
        from orchestrator.release.record import rollback_target
        from orchestrator.release.store import ReleaseStore
        from orchestrator.release_ids import is_release_id

        store = ReleaseStore(self.remote(host), self.hosts[host].install_root)
        records, current = store.read_records(), store.current()
        if self.release is not None:
            if not is_release_id(self.release) or self.release not in {r.id for r in records}:
                raise DsvError(f"release {self.release!r} does not exist on host '{host}'",
                               fix=f"pick one from `dsv4ctl history --host {host}`")
            target = self.release
        else:
            found = rollback_target(records, current)
            if found is None:
                raise DsvError(f"no previous release on host '{host}': no healthy release "
                               f"before {current or 'none'} to go back to",
                               fix=f"see `dsv4ctl history --host {host}`; roll the other hosts "
                                   "back one by one with --host NAME")
            target = found
        with self._lock:
            self.targets[host] = target
        self.out(f"[{host}] {current or 'no release'} -> {target}")
        return True

    def cancel(self, host: str, why: str) -> str | None:
        return None  # nothing was prepared on the host: its rollback had not started

    def switch(self, host: str) -> None:
        from orchestrator.apply import rollback
        from orchestrator.apply.executor import raise_for

        target = self.targets[host]
        res = rollback(host, self.hosts[host], target,
                       out=lambda line: self.out(f"[{host}] {line}"), command=self.command)
        self.releases[host] = res.rolled_back_to
        if res.status != "healthy":
            raise_for(res)


def rollback_fleet(fleet: FleetPlan, hosts: dict[str, Host], strategy: Any, *, out: Out,
                   command: str, only: str | None = None, release: str | None = None
                   ) -> tuple[Any, str]:
    """Every host of ``fleet`` (or ``only`` that one) back to its previous release (or
    ``release``, with ``only``), wave by wave behind the router under the fleet lock; returns
    the result and where its journal was written."""

    names = list(fleet.hosts) + ([fleet.router_only_host] if fleet.router_only_host else [])
    if only is not None and only not in names:
        raise DsvError(f"host '{only}' is not a host of fleet {fleet.profile_name} "
                       f"(its hosts: {', '.join(names)})",
                       fix="pass --host with one of those names, or leave it out to roll the "
                           "whole fleet back")
    if release is not None and only is None:
        raise DsvError(f"release {release!r} names one host's release (release ids differ from "
                       "host to host), but no --host was given",
                       fix="pass --host NAME with it, or leave RELEASE out to send every host "
                           "back to its own previous release")
    engines = [h for h in fleet.hosts if only is None or h == only]
    router = fleet.router_only_host if only in (None, fleet.router_only_host) else None
    ops = RollbackOps(fleet, hosts, out=out, command=command, release=release)
    return drive(ops, engines, strategy, router_host=router, out=out)
