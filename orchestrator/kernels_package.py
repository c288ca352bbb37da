"""The bundled kernels package (``kernels/``) as a release ships it: where it is, its files, digest.

Owns what counts as "the kernels of a release". ``apply`` installs exactly :func:`package_files`
(issue 24), and :mod:`orchestrator.render` records :func:`digest` in the release's
``kernels.json``, read by every engine role: a kernel change is then a change of the release, which
``plan``, ``diff`` and ``apply`` see through the one transition model and answer by restarting the
engines that load the kernels (issue 20 item 5: apply said "No changes." after a kernel change).
Standard library only: it sits on the ``plan`` path.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

from orchestrator.paths import _PACKAGE

# What a host gets of kernels/: the installable package, nothing else (no tests, tools,
# experiments, notes or build outputs; issue 24).
SHIPPED = ("pyproject.toml", "dsv4_kernels")


def source() -> Path | None:
    """The kernels package of this dsv4ctl: an installed wheel's ``_data/kernels``, else the
    checkout's ``kernels/``; None when neither holds one."""
    for cand in (_PACKAGE / "_data" / "kernels", _PACKAGE.parent / "kernels"):
        if (cand / "pyproject.toml").is_file():
            return cand
    return None


def package_files(src: Path) -> list[str]:
    """The files of the kernels package under ``src``, relative and sorted: ``pyproject.toml``
    and ``dsv4_kernels/**/*.py``. In a source checkout only files git tracks count, so an
    untracked ``build/``, scratch module or stray copy never ships; an installed dsv4ctl's
    ``_data/kernels`` holds only what its wheel packed."""
    cands = [src / "pyproject.toml", *sorted((src / "dsv4_kernels").rglob("*.py"))]
    rels = [p.relative_to(src).as_posix() for p in cands
            if p.is_file() and "__pycache__" not in p.parts]
    try:
        res = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--", *SHIPPED],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return rels
    tracked = set(res.stdout.split("\0"))
    if res.returncode != 0 or not tracked & set(rels):
        return sorted(rels)  # not in a checkout: an installed dsv4ctl (perhaps in a .venv)
    return sorted(r for r in rels if r in tracked)


@functools.cache
def digest() -> str | None:
    """sha256 over the shipped files' names and contents (None without a kernels package).
    Cached: a process plans many releases (a fleet) with one dsv4ctl."""
    src = source()
    if src is None:
        return None
    h = hashlib.sha256()
    for rel in package_files(src):
        h.update(rel.encode() + b"\0" + hashlib.sha256((src / rel).read_bytes()).digest())
    return h.hexdigest()
