"""The drift probe: what on the host differs from the current release's manifest, as a fact.

Owns reading what ``status`` calls drift so that ``plan --live`` (and apply, through the same
facts) can list it as actions: each file of ``current`` hashed against the manifest, each
installed unit file against the release's, a ``current`` whose release directory is gone, and
the command line each of the release's units runs now (its MainPID's ``/proc`` cmdline, from its
first ``--`` flag: the planner compares it with the release's, as ``status`` does). Run in the
facts batch (one round trip with the other probes); parsed strictly, since it comes
back from the host: unknown lines and paths outside the release tree are refused.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, NamedTuple, Protocol

from orchestrator.errors import RemoteError


class Shell(Protocol):
    """What this module needs of a host (:class:`orchestrator.remote.probes.Shell`, which
    imports this module: a protocol here, not an import back, keeps the two out of a cycle)."""

    def run(self, command: str, *, timeout: float | None = None) -> Any: ...

# The release directory itself (``current`` points at a directory that is not there).
RELEASE_DIR = "."
_KINDS = {"modified", "missing"}
_PATH = re.compile(r"^(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9._/@-]{0,255}$")

_SCRIPT = r"""
import hashlib, json, os, subprocess, sys
root, unitdir, scope = sys.argv[1], sys.argv[2], sys.argv[3]
cur = os.path.join(root, 'current')
def sha(p):
    try:
        with open(p, 'rb') as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
if os.path.islink(cur):
    try:
        files = json.load(open(os.path.join(cur, 'manifest.json'))).get('files', {})
    except OSError:
        print('release\t.\tmissing'); sys.exit(0)
    for p, v in sorted(files.items()):
        h = v.get('sha256') if isinstance(v, dict) else None
        if not h:
            continue
        d = sha(os.path.join(cur, p))
        if d != h:
            print('file\t%s\t%s' % (p, 'missing' if d is None else 'modified'))
        if p.startswith('units/') and p.count('/') == 1:
            i = sha(os.path.join(unitdir, p[len('units/'):]))
            if i != h:
                print('unit\t%s\t%s' % (p, 'missing' if i is None else 'modified'))
    # what each unit runs now: one systemctl call for all of them (a no-change apply reads this)
    units = sorted(p[len('units/'):] for p in files if p.startswith('units/') and p.count('/') == 1)
    if units:
        ctl = ['systemctl'] + (['--user'] if scope == 'user' else [])
        try:
            shown = subprocess.run(ctl + ['show', '-p', 'Id', '-p', 'MainPID', '--'] + units,
                                   capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            shown = ''
        for block in shown.split('\n\n'):
            kv = dict(ln.split('=', 1) for ln in block.splitlines() if '=' in ln)
            pid, unit = kv.get('MainPID', '0'), kv.get('Id')
            if unit not in units or not pid.isdigit() or pid == '0':
                continue
            try:
                with open('/proc/%s/cmdline' % pid, 'rb') as f:
                    words = f.read().decode('utf-8', 'replace').split('\0')[:-1]
            except OSError:
                continue
            first = next((i for i, w in enumerate(words) if w.startswith('--')), len(words))
            print('cmdline\tunits/%s\t%s' % (unit, json.dumps(words[first:])))
"""


class Drift(NamedTuple):
    """What the drift probe read: ``files`` (:func:`parse_drift`) and ``running`` (unit -> the
    command line its main process runs, from its first ``--`` flag; units not running absent)."""

    files: dict[str, str]
    running: dict[str, list[str]]


def drift_command(install_root: str, unit_dir: str, scope: str) -> str:
    """Print one ``kind<TAB>path<TAB>how`` line per difference (nothing when none, or when no
    release is current). ``kind``: ``file`` (the release tree), ``unit`` (the installed unit
    file), ``release`` (the directory ``current`` points at); and one ``cmdline<TAB>units/UNIT
    <TAB>JSON words`` line per running unit of the release. ``unit_dir``: the shell expression
    of the unit directory (``probes.unit_dir_expr``); ``scope``: ``user`` or ``system``."""
    # -I: no PYTHON* variables, no user site and no working directory (the SSH session's is
    # $HOME) on the module path; -S: no site import, which the stdlib-only script does not need
    # and which is most of a bare interpreter's start-up
    return (f"python3 -I -S -c {shlex.quote(_SCRIPT)} {shlex.quote(install_root.rstrip('/'))} "
            f"{unit_dir} {shlex.quote(scope)}")


def parse_drift(stdout: str) -> dict[str, str]:
    """``{path: why}`` for each difference: ``modified``/``missing`` for a release file,
    ``installed unit modified``/``installed unit missing`` for a unit file, and
    :data:`RELEASE_DIR` ``: missing`` when the release directory is gone."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        cols = line.split("\t")
        if cols[0] == "cmdline":  # parse_running's
            continue
        if len(cols) != 3 or cols[0] not in ("file", "unit", "release") or cols[2] not in _KINDS:
            raise RemoteError(f"unexpected output from the drift probe: {line[:200]!r}")
        kind, path, how = cols
        if kind == "release":
            out[RELEASE_DIR] = how
            continue
        if not _PATH.match(path):
            raise RemoteError(f"the current manifest names an unsafe path: {path[:200]!r}")
        if kind == "unit":
            how = f"installed unit {how}"
            if path in out:  # the release's copy and the installed one both differ
                how = f"{out[path]}; {how}"
        out[path] = how
    return dict(sorted(out.items()))


def parse_running(stdout: str) -> dict[str, list[str]]:
    """``{unit: words}`` from the probe's ``cmdline`` lines (the other lines are
    :func:`parse_drift`'s)."""
    out: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        cols = line.split("\t")
        if cols[0] != "cmdline":
            continue
        unit = cols[1].removeprefix("units/") if len(cols) == 3 else ""
        try:
            words = json.loads(cols[2]) if unit else None
        except ValueError:
            words = None
        if (not cols[1].startswith("units/") or "/" in unit or not _PATH.match(unit)
                or not isinstance(words, list) or not all(isinstance(w, str) for w in words)):
            raise RemoteError(f"unexpected output from the drift probe: {line[:200]!r}")
        out[unit] = words
    return dict(sorted(out.items()))


def probe_drift(shell: Shell, install_root: str, unit_dir: str, scope: str) -> Drift:
    res = shell.run(drift_command(install_root, unit_dir, scope), timeout=60)
    if not res.ok:
        raise RemoteError(f"reading the current release's drift failed (exit {res.rc}): "
                          f"{res.stderr[:300]}")
    return Drift(parse_drift(res.stdout), parse_running(res.stdout))
