"""Which releases ``keep_releases`` lets us delete (pure; the store does the deleting).

Rules (Capistrano's keep_releases, minus its footgun capistrano#68 of deleting what ``current``
points to): keep the newest ``keep`` releases by sequence, and *always* keep the current release
and the last healthy one, even when they are older than that window. Anything that is not a release
id (temp upload dirs, stray files) is not this function's business.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.release_ids import sort_ids


def select_prunable(ids: Iterable[str], *, keep: int, current: str | None,
                    last_healthy: str | None) -> list[str]:
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    ordered = sort_ids(ids)
    kept = set(ordered[-keep:])
    kept.update(x for x in (current, last_healthy) if x)
    return [i for i in ordered if i not in kept]
