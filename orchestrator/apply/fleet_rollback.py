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

from collections.abc import Mapping
from typing import Any

from orchestrator.apply.fleet_ops import FleetOps, Out, drive
from orchestrator.errors import DsvError
from orchestrator.planner.targets import Targets
from orchestrator.planner_model import Plan
from orchestrator.profile.inventory import Host


class RollbackOps(FleetOps):
    """:class:`~orchestrator.apply.rollout.HostOps` of a rollback over SSH."""

    kind = "rollback"

    def __init__(self, targets: Targets, hosts: Mapping[str, Host],
                 plans: Mapping[str, Plan] | None = None, *, out: Out, command: str,
                 release: str | None = None, connect: Any = None) -> None:
        super().__init__(targets, hosts, plans, out=out, command=command, connect=connect)
        self.release = release  # one host's explicit target
        self.targets_of: dict[str, str] = {}
        self.resume: dict[str, str] = {}  # host -> target of the interrupted rollback resumed

    def open_journal(self) -> None:
        """Number the run; when the run before it is a rollback of the same hosts that never
        finished (killed while a host waited for health, say), resume it: each host goes to the
        target that run chose, whatever its current release is now (a host it already switched
        is re-verified and put back into the router, not refused for having no release before
        its new current one)."""
        super().open_journal()
        prev = self.previous
        if (self.release is None and prev is not None and prev.get("kind") == "rollback"
                and prev.get("state") == "running"
                and list(prev.get("selected") or []) == list(self.targets.selected)
                and prev.get("targets")):
            self.resume = dict(prev["targets"])
            self.resumed = prev.get("sequence")
            self.out(f"resuming rollback {self.resumed} (it did not finish): "
                     + ", ".join(f"{h} -> {r}" for h, r in sorted(self.resume.items())))

    def target_releases(self) -> dict[str, str]:
        return dict(self.targets_of)

    def prepare(self, host: str) -> bool:
        from orchestrator.release.record import rollback_target
        from orchestrator.release.store import ReleaseStore
        from orchestrator.release_ids import is_release_id

        store = ReleaseStore(self.remote(host), self.hosts[host].install_root)
        records, current = store.read_records(), store.current()
        wanted = self.release if self.release is not None else self.resume.get(host)
        if wanted is not None:
            if not is_release_id(wanted) or wanted not in {r.id for r in records}:
                raise DsvError(f"release {wanted!r} does not exist on host '{host}'",
                               fix=f"pick one from `dsv4ctl history --host {host}`")
            target = wanted
        else:
            found = rollback_target(records, current)
            if found is None:
                raise DsvError(f"no previous release on host '{host}': no healthy release "
                               f"before {current or 'none'} to go back to",
                               fix=f"see `dsv4ctl history --host {host}`"
                                   + ("" if self.targets.single else
                                      "; roll the other hosts back one by one with --host NAME"))
            target = found
        with self._lock:
            self.targets_of[host] = target
        if target == current:
            self.say(host)(f"{target} is already current; re-verifying and restarting what is "
                           "not running")
        elif not self.targets.single:
            self.say(host)(f"{current or 'no release'} -> {target}")
        return True

    def check(self) -> None:
        return None  # a rollback's target is read from the host, under its lock

    def cancel(self, host: str, why: str) -> str | None:
        return None  # nothing was prepared on the host: its rollback had not started

    def switch(self, host: str) -> None:
        from orchestrator.apply import rollback
        from orchestrator.apply.executor import raise_for

        target = self.targets_of[host]
        res = rollback(host, self.hosts[host], target, out=self.say(host), command=self.command,
                       remote=self.remote(host), fleet_lock=self.inner_fleet_lock)
        self.results[host] = res
        self.releases[host] = res.rolled_back_to
        if res.status != "healthy":
            raise_for(res)


def rollback_fleet(targets: Targets, hosts: Mapping[str, Host], plans: Mapping[str, Plan],
                   strategy: Any, *, out: Out, command: str, release: str | None = None
                   ) -> tuple[Any, FleetOps, str | None]:
    """Every target host back to its previous release (or ``release``, for one host), wave by
    wave behind the router (where one fronts the engines) under the fleet lock; returns the
    result, the ops (each host's own result) and where the fleet's journal was written."""
    check_release(targets, release)
    ops = RollbackOps(targets, hosts, plans, out=out, command=command, release=release)
    result, where = drive(ops, strategy, out=out)
    return result, ops, where


def check_release(targets: Targets, release: str | None) -> None:
    """An explicit RELEASE names one host's release: refused for more than one host, before
    anything is asked or touched."""
    if release is not None and len(targets.moved) != 1:
        raise DsvError(f"release {release!r} names one host's release (release ids differ from "
                       "host to host), but no --host was given" if not targets.selected else
                       f"release {release!r} names one host's release, but --host selects "
                       f"{len(targets.moved)} hosts ({', '.join(targets.moved)})",
                       fix="pass --host NAME with it, or leave RELEASE out to send every host "
                           "back to its own previous release")
