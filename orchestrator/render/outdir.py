"""``render -o DIR``: the directory render writes into, and the only files it removes there.

render writes into a directory that is empty or that it made, and removes only files it wrote
there. What it wrote is recorded in ``DIR/.dsv4ctl-render.json`` (mode 0600): each relative path
with the sha256 of what render wrote. The tree's own ``manifest.json`` is never trusted for this: a
planted one listing ``../`` or absolute paths made render delete them.

A re-render of the same directory checks the directory before touching anything:

- it is a real directory (not a link) owned by the user running render;
- everything in it is the marker, a file the marker lists or a directory on the way to one;
- each listed path is an expected relative name (orchestrator.host_data.relative_name) whose
  components below ``DIR`` are real directories, and each file render would remove is a regular
  file whose content still has the recorded sha256 (a file the operator edited is theirs).

Anything else refuses the whole render, naming the path, before a file is written or removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from orchestrator.errors import DsvError
from orchestrator.host_data import HostDataError, bounded_json, relative_name
from orchestrator.localfs import write_atomic

MARKER = ".dsv4ctl-render.json"
_FIX = "render into an empty or new directory (render -o makes it)"


def _refuse(out_dir: Path, why: str) -> DsvError:
    return DsvError(f"render -o {out_dir}: {why}; nothing was written or removed", fix=_FIX)


def _sha(path: Path) -> str | None:
    """sha256 of a regular file reached without following a link, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        h = hashlib.sha256()
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
        return h.hexdigest()


def _written(out_dir: Path) -> dict[str, str]:
    """What the marker says render wrote (path -> sha256), checked."""
    marker = out_dir / MARKER
    try:
        st = os.lstat(marker)
    except FileNotFoundError:
        raise _refuse(out_dir, "it is not empty and render did not make it (no "
                      f"{MARKER})") from None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise _refuse(out_dir, f"{MARKER} is not a file render wrote")
    try:
        doc = bounded_json(marker.read_bytes(), str(marker), max_bytes=1 << 20)
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, dict):
            raise HostDataError(f"{marker} has no 'files' object")
        for rel, sha in files.items():
            relative_name(rel)
            if not isinstance(sha, str) or len(sha) != 64:
                raise ValueError(f"{rel!r}: not a sha256")
    except (HostDataError, ValueError, OSError) as exc:
        raise _refuse(out_dir, f"{MARKER} is not render's: {exc}") from None
    return files


def prepare(out_dir: Path, new_files: set[str]) -> None:
    """Make ``out_dir`` ready for a tree of ``new_files``: create it, or check it is empty or a
    previous render's, and remove that render's files the new tree no longer has."""
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        out_dir.mkdir(mode=0o755, parents=True)
        os.chmod(out_dir, 0o755)
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _refuse(out_dir, "it is a symbolic link or not a directory")
    if st.st_uid != os.geteuid():
        raise _refuse(out_dir, f"it is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})")
    if not any(out_dir.iterdir()):
        return
    files = _written(out_dir)
    dirs = {"/".join(rel.split("/")[:i]) for rel in files for i in range(1, rel.count("/") + 1)}
    for p in sorted(out_dir.rglob("*")):
        rel = p.relative_to(out_dir).as_posix()
        if rel == MARKER or (rel in files and not p.is_symlink()):
            continue
        if rel in dirs and p.is_dir() and not p.is_symlink():
            continue
        raise _refuse(out_dir, f"it holds {rel}, which render did not write there")
    for rel in sorted(set(files) - new_files):
        path = out_dir / rel
        if not path.exists() and not path.is_symlink():
            continue
        if _sha(path) != files[rel]:
            raise _refuse(out_dir, f"{rel} changed since render wrote it (or is not a regular "
                          "file); it is yours now")
    for rel in sorted(set(files) - new_files):
        (out_dir / rel).unlink(missing_ok=True)


def record(out_dir: Path, written: list[Path]) -> None:
    """Write the marker: each file just written, with its sha256."""
    files = {p.relative_to(out_dir).as_posix(): _sha(p) or "" for p in written}
    write_atomic(out_dir / MARKER, (json.dumps({"files": files}, indent=2, sort_keys=True)
                                    + "\n").encode(), 0o600)
