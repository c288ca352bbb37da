"""Files dsv4ctl writes on the controller: explicit modes, never through a link, whole or not at all.

``write_atomic`` is the one way the controller writes a file (a saved plan, a rendered tree, the
render marker): a temp file beside the target created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and its
final mode (``fchmod`` after, so the operator's umask neither widens nor narrows it: a umask of 0
made ``plan -o`` files 0666), then ``os.replace`` over the target, which replaces a name and never
follows one. ``make_dirs`` creates missing directories with an explicit mode and refuses a symbolic
link on the way. Stdlib only, at the bottom of the layering.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path


def make_dirs(root: Path, rel_parts: tuple[str, ...], mode: int = 0o755) -> Path:
    """``root/part/part...``, each missing directory created with ``mode``; a component that is a
    symbolic link or not a directory raises :class:`OSError`. ``root`` must exist."""
    d = root
    for part in rel_parts:
        d = d / part
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            os.mkdir(d, mode)
            os.chmod(d, mode)
            continue
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise OSError(f"{d} is a symbolic link or not a directory; dsv4ctl never writes "
                          "through one")
    return d


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` at permissions ``mode`` (see the module)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
