"""Which kernels each running engine process loaded: the one reader of the hook's activation line.

The kernels ship inside each release (``releases/<id>/kernels/``, issue 20 item 6) and the SGLang
activation hook (``dsv4_kernels.sglang_hook``) logs, in the engine process, the directory it
imported them from (symlinks resolved) with that process's pid. For a unit's MainPID this module
finds that line in the role's log and names the release and its ``kernels.json`` digest, in one
round trip for all roles. ``dsv4ctl status`` shows it per unit (what runs now); the record steps
save it in the release record when the release is verified healthy, and ``dsv4ctl history`` shows
that (issue 20's acceptance: status and history say which kernels the running engines loaded).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from orchestrator.errors import DsvError
from orchestrator.release_ids import is_release_id

# The line dsv4_kernels.sglang_hook logs when it activates in an engine process
# (sglang_hook.ACTIVE_LOG; spelled twice because the core may not import the kernels package,
# tests pin that they agree).
KERNELS_LOG = "[dsv4_kernels] active"
NONE_LOADED = "none loaded (no activation line from this pid in its log)"
_MARK = "@@dsv4-kernels "


def kernels_loaded(log_text: str, pid: int) -> str | None:
    """The kernels directory the engine process ``pid`` imported, from its log (the hook's
    activation line, symlinks resolved); None when that process logged none."""
    found = None
    prefix = f"{KERNELS_LOG} (pid {pid}): kernels from "
    for line in log_text.splitlines():
        if line.startswith(prefix):
            found = line[len(prefix):].strip()
    return found


def describe(path: str | None, digests: dict[str, str]) -> str:
    """``release <id>, sha256 <12 hex>`` for a release's kernels dir; the path itself for a copy
    outside the releases (an older, pip-installed one); :data:`NONE_LOADED` for no line."""
    if path is None:
        return NONE_LOADED
    release = release_of(path)
    if release is None:
        return path
    return f"release {release}, sha256 {digests.get(release, 'digest unreadable')}"


def release_of(path: str) -> str | None:
    parts = path.rstrip("/").split("/")
    release = parts[-2] if len(parts) >= 2 and parts[-1] == "kernels" else ""
    return release if is_release_id(release) else None


def loaded_by_pid(remote: Any, store: Any, install_root: str,
                  pids: dict[str, int]) -> dict[str, str]:
    """role -> what its engine process (``pids[role]``, its unit's MainPID) loaded, for every
    role with a live pid: the activation lines in one round trip, then the digest of each
    release named (read from the release, never from the log)."""
    live = {role: pid for role, pid in sorted(pids.items()) if pid}
    if not live:
        return {}
    script = "; ".join(
        f"printf '%s\\n' {shlex.quote(_MARK + role)}; "
        f"grep -aF {shlex.quote(f'{KERNELS_LOG} (pid {pid})')} "
        f"{shlex.quote(f'{install_root}/logs/{role}.log')} 2>/dev/null | tail -n 1"
        for role, pid in live.items())
    res = remote.run(script, timeout=30)
    text: dict[str, list[str]] = {}
    role = None
    for line in res.stdout.splitlines():
        if line.startswith(_MARK):
            role = line[len(_MARK):]
            text[role] = []
        elif role is not None:
            text[role].append(line)
    paths = {r: kernels_loaded("\n".join(text.get(r, [])), pid) for r, pid in live.items()}
    digests: dict[str, str] = {}
    for release in sorted({rel for p in paths.values() if p and (rel := release_of(p))}):
        try:
            digests[release] = json.loads(store.read_files(release, ["kernels.json"])
                                          ["kernels.json"])["sha256"][:12]
        except (DsvError, KeyError, ValueError, TypeError):
            digests[release] = "digest unreadable"
    return {r: describe(p, digests) for r, p in paths.items()}
