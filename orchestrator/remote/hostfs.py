"""Writing under the install root on a host without following symbolic links (issue 19, Deliver 4).

Owns the rules for the host's filesystem, as shell functions every command that creates something
under ``install_root`` runs first (they are sent with the command, nothing is installed):

- ``dsv4_root ROOT``: the install root exists (created if absent), is a real directory (not a
  link), is owned by the deploying user or root and is not writable by group or others; so is
  every ancestor of its real path (``/tmp/x`` fails on ``/tmp``). Whoever could write there could
  swap the tree under dsv4ctl.
- ``dsv4_dir ROOT REL [MODE]``: each component of ``ROOT/REL`` below the root is a real directory
  with the same owner and mode rules, created with ``MODE`` when missing; a symbolic link there
  (a planted ``secrets`` or ``releases/<id>``) is refused, never followed.
- ``dsv4_nolink PATH``: the file about to be written is not a symbolic link.

A refusal exits with :data:`REFUSED_RC` and prints ``dsv4ctl refuses PATH: REASON`` on stderr, which
the callers' errors carry to the user. Files themselves are written by
:meth:`orchestrator.remote.connection.RemoteHost.put_bytes` (a fresh temp file opened with
``O_CREAT|O_EXCL`` and its final mode, renamed over the target: neither step follows a link); once
the directories are checked, nobody but the deploying user or root can plant one in between.
"""

from __future__ import annotations

import shlex

REFUSED_RC = 86

# POSIX sh (dash): `stat -c` is GNU coreutils, which every supported host has.
PRELUDE = r"""
dsv4_refuse() { printf 'dsv4ctl refuses %s: %s\n' "$1" "$2" >&2; exit 86; }
dsv4_trusted() {
  _o=$(stat -c %u -- "$1") && _m=$(stat -c %a -- "$1") || dsv4_refuse "$1" "cannot stat it"
  _me=$(id -u)
  [ "$_o" = 0 ] || [ "$_o" = "$_me" ] || dsv4_refuse "$1" \
    "it is owned by uid $_o, not by the deploying user (uid $_me) or root; chown it or \
choose another install_root"
  [ $(( 0$_m & 022 )) -eq 0 ] || dsv4_refuse "$1" \
    "it is writable by group or others (mode $_m); chmod go-w it or choose a dedicated install_root"
}
dsv4_nolink() {
  if [ -L "$1" ]; then dsv4_refuse "$1" \
    "it is a symbolic link (dsv4ctl never writes through one); remove it if you did not make it"; fi
}
dsv4_root() {
  dsv4_nolink "$1"
  [ -e "$1" ] || mkdir -p -m 0755 -- "$1" || dsv4_refuse "$1" "cannot create it"
  [ -d "$1" ] || dsv4_refuse "$1" "it is not a directory"
  dsv4_trusted "$1"
  _p=$(cd -P -- "$1" && pwd -P) || dsv4_refuse "$1" "cannot enter it"
  case $_p in
    /|/home|/root|/opt|/srv|/var|/var/lib|/mnt|/media|/usr/local|/tmp|/var/tmp|\
    /etc|/etc/*|/usr|/usr/*|/bin|/bin/*|/sbin|/sbin/*|/lib|/lib/*|/lib32|/lib32/*|/lib64|\
    /lib64/*|/boot|/boot/*|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*|/run|/run/*)
      dsv4_refuse "$1" "its real path $_p is a system directory; use a dedicated one such as \
/srv/dsv4" ;;
  esac
  while [ "$_p" != / ]; do
    _p=${_p%/*}; [ -n "$_p" ] || _p=/
    dsv4_trusted "$_p"
  done
}
dsv4_dir() {
  _d=$1; _rest=$2
  while [ -n "$_rest" ]; do
    _c=${_rest%%/*}
    case $_rest in */*) _rest=${_rest#*/} ;; *) _rest= ;; esac
    [ -n "$_c" ] || continue
    _d=$_d/$_c
    dsv4_nolink "$_d"
    [ -e "$_d" ] || mkdir -m "${3:-0755}" -- "$_d" || dsv4_refuse "$_d" "cannot create it"
    [ -d "$_d" ] || dsv4_refuse "$_d" "it is not a directory"
    dsv4_trusted "$_d"
  done
}
""".strip()


def _q(*words: str) -> str:
    return " ".join(shlex.quote(w) for w in words)


def check_root(root: str) -> str:
    """A command that verifies (and creates) the install root."""
    return f"{PRELUDE}\ndsv4_root {_q(root)}"


def ensure_dirs(root: str, *rels: str, mode: str = "0755") -> str:
    """A command that verifies or creates ``root/rel`` for each ``rel`` (no link followed)."""
    calls = "; ".join(f"dsv4_dir {_q(root, rel.strip('/'), mode)}" for rel in rels)
    return f"{PRELUDE}\n{calls}"


def relative(root: str, path: str) -> str:
    """``path`` relative to ``root``; a path outside the root is a programming error."""
    root = root.rstrip("/")
    if not path.startswith(root + "/"):
        raise ValueError(f"{path} is not under the install root {root}")
    return path[len(root) + 1:]
