"""Release ids: sortable, unique, readable.

A bottom-layer module (paths/errors rank): the release store and the remote probe that reads the
host's newest release both need the one rule of what a release id is.

``r0007-20261129T101500Z-1a2b3c4d``: a sequence number (so ``ls`` and string sort give apply order
even if the controller's clock is wrong), the controller's UTC time at apply (for humans), and the
first 8 hex digits of the plan's content hash (two applies of the same plan are recognisable). Only
apply reads the clock; plan never does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

RELEASE_RE = re.compile(r"^r([0-9]{4,})-([0-9]{8}T[0-9]{6}Z)-([0-9a-f]{8})$")


def is_release_id(name: str) -> bool:
    return RELEASE_RE.match(name) is not None


def sequence(release_id: str) -> int:
    m = RELEASE_RE.match(release_id)
    if not m:
        raise ValueError(f"not a release id: {release_id!r}")
    return int(m.group(1))


def new_release_id(existing: Iterable[str], now: datetime, content_hash: str) -> str:
    """The next id after ``existing`` (any non-release names are ignored)."""
    seqs = [sequence(r) for r in existing if is_release_id(r)]
    if len(content_hash) < 8 or not re.fullmatch(r"[0-9a-f]+", content_hash[:8]):
        raise ValueError(f"content hash must start with 8 hex digits, got {content_hash!r}")
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"r{max(seqs, default=0) + 1:04d}-{stamp}-{content_hash[:8]}"


def sort_ids(ids: Iterable[str]) -> list[str]:
    """Oldest first, by sequence number."""
    return sorted((i for i in ids if is_release_id(i)), key=sequence)
