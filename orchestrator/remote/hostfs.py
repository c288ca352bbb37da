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
- ``dsv4_env ENV``: the engine environment, its ``bin/`` and its interpreter pass the same owner and
  mode rules along their whole real paths, and nothing inside it is writable by group or others
  (:func:`check_engine_env`); checked before anything runs from it.

A refusal exits with :data:`REFUSED_RC` and prints ``dsv4ctl refuses PATH: REASON`` on stderr, which
the callers' errors carry to the user. Files themselves are written by
:meth:`orchestrator.remote.connection.RemoteHost.put_bytes` (a fresh temp file opened with
``O_CREAT|O_EXCL`` and its final mode, renamed over the target: neither step follows a link); once
the directories are checked, nobody but the deploying user or root can plant one in between.
"""

from __future__ import annotations

import shlex
from typing import Any

REFUSED_RC = 86

# POSIX sh (dash): `stat -c` is GNU coreutils, which every supported host has.
# Each check forks as little as it can (one `stat` for owner and mode, the uid read once per
# command, a chain of ancestors stat'ed in one call): the engine env's walk runs in every probe and
# every preflight, and cost ~40 forks, a tenth of a no-change apply (issue 30).
PRELUDE = r"""
dsv4_refuse() { printf 'dsv4ctl refuses %s: %s\n' "$1" "$2" >&2; exit 86; }
dsv4_me=$(id -u)
dsv4_owned() {
  [ "$_o" = 0 ] || [ "$_o" = "$dsv4_me" ] || dsv4_refuse "$1" \
    "it is owned by uid $_o, not by the deploying user (uid $dsv4_me) or root; chown it or \
choose another ${2:-install_root}"
  [ $(( 0$_m & 022 )) -eq 0 ] || dsv4_refuse "$1" \
    "it is writable by group or others (mode $_m); chmod go-w it or choose a dedicated \
${2:-install_root}"
}
dsv4_trusted() {
  _s=$(stat -c '%u %a' -- "$1") || dsv4_refuse "$1" "cannot stat it"
  _o=${_s% *}; _m=${_s#* }
  dsv4_owned "$1" "$2"
}
dsv4_trusted_all() {
  _what=$1; shift
  if ! _s=$(stat -c '%u %a' -- "$@" 2>/dev/null); then
    for _f; do dsv4_trusted "$_f" "$_what"; done  # names the one that cannot be stat'ed
  fi
  for _f; do
    _l=${_s%%"$dsv4_nl"*}; _s=${_s#*"$dsv4_nl"}
    _o=${_l% *}; _m=${_l#* }
    dsv4_owned "$_f" "$_what"
  done
}
dsv4_nl='
'
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
  set --
  while [ "$_p" != / ]; do
    _p=${_p%/*}; [ -n "$_p" ] || _p=/
    set -- "$@" "$_p"
  done
  dsv4_trusted_all install_root "$@"
}
dsv4_chain() {
  _p=$(cd -P -- "$1" && pwd -P) || dsv4_refuse "$1" "cannot enter it"
  set -- "$_p"
  while [ "$_p" != / ]; do
    _p=${_p%/*}; [ -n "$_p" ] || _p=/
    set -- "$@" "$_p"
  done
  dsv4_trusted_all "engine environment (engine.env)" "$@"
}
dsv4_env() {
  [ -d "$1" ] || dsv4_refuse "$1" "the engine environment is not a directory on the host"
  dsv4_chain "$1"
  [ -d "$1/bin" ] || dsv4_refuse "$1/bin" "the engine environment has no bin/"
  dsv4_chain "$1/bin"
  _i=$1/bin/python
  [ -e "$_i" ] || dsv4_refuse "$_i" "the engine environment has no interpreter"
  _n=0
  while [ -L "$_i" ]; do
    _n=$((_n + 1)); [ $_n -le 40 ] || dsv4_refuse "$_i" "too many levels of links"
    _o=$(stat -c %u -- "$_i")
    [ "$_o" = 0 ] || [ "$_o" = "$dsv4_me" ] || dsv4_refuse "$_i" \
      "this link is owned by uid $_o, not by the deploying user or root"
    _t=$(readlink -- "$_i"); case $_t in /*) _i=$_t ;; *) _i=${_i%/*}/$_t ;; esac
  done
  dsv4_trusted "$_i" "engine environment (engine.env)"
  dsv4_chain "${_i%/*}"
  _w=$(find "$1" -xdev ! -type l \( -perm -0002 -o -perm -0020 -o \
    \( ! -uid 0 ! -uid "$dsv4_me" \) \) -print -quit 2>/dev/null)
  [ -z "$_w" ] || dsv4_refuse "$_w" "it is inside the engine environment and writable by group \
or others, or owned by another user: whoever can change it runs code as the deploying user"
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


def check_engine_env(env: str) -> str:
    """A command that verifies the engine environment before anything runs from it: the env, its
    ``bin/`` and the interpreter (every link on the way and its real target) owned by the deploying
    user or root and not writable by group or others, and so is every ancestor of their real
    paths; nothing inside the env writable by group or others or owned by another user. The same
    rule as the install root (OpenSSH's StrictModes and sudo refuse such files too): whoever can
    replace ``bin/python`` runs code as the deploying user."""
    return f"{PRELUDE}\ndsv4_env {_q(env.rstrip('/') or '/')}"


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


def remove_if_present(shell: Any, path: str) -> bool:
    """Remove the file ``path`` on the host if it exists; True when there was one. The reset of
    a stored fact (calibration.json, kernels-qualification.json) on the host."""
    quoted = shlex.quote(path)
    res = shell.run(f"if [ -e {quoted} ]; then rm -f {quoted} && echo removed; fi", timeout=30)
    return "removed" in res.stdout
