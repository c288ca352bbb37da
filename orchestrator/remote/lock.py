"""The host lock: one dsv4ctl apply/rollback per host at a time, held by the kernel.

A lock file under the install root is ``flock``-ed by a process started over the apply's own SSH
connection. That process holds the lock while its stdin is open; when dsv4ctl finishes, is killed,
or the connection drops, sshd closes the channel, the process reads EOF and exits, and the kernel
releases the lock. No stale lock survives a crash, which is the failure mode users hate most in
Terraform, Helm and Deployer (terraform#28374, helm#8987, deployer#1291; see shared research anchors
A.2 #4).

Next to it, a holder-info file (remote pid of the flock process, then JSON: user, controller host,
controller pid, start time, command) exists for display only: it tells whoever is refused who holds
the lock, and ``dsv4ctl unlock --force`` shows it before ending the holder.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shlex
import socket
import time
from dataclasses import dataclass
from typing import Any

import paramiko

from orchestrator.errors import LockHeld, RemoteError
from orchestrator.remote import hostfs
from orchestrator.remote.connection import RemoteHost

LOCK_NAME = ".dsv4ctl.lock"
INFO_NAME = ".dsv4ctl.lock.info"
REFUSED_RC = 75  # flock -E: "lock held", distinct from real errors
OUTER_REFUSED_RC = 76  # the same for the outer lock a fleet of one takes first (HostLock outer=)
_END = "@@dsv4-lock-then-done"  # ends the output of acquire(then=...)


def lock_paths(install_root: str, name: str = LOCK_NAME) -> tuple[str, str]:
    """The lock file and its holder-info file (``name``: the host lock, or a fleet's lock)."""
    info = INFO_NAME if name == LOCK_NAME else name + ".info"
    return f"{install_root}/{name}", f"{install_root}/{info}"


@dataclass(frozen=True)
class Holder:
    remote_pid: int | None
    info: dict[str, Any]

    def describe(self) -> str:
        i = self.info
        parts = [f"user {i.get('user', '?')} on {i.get('controller', '?')} "
                 f"(pid {i.get('pid', '?')})",
                 f"since {i.get('started', '?')}",
                 # quoted: the holder's own command line, which the CLI shows as it was
                 # instead of completing it with this run's -p/-i (cli/rerun.py)
                 f"running: \"{i.get('command', '?')}\""]
        if self.remote_pid is not None:
            parts.append(f"lock process pid {self.remote_pid} on the host")
        return ", ".join(parts)


def holder_info(command: str) -> dict[str, Any]:
    """Who we are, for the info file. No secrets: user, host name, pid, time, the command line."""
    return {
        "user": getpass.getuser(),
        "controller": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
    }


def parse_holder(text: str) -> Holder | None:
    """The info file, read back from the host (host data, for display only: issue 31): bounded
    JSON, a pid of at most 10 digits, each shown field a short string."""
    from orchestrator.host_data import HostDataError, bounded_json

    lines = text.splitlines()
    if not lines:
        return None
    first = lines[0].strip()
    pid = int(first) if first.isdigit() and len(first) <= 10 else None
    try:
        info = bounded_json("\n".join(lines[1:]), "the lock's info file",
                            max_bytes=64 << 10) if len(lines) > 1 else {}
    except HostDataError:
        info = {"raw": "\n".join(lines[1:])[:300]}
    if not isinstance(info, dict):
        info = {}
    shown = {k: str(v)[:300] for k, v in info.items()
             if k in ("user", "controller", "pid", "started", "command", "raw")}
    return Holder(remote_pid=pid, info=shown)


def read_holder(remote: RemoteHost, install_root: str, name: str = LOCK_NAME) -> Holder | None:
    _, info = lock_paths(install_root, name)
    res = remote.run(f"cat {shlex.quote(info)} 2>/dev/null", timeout=30)
    return parse_holder(res.stdout) if res.ok else None


def is_locked(remote: RemoteHost, install_root: str, name: str = LOCK_NAME) -> bool:
    lock, _ = lock_paths(install_root, name)
    q = shlex.quote(lock)
    res = remote.run(f"[ -e {q} ] || exit 0; flock -n -E {REFUSED_RC} {q} true", timeout=30)
    if res.rc == REFUSED_RC:
        return True
    if not res.ok:
        raise RemoteError(f"cannot test the lock on host '{remote.name}': {res.stderr.strip()}")
    return False


def _write_info(info: str, pid: str, payload: str) -> str:
    """Shell (under the hostfs prelude, umask 077 and noclobber) that writes a holder-info file
    naming ``pid``: never through a planted link (issue 19): refuse one, and create the temp file
    exclusively (noclobber: O_EXCL) so nothing can slip in between check and write."""
    tmp = shlex.quote(info + ".tmp")
    return (f"dsv4_nolink {tmp}; dsv4_nolink {shlex.quote(info)}; rm -f {tmp}; "
            f"printf '%s\\n%s\\n' \"{pid}\" {shlex.quote(payload)} > {tmp} && "
            f"mv -fT {tmp} {shlex.quote(info)}; ")


def _tidy_info(info: str, pid: str) -> str:
    """Shell that removes a holder-info file if it still names ``pid`` (ours)."""
    q = shlex.quote(info)
    return f"[ \"$(head -n 1 {q} 2>/dev/null)\" = \"{pid}\" ] && rm -f {q}; "


class HostLock:
    """Acquire with :meth:`acquire`; :meth:`release` (or the connection dying) frees it.

    ``outer``: another lock's file name under the same install root, taken first and in the same
    command (``flock OUTER flock LOCK ...``), held and freed with this one. The fleet of one takes
    its fleet lock so, then its host lock: the lock protocol of every fleet (issue 30) at no extra
    round trip. A refusal of either names that lock's own holder."""

    def __init__(self, remote: RemoteHost, install_root: str, command: str, *,
                 name: str = LOCK_NAME, outer: str | None = None) -> None:
        self.remote = remote
        self.install_root = install_root
        self.command = command
        self.name = name  # LOCK_NAME, or a fleet lock's file name (orchestrator/apply/fleet_ops)
        self.outer = outer
        self._chan: paramiko.Channel | None = None
        self.remote_pid: int | None = None

    def _script(self, then: str | None = None) -> str:
        lock, info = lock_paths(self.install_root, self.name)
        payload = json.dumps(holder_info(self.command), sort_keys=True)
        # Runs as the child of flock (-o: only flock itself holds the lock fd, so ending flock's
        # pid - what `unlock --force` does - frees the lock). $PPID is flock's pid; with an
        # outer lock, its flock is the parent of ours (read from /proc with builtins: no fork).
        outer_info = lock_paths(self.install_root, self.outer)[1] if self.outer else None
        inner = (
            f"{hostfs.PRELUDE}\ndsv4_um=$(umask); umask 077; set -C; "
            + _write_info(info, "$PPID", payload)
            + ("dsv4_op=; while read -r k v; do [ \"$k\" = PPid: ] && dsv4_op=$v && break; "
               "done < /proc/$PPID/status; " + _write_info(outer_info, "$dsv4_op", payload)
               if outer_info else "")
            + "echo LOCKED $PPID; "
            # what the caller reads under the lock, in this same round trip (issue 20 #10): in a
            # subshell (its `exit` never ends the holder) with the session's umask and clobbering
            + (f"( set +C; umask \"$dsv4_um\"; {then}\n) </dev/null; "
               f"printf '\\n%s\\n' {shlex.quote(_END)}; " if then else "")
            +
            # hold until our stdin closes (release, exit or dropped connection), then tidy up the
            # info file if it is still ours
            "cat >/dev/null; " + _tidy_info(info, "$PPID")
            + (_tidy_info(outer_info, "$dsv4_op") if outer_info else "") + "exit 0"
        )
        take = f"flock -n -o -E {REFUSED_RC} {shlex.quote(lock)} sh -c {shlex.quote(inner)}"
        if self.outer:
            outer_lock = shlex.quote(lock_paths(self.install_root, self.outer)[0])
            return (f"{hostfs.check_root(self.install_root)}\ndsv4_nolink {shlex.quote(lock)}; "
                    f"dsv4_nolink {outer_lock}\n"
                    f"exec flock -n -o -E {OUTER_REFUSED_RC} {outer_lock} {take}")
        return (f"{hostfs.check_root(self.install_root)}\ndsv4_nolink {shlex.quote(lock)}\n"
                f"exec {take}")

    def acquire(self, timeout: float = 30.0, *, then: str | None = None,
                then_timeout: float = 300.0) -> str:
        """Take the lock or raise :class:`LockHeld`. ``then``: a shell script run on the host
        right after the lock is taken, in the same round trip; its stdout is returned ("" without
        one)."""
        chan = self.remote.open_process(self._script(then))
        chan.settimeout(timeout)
        buf = b""
        deadline = time.monotonic() + timeout
        try:
            while b"\n" not in buf:
                if time.monotonic() > deadline:
                    raise RemoteError(f"taking the lock on host '{self.remote.name}' timed out")
                data = chan.recv(1 << 16)
                if not data:
                    break
                buf += data
        except (TimeoutError, OSError) as exc:
            chan.close()
            raise RemoteError(f"taking the lock on host '{self.remote.name}' failed: {exc}") \
                from exc
        first, _, rest = buf.partition(b"\n")
        line = first.decode(errors="replace").strip()
        if line.startswith("LOCKED"):
            self._chan = chan
            pid = line.split()[-1]
            self.remote_pid = int(pid) if pid.isdigit() else None
            return self._read_then(chan, rest, then_timeout) if then else ""
        rc = chan.recv_exit_status()
        err = chan.recv_stderr(4096).decode(errors="replace").strip()
        chan.close()
        # the refused lock (without an outer lock, 76 is no refusal: it stays an error below)
        name = {REFUSED_RC: self.name, OUTER_REFUSED_RC: self.outer}.get(rc)
        if name is not None:
            # its holder (a fleet lock has its own info file beside the host's)
            holder = read_holder(self.remote, self.install_root, name)
            who = holder.describe() if holder else "unknown holder (no info file)"
            if name != LOCK_NAME:
                raise LockHeld(
                    f"the lock {name} on host '{self.remote.name}' is held by another "
                    f"dsv4ctl run: {who}",
                    fix="wait for that run to finish; the lock is freed when it ends or its SSH "
                        "connection drops",
                )
            raise LockHeld(
                f"host '{self.remote.name}' is locked by another dsv4ctl run: {who}",
                fix="wait for it to finish; if that run is dead and its lock still held, "
                    f"`dsv4ctl unlock --force --host {self.remote.name}` shows the holder and "
                    "ends it",
            )
        if rc == hostfs.REFUSED_RC:
            raise RemoteError(f"cannot take the lock on host '{self.remote.name}': {err or line}",
                              fix="install_root must be a dedicated directory owned by the deploying "
                                  "user or root, not writable by group or others, with no symbolic "
                                  "link planted in it")
        raise RemoteError(f"cannot take the lock on host '{self.remote.name}' (exit {rc}): "
                          f"{err or line}", fix="`flock` (util-linux) must exist on the host and "
                          "the install root must be writable")

    def _read_then(self, chan: paramiko.Channel, buf: bytes, timeout: float) -> str:
        """The output of ``then`` (acquire), up to the end mark the holder prints after it."""
        end = b"\n" + _END.encode() + b"\n"
        deadline = time.monotonic() + timeout
        chan.settimeout(timeout)
        try:
            while end not in buf:
                if time.monotonic() > deadline:
                    raise RemoteError(f"reading the host's state under the lock on host "
                                      f"'{self.remote.name}' timed out after {timeout:g}s")
                data = chan.recv(1 << 16)
                if not data:
                    raise RemoteError(f"the lock holder on host '{self.remote.name}' ended "
                                      "before the host's state was read")
                buf += data
        except (TimeoutError, OSError) as exc:
            raise RemoteError(f"reading the host's state under the lock on host "
                              f"'{self.remote.name}' failed: {exc}") from exc
        return buf[:buf.index(end)].decode("utf-8", "replace")

    @property
    def held(self) -> bool:
        return self._chan is not None and not self._chan.closed

    def release(self) -> None:
        chan, self._chan = self._chan, None
        if chan is None:
            return
        with contextlib.suppress(Exception):  # a dead connection has released it already
            chan.shutdown_write()
            chan.settimeout(10)
            chan.recv_exit_status()
        with contextlib.suppress(Exception):
            chan.close()

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# The kernel's own account of who holds the lock (issue 31): `unlock --force` used to signal the
# pid in the info file, which anyone who can write the install root... or a stale file names.
# /proc/locks lists each flock with the pid of its holder and the file as MAJ:MIN:INODE (hex
# major and minor, decimal inode; proc(5)); a line with "->" is a waiter, not a holder.
HOLDERS_COMMAND = (
    "set -e; s=$(stat -L -c '%d %i' -- {lock}); d=${{s% *}}; i=${{s#* }}; "
    "printf 'KEY %02x:%02x:%s\\n' $(( (d >> 8) & 0xfff )) $(( (d & 0xff) | ((d >> 12) & 0xfff00) )) "
    "\"$i\"; cat /proc/locks"
)


def parse_lock_holders(text: str) -> list[int]:
    """The pids that hold (not wait for) a FLOCK on the file whose key the command printed."""
    lines = text.splitlines()
    key = next((ln.split()[1] for ln in lines if ln.startswith("KEY ") and len(ln.split()) == 2),
               None)
    pids: list[int] = []
    for ln in lines:
        f = ln.split()
        if key is None or "->" in f or len(f) < 6 or f[1] != "FLOCK":
            continue
        if f[5] == key and f[4].isdigit():
            pids.append(int(f[4]))
    return sorted(set(pids))


def lock_holders(remote: RemoteHost, install_root: str, name: str = LOCK_NAME) -> list[int]:
    """Pids holding the lock, as the host's kernel says (/proc/locks)."""
    lock, _ = lock_paths(install_root, name)
    res = remote.run(HOLDERS_COMMAND.format(lock=shlex.quote(lock)), timeout=30)
    if not res.ok:
        raise RemoteError(f"cannot read the lock table on host '{remote.name}': "
                          f"{(res.stderr or res.stdout).strip()[:200]}")
    return parse_lock_holders(res.stdout)


def force_unlock(remote: RemoteHost, install_root: str, name: str = LOCK_NAME) -> Holder | None:
    """End the process holding the lock ``name`` (the host's, or a fleet's) after the caller
    showed the holder. Returns the holder.

    Only the process the kernel lists as the lock's holder is signalled (and, when it is
    dsv4ctl's own ``flock`` holder, the shell it runs), never a pid from the info file: that file
    is for display, and a stale or planted one named a process that did not hold the lock."""
    holder = read_holder(remote, install_root, name)
    if not is_locked(remote, install_root, name):
        return holder
    pids = lock_holders(remote, install_root, name)
    if not pids:
        raise RemoteError(f"the lock on host '{remote.name}' is held but the kernel's lock table "
                          "names no holder that this user can see",
                          fix=f"find the process with `fuser {lock_paths(install_root, name)[0]}` on the "
                              "host (as root) and end it")
    if holder is not None and holder.remote_pid is not None and holder.remote_pid not in pids:
        # the info file is not the lock: say so, and end the real holder
        holder = Holder(remote_pid=None, info={**holder.info, "note": (
            f"the info file named pid {holder.remote_pid}, which does not hold the lock")})
    for pid in pids:
        # our own holder is `flock ... sh -c ...`: its child shell goes with it; any other
        # holder is signalled alone, by pid
        remote.run(f"case \"$(tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null)\" in "
                   f"'flock '*{shlex.quote(name)}*) pkill -TERM -P {pid} ;; esac; "
                   f"kill -TERM {pid}", timeout=30)
    for _ in range(50):
        if not is_locked(remote, install_root, name):
            remote.run(f"rm -f {shlex.quote(lock_paths(install_root, name)[1])}", timeout=30)
            return holder
        time.sleep(0.1)
    raise RemoteError(f"the lock holder (pid {', '.join(map(str, pids))}) on host "
                      f"'{remote.name}' did not exit")
