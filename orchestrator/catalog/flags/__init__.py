"""Version-pinned flag tables of the engines dsv4ctl renders command lines for.

Owns the snapshots ``<engine>-<version>.json`` in this directory (written from the real parsers by
``scripts/snapshot_flags.py``; CI checks they still match) and :func:`load_flag_table`. Why: flags
are renamed and retired between engine releases (sglang 0.5.23 has no ``--cuda-graph-max-bs`` and
no ``--nsa-*``), so every rendered argv is validated against the exact version the profile pins,
on the ``dsv4ctl plan`` path, without importing the engine. Standard library only.

    table = load_flag_table("sglang", "0.5.23")
    table.has("--attn-dp-size")                      # True
    table.check(["--model-path", "/m", "--tp", "8"])  # [FlagProblem(kind="abbreviation", ...)]
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from orchestrator.catalog.flags.validator import FlagProblem, FlagSpec, FlagTable
from orchestrator.errors import DsvError

__all__ = [
    "FlagProblem",
    "FlagSpec",
    "FlagTable",
    "UnknownFlagTableError",
    "available_flag_tables",
    "load_flag_table",
]

_DIR = Path(__file__).resolve().parent
_NAME = re.compile(r"^(?P<engine>[a-z][a-z0-9-]*?)-(?P<version>\d[0-9A-Za-z.+-]*)\.json$")
SUPPORTED_FORMAT = 1


class UnknownFlagTableError(DsvError):
    """No snapshot exists for the requested engine/version, or the snapshot file is unreadable."""


def available_flag_tables() -> list[tuple[str, str]]:
    """(engine, version) of every snapshot shipped in this package, sorted."""
    found: list[tuple[str, str]] = []
    for path in _DIR.glob("*.json"):
        match = _NAME.match(path.name)
        if match:
            found.append((match["engine"], match["version"]))
    return sorted(found)


@functools.cache
def load_flag_table(engine: str, version: str) -> FlagTable:
    """The flag table of ``engine`` (``sglang`` or ``sglang-router``) at exactly ``version``."""
    path = _DIR / f"{engine}-{version}.json"
    if not _NAME.match(path.name) or not path.is_file():
        known = ", ".join(f"{e} {v}" for e, v in available_flag_tables()) or "none"
        raise UnknownFlagTableError(
            f"no flag table for engine {engine!r} version {version!r} (shipped: {known})",
            fix="pin an engine version dsv4ctl knows, or add a snapshot with "
            "scripts/snapshot_flags.py against that version installed",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UnknownFlagTableError(
            f"flag table {path.name} is unreadable: {exc}",
            fix="regenerate it: python scripts/snapshot_flags.py",
        ) from exc
    if data.get("format") != SUPPORTED_FORMAT or (data.get("engine"), data.get("version")) != (
        engine,
        version,
    ):
        raise UnknownFlagTableError(
            f"flag table {path.name} has format {data.get('format')!r} for "
            f"{data.get('engine')!r} {data.get('version')!r}; expected format {SUPPORTED_FORMAT} "
            f"for {engine!r} {version!r}",
            fix="regenerate it: python scripts/snapshot_flags.py",
        )
    return FlagTable.from_json(data)
