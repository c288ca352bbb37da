"""Which hosts a host-changing command touches: the one target resolver of apply, rollback and
unlock.

Owns, decided once and before any connection: the hosts of the run (the engine hosts in rollout
order, then the router's own host), where the router runs, whether moving an engine host drains it
through that router, the host that carries the fleet lock, and which members ``--host`` selects (a
member, or an inventory group whose members are all in the fleet). A single host is the fleet of
one: its targets are that host, and when it carries its router itself nothing is drained (the
router fronts no other host). Unknown names are refused here with the fleet's and the inventory's
names, so a typo never reaches SSH.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.errors import DsvError


def fleet_lock_name(profile_name: str) -> str:
    """The fleet lock's file name under the lock host's install root (one per profile)."""
    return f".dsv4ctl-fleet-{profile_name}.lock"


@dataclass(frozen=True)
class Targets:
    """What one run of the driver (:func:`orchestrator.apply.fleet_ops.drive`) touches."""

    profile_name: str | None  # None: a host named without a profile (no fleet is known)
    fleet_hosts: tuple[str, ...]  # every host of the fleet: engine hosts, then the router's own
    engines: tuple[str, ...]  # the engine hosts this run moves, in rollout order
    router_host: str | None  # the router's own host, when this run moves it (always last)
    router_on: str | None  # the host whose router fronts the engines (None: no router)
    drain: bool  # whether an engine host is drained through the router before it moves
    lock_on: str  # the host that carries the fleet lock
    selected: tuple[str, ...] = ()  # what --host named (its members), () for the whole fleet

    @property
    def moved(self) -> list[str]:
        """The hosts this run moves, in order."""
        return [*self.engines, *([self.router_host] if self.router_host else [])]

    @property
    def single(self) -> bool:
        """The fleet of one: one host, its router (if any) its own."""
        return len(self.fleet_hosts) == 1

    @property
    def fleet_lock(self) -> str | None:
        """The fleet lock's name: a run takes it before any host's own lock, the fleet of one
        too (with its host lock, in one command: ``HostLock(outer=)``). None for a host named
        without a profile: no fleet is known, its host lock alone guards it."""
        if not self.profile_name:
            return None
        return fleet_lock_name(self.profile_name)

    def describe(self) -> str:
        """'host 'a'' or 'N hosts (a, b, c)', for prompts and progress lines."""
        moved = self.moved
        if len(moved) == 1:
            return f"host '{moved[0]}'"
        return f"{len(moved)} hosts ({', '.join(moved)})"


def resolve_targets(profile_name: str | None, engines: Sequence[str], router_on: str | None,
                    router_only_host: str | None, *, selector: str | None = None,
                    groups: Mapping[str, Sequence[str]] | None = None) -> Targets:
    """The targets of a fleet (``engines`` in rollout order, its router on ``router_on``, a host of
    the router's own ``router_only_host``), narrowed by ``--host`` (``selector``: a fleet host or
    an inventory group of ``groups``, every member of which must be in the fleet)."""
    every = [*engines, *([router_only_host] if router_only_host else [])]
    if not every:
        raise DsvError("the run names no host", fix="name the host: --host NAME")
    selected: tuple[str, ...] = ()
    if selector is not None:
        groups = groups or {}
        if selector in every:
            selected = (selector,)
        elif selector in groups:
            members = list(groups[selector])
            stray = [m for m in members if m not in every]
            if stray or not members:
                raise DsvError(
                    f"group '{selector}' has host(s) {', '.join(stray) or '(none)'} that are not "
                    f"hosts of fleet {profile_name} (its hosts: {', '.join(every)})",
                    fix="name a group whose members are all in the fleet, or one host of it")
            selected = tuple(h for h in every if h in members)
        else:
            known = ", ".join(every)
            names = sorted(groups)
            raise DsvError(
                f"host '{selector}' is not a host of fleet {profile_name} (its hosts: {known}"
                + (f"; inventory groups: {', '.join(names)}" if names else "") + ")",
                fix="pass --host with one of those names (a host or a group of them), or leave "
                    "it out to act on the whole fleet")
    chosen = set(selected) if selected else set(every)
    # the router drains engines it fronts on other hosts; a host carrying its own router alone
    # (the single host, PD or not) has nobody else to serve its traffic: nothing to drain
    drain = router_on is not None and list(engines) != [router_on]
    return Targets(
        profile_name=profile_name, fleet_hosts=tuple(every),
        engines=tuple(h for h in engines if h in chosen),
        router_host=router_only_host if router_only_host in chosen else None,
        router_on=router_on, drain=drain, lock_on=router_on or every[0], selected=selected)


def one_host(name: str, profile_name: str | None = None, *, router: bool = False) -> Targets:
    """The fleet of one: host ``name``; ``router``: it runs its own router (nothing to drain)."""
    return resolve_targets(profile_name, [name], name if router else None, None)
