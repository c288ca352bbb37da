"""What a rollback of one host will do, read before anything changes, so the CLI shows it before
it asks (the prompt used to say only "restarts the roles that differ" and print `3 to restart`
after the answer).

Owns nothing of its own: the same target choice (``release.record.chosen_rollback_target``), the same
manifests and unit states the rollback's preflight reads, and the same transition function
(``planner.transition``). The preflight recomputes it under the host lock, so a host that moved
in between is handled there as before.
"""

from __future__ import annotations

from typing import Any

from orchestrator.profile.inventory import Host


def preview_rollback(host_name: str, host: Host, release: str | None
                     ) -> tuple[str, list[Any] | str, bool]:
    """(the target release, the transition's actions, whether it is a full outage); instead of
    the actions, why none can be shown when the target cannot be read back (the rollback's
    preflight then refuses it, records the refusal and changes nothing)."""
    from orchestrator.apply.context import load_release
    from orchestrator.apply.preflight import missing_release_part
    from orchestrator.planner.transition import outage, transition, units_of
    from orchestrator.release.record import chosen_rollback_target
    from orchestrator.release.store import ReleaseStore
    from orchestrator.remote.connection import connect
    from orchestrator.remote.systemd import ServiceManager

    remote = connect(host_name, host)
    try:
        store = ReleaseStore(remote, host.install_root)
        records = store.read_records()
        current = store.current()
        target = chosen_rollback_target(records, current, release, host_name)
        missing = missing_release_part(store, target)
        if missing is not None:
            return target, f"release {target} is incomplete on the host: {missing} is missing", False
        cur = (load_release(store, current)[0]
               if current is not None and missing_release_part(store, current) is None else None)
        tgt = load_release(store, target)[0]
        units = {*units_of(cur or {}).values(), *units_of(tgt).values()}
        states = {u: st.active for u, st in ServiceManager(remote, host.scope).show(
            sorted(units)).items() if st.loaded != "not-found"}
        actions = transition(cur, tgt, states)
        return target, actions, outage(actions, cur)
    finally:
        remote.close()
