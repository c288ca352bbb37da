"""A fleet's run journals on its lock host: where they live, their numbers, reading them back.

Owns the layout ``<install_root>/fleet/<profile>/<sequence>.json`` (runs numbered in the order
they ran, never by a clock) and the one reader of it, which checks each journal as host data
(:func:`orchestrator.host_data.fleet_journal`). The driver (:mod:`.fleet_ops`) writes them; the
fleet's status and history (:mod:`.fleet_view`) read them.
"""

from __future__ import annotations

import shlex
from typing import Any

from orchestrator.errors import DsvError


def journal_dir(root: str, profile_name: str) -> str:
    """Where a fleet's run journals live on its lock host."""
    return f"{root}/fleet/{profile_name}"


def sequence_of(file_name: str) -> int | None:
    """The run number of a journal file (``00000012.json``), None for any other name."""
    stem, dot, ext = file_name.rpartition("/")[2].partition(".")
    return int(stem) if dot and ext == "json" and stem.isdigit() else None


def read_journals(remote: Any, root: str, profile_name: str, *, last: bool = False
                  ) -> list[dict[str, Any]]:
    """The fleet's run journals in the order the runs ran (by their sequence number; journals
    written before runs were numbered, ``fleet/<profile>-<time>.json``, first, in name order).
    ``last``: only the newest."""
    d = shlex.quote(journal_dir(root, profile_name))
    legacy = shlex.quote(f"{root}/fleet")
    prefix = shlex.quote(profile_name + "-")
    # one JSON document per line (jq-free): each journal file squeezed onto one line; the
    # zero-padded numbers sort as the runs ran
    pick = "| tail -n 1" if last else ""
    res = remote.run(
        f"{{ [ -d {d} ] && cd {d} && ls -1 -- | grep -E '^[0-9]+[.]json$' | sort {pick} | "
        "while read -r f; do tr -d '\\n' < \"$f\"; echo; done; } ; "
        + ("" if last else
           f"{{ cd {legacy} 2>/dev/null && for f in $(ls -1 -- {prefix}*.json 2>/dev/null | sort); "
           "do printf 'legacy '; tr -d '\\n' < \"$f\"; echo; done; }; ")
        + "exit 0", timeout=60)
    from orchestrator.host_data import fleet_journal

    numbered: list[dict[str, Any]] = []
    older: list[dict[str, Any]] = []
    for n, line in enumerate(res.stdout.splitlines(), 1):
        into = older if line.startswith("legacy ") else numbered
        # host data (issue 31): a hostile journal crashed `history`; one that is not a fleet
        # journal is shown as unreadable, the others as they are
        try:
            into.append(fleet_journal(line.removeprefix("legacy "),
                                      f"fleet journal {n} on host '{remote.name}'"))
        except DsvError as exc:
            into.append({"kind": "unreadable", "started": "?", "exit_code": None,
                         "stopped_after_wave": None, "reason": exc.message, "outcomes": []})
    numbered.sort(key=lambda j: j.get("sequence") or 0)
    return older + numbered
