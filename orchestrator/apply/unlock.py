"""`dsv4ctl unlock`: show who holds a host's lock and a fleet's, and with ``--force`` end them.

Both locks are kernel-held (:mod:`orchestrator.remote.lock`) and vanish with their holder's SSH
session; this is for a holder that hangs (a half-open connection). A run takes the fleet lock on
the fleet's lock host first (:attr:`~orchestrator.planner.targets.Targets.lock_on`), then each
host's own lock; unlock looks at the same two, the fleet lock first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from orchestrator.planner.targets import Targets
from orchestrator.profile.inventory import Host

Out = Callable[[str], None]


def unlock(targets: Targets, hosts: Mapping[str, Host], *, force: bool, out: Out) -> bool:
    """Show each lock's holder (the fleet lock, then every target host's lock); with ``force``
    end the holders. Returns whether every lock is free afterwards."""
    from orchestrator.remote.connection import connect
    from orchestrator.remote.lock import LOCK_NAME, force_unlock, is_locked, read_holder

    names = list(dict.fromkeys(
        ([targets.lock_on] if targets.fleet_lock else []) + targets.moved))
    free = True
    for name in names:
        root = hosts[name].install_root
        with connect(name, hosts[name]) as remote:
            locks = [(LOCK_NAME, f"host '{name}'")]
            if targets.fleet_lock and name == targets.lock_on:
                locks.insert(0, (targets.fleet_lock,
                                 f"fleet {targets.profile_name} (its lock on host '{name}')"))
            for lock, what in locks:
                if not is_locked(remote, root, lock):
                    out(f"{what} is not locked")
                    continue
                holder = read_holder(remote, root, lock)
                out(f"{what} is locked by: {holder.describe() if holder else 'unknown'}")
                if not force:
                    out("not unlocking without --force (the holder may still be running)")
                    free = False
                    continue
                force_unlock(remote, root, lock)
                out("lock released")
    return free
