"""SSH connections to inventory hosts: the only place dsv4ctl opens a network connection to a host.

Owns connecting (key, user, port, optional jump host, connect timeout, retries with exponential
backoff), running commands, uploading bytes, long-lived remote processes (the host lock) and HTTP
requests to ports bound on the host's loopback, tunnelled through the SSH transport
(``direct-tcpip``), so health checks reach ``127.0.0.1:30000`` on the host without opening ports.

Every failure becomes :class:`RemoteError` with what failed and a fix. Authentication failures are
not retried (retrying cannot fix a wrong key), nor are a port that does not speak SSH or a connect
timeout (each already waited its timeout); a refused or reset connection is (sshd restarting).
:mod:`orchestrator.remote.diagnose` names the cause in one line.

Host keys (issue 19): unknown keys are refused by default. With the inventory's ``known_hosts`` set,
only keys listed there are accepted (the host is pinned); without it the controller's system
(``/etc/ssh/ssh_known_hosts``) and user (``~/.ssh/known_hosts``) files are read, as OpenSSH does. A
key that differs from a known one is always refused. A host never seen before is accepted only under
:func:`accept_new_host_keys` (``--accept-new-host-key``, OpenSSH's ``StrictHostKeyChecking
accept-new``): its key is logged and recorded in dsv4ctl's own known_hosts
(``~/.config/dsv4ctl/known_hosts``, always read besides the others; never a file an inventory or
profile names: issue 31), so the next connection is pinned to it. Unknown and changed keys fail without retry.

Past 400 lines on purpose: connecting, host-key policy, commands, uploads and the HTTP tunnel all
work on one paramiko transport and map its failures to one set of errors; what needs no
connection went to :mod:`.diagnose` (naming a failure) and :mod:`.hostfs` (install-root rules).
"""

from __future__ import annotations

import contextlib
import contextvars
import http.client
import io
import json
import logging
import os
import secrets
import select
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import paramiko
from fabric import Connection

from orchestrator.errors import RemoteError
from orchestrator.exposure import classify_listen
from orchestrator.facts import ConnectionFact
from orchestrator.profile.inventory import Host
from orchestrator.remote.diagnose import classify
from orchestrator.remote.probes import CommandResult

RETRIES = 3  # connect attempts after the first
BACKOFF_S = 1.0  # first wait; doubles each retry (1, 2, 4 s)

# The controller's own known_hosts files, read when a host has no ``known_hosts:`` of its own
# (module attributes so tests can point them at files they create).
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
# dsv4ctl's own known_hosts: the only file --accept-new-host-key writes (issue 31: it appended to
# whatever file an inventory or profile's `known_hosts:` named). Always read besides the others.
OWN_KNOWN_HOSTS = "${XDG_CONFIG_HOME:-~/.config}/dsv4ctl/known_hosts"


def own_known_hosts() -> str:
    """dsv4ctl's own known_hosts file on the controller (see :data:`OWN_KNOWN_HOSTS`)."""
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    if OWN_KNOWN_HOSTS.startswith("${XDG_CONFIG_HOME"):
        return os.path.expanduser(f"{base}/dsv4ctl/known_hosts")
    return os.path.expanduser(OWN_KNOWN_HOSTS)

log = logging.getLogger("dsv4ctl.ssh")

_ACCEPT_NEW: contextvars.ContextVar[bool] = contextvars.ContextVar("accept_new_host_keys",
                                                                   default=False)


@contextlib.contextmanager
def accept_new_host_keys(enabled: bool = True) -> Iterator[None]:
    """Within this block, a host never seen before is accepted once and its key recorded (the CLI's
    ``--accept-new-host-key``). A changed key is refused all the same."""
    token = _ACCEPT_NEW.set(enabled)
    try:
        yield
    finally:
        _ACCEPT_NEW.reset(token)


def _load_known_hosts(conn: Connection, path: str, name: str, *, system: bool) -> None:
    """Read one known_hosts file into the connection's host keys; a file paramiko cannot parse
    (a ``@revoked`` or ``@cert-authority`` line, a damaged key) is a clear error, not a traceback
    (issue 31). paramiko has no revocation: a file with a revoked line is refused outright, since
    ignoring the line would accept the very key it revokes."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            marked = [n for n, ln in enumerate(fh, 1) if ln.lstrip().startswith("@")]
    except OSError as exc:
        raise RemoteError(f"cannot read known_hosts {path} for host '{name}': {exc}",
                          fix="fix the path or the file's permissions (ssh-keyscan can fill it), "
                              "or pass --accept-new-host-key to record the key the host offers "
                              "in dsv4ctl's own known_hosts") from exc
    if marked:
        raise RemoteError(f"known_hosts {path} line {marked[0]} has a marker (@revoked or "
                          "@cert-authority) that dsv4ctl's SSH library cannot honour",
                          fix="give dsv4ctl a known_hosts file of plain host-key lines for this "
                              "host (the inventory's known_hosts:), without the revoked key")
    try:
        if system:
            conn.client.load_system_host_keys(path)
        else:
            conn.client.load_host_keys(path)
    except (OSError, paramiko.SSHException, ValueError, IndexError) as exc:
        raise RemoteError(f"cannot read known_hosts {path} for host '{name}': {exc}",
                          fix="fix the file (each line: HOST KEYTYPE BASE64)") from exc


class _UnknownHostKey(paramiko.SSHException):
    """A host key in no known_hosts file that was read (never retried)."""


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """paramiko's RejectPolicy raises a bare SSHException, which we retry as transient; this one
    raises a type of its own so an unknown key fails at once with a clear message."""

    def __init__(self, searched: list[str]) -> None:
        self.searched = searched

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(f"{hostname} offers a {key.get_name()} key with fingerprint "
                              f"{key.fingerprint} that is not in known_hosts "
                              f"(searched: {', '.join(self.searched) or 'nothing'})")


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's ``accept-new``: a host with no key in any file read is accepted, its key logged and
    appended to ``record_to`` (created 0600), so later connections are pinned to it. paramiko calls
    this only when the host has no known key at all; a different key raises BadHostKeyException."""

    def __init__(self, record_to: str) -> None:
        self.record_to = record_to

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        path = self.record_to
        try:
            parent = os.path.dirname(path)
            if parent and not os.path.isdir(parent):
                os.makedirs(parent, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:
            raise _UnknownHostKey(f"cannot record the new host key of {hostname} in {path}: "
                                  f"{exc}") from exc
        log.warning("accepted the new host key of %s (%s %s) and recorded it in %s "
                    "(--accept-new-host-key)", hostname, key.get_name(), key.fingerprint, path)


# Bounded SSH (issue 31): every command's output is read up to a cap, and past it the command is
# ended and the read fails with a clear error (a 300 MB remote file cost 660 MiB of controller
# memory). HTTP has its own cap (HTTP_MAX_BODY); a batch of probes caps each of its commands
# (remote.probes.BATCH_MAX_OUTPUT) well below this.
MAX_STDOUT = 64 << 20
MAX_STDERR = 1 << 20


def die_with_channel(command: str) -> str:
    """``command`` run so that it ends when its SSH channel closes (issue 31: a remote command kept
    writing 66 GB after dsv4ctl was killed; sshd signals nothing without a terminal).

    The command runs in a session and process group of its own (``setsid``), its stdin
    /dev/null; a watcher in a second group reads the channel's stdin, which stays open until
    dsv4ctl closes the channel or its connection drops, and then ends the command's whole group.
    The wrapper exits with the command's status and ends the watcher.

    The wrapper itself runs in the login shell, as sshd starts it, so the command gets the
    environment the user's shell start-up exports (PATH); the command then runs in ``/bin/sh``
    (dsv4ctl's commands are POSIX sh). Not ``$SHELL`` again: bash run under sshd reads
    ``~/.bashrc`` a second time, and a host's ``pyenv init`` or ``conda`` hook there cost every
    command ~0.1 s, a no-change apply a third of its time (issue 30)."""
    import shlex

    # POSIX gives an asynchronous list /dev/null as stdin unless it is redirected explicitly:
    # the watcher gets the channel's stdin through fd 3
    return (f"dsv4_cmd={shlex.quote(command)}; exec 3<&0; "
            'setsid /bin/sh -c "$dsv4_cmd" </dev/null 3<&- & dsv4_c=$!; '
            "setsid sh -c 'cat >/dev/null; kill -TERM -\"$1\" 2>/dev/null' sh \"$dsv4_c\" "
            "<&3 >/dev/null 2>&1 3<&- & dsv4_w=$!; exec 3<&-; "
            'wait "$dsv4_c"; dsv4_rc=$?; kill -TERM -"$dsv4_w" 2>/dev/null; exit "$dsv4_rc"')


_TRANSIENT = (socket.timeout, TimeoutError, ConnectionError, EOFError, OSError,
              paramiko.ssh_exception.NoValidConnectionsError, paramiko.SSHException)


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


HTTP_MAX_BODY = 16 << 20  # health, /server_info, /metrics answers are KBs to a few MB


def read_bounded(resp: http.client.HTTPResponse, deadline: float,
                 limit: int = HTTP_MAX_BODY) -> bytes:
    """The body, but at most ``limit`` bytes and no later than ``deadline`` (time.monotonic):
    a stuck or hostile endpoint (an endless chunked body, one byte a second) fails the check
    instead of holding apply (issue 19). http.client itself bounds the header lines and count."""
    parts: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no complete answer before the deadline ({size} bytes read)")
        data = resp.read1(1 << 16)
        if not data:
            return b"".join(parts)
        size += len(data)
        if size > limit:
            raise http.client.HTTPException(f"answer larger than {limit} bytes")
        parts.append(data)


class _ChannelRaw(io.RawIOBase):
    """A channel as a raw stream, so http.client reads it through an io.BufferedReader, whose
    read1 returns what one recv gives (paramiko's own ChannelFile has no read1, and read(n) waits
    for n bytes: a trickling server would outlive any deadline)."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self._channel.recv(len(buf))
        buf[:len(data)] = data
        return len(data)


class _ChannelSocket:
    """What http.client needs of a socket (sendall, makefile, close), over an SSH channel."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def sendall(self, data: bytes) -> None:
        self._channel.sendall(data)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_ChannelRaw(self._channel))

    def close(self) -> None:  # the channel is closed by RemoteHost.http
        pass


class _ChannelHTTPConnection(http.client.HTTPConnection):
    """http.client over an already-open SSH ``direct-tcpip`` channel."""

    def __init__(self, channel: paramiko.Channel, port: int, timeout: float) -> None:
        super().__init__("127.0.0.1", port, timeout=timeout)
        self._channel = channel

    def connect(self) -> None:  # the socket is the channel
        self.sock = _ChannelSocket(self._channel)


class RemoteHost:
    """One SSH connection to one host. Use as a context manager, or call :meth:`close`."""

    def __init__(self, name: str, host: Host, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.name = name
        self.host = host
        self._sleep = sleep
        self._conn: Connection | None = None
        self._sftp_client: paramiko.SFTPClient | None = None
        self.identity: ConnectionFact | None = None  # set on connect

    # ---------------------------------------------------------------- connect / close ---
    def _kwargs(self, key: str | None) -> dict[str, Any]:
        kw: dict[str, Any] = {"banner_timeout": self.host.connect_timeout_s,
                              "auth_timeout": self.host.connect_timeout_s}
        if key:
            kw.update(key_filename=key, look_for_keys=False, allow_agent=False)
        return kw

    def _pin_host_keys(self, conn: Connection) -> Connection:
        """Replace fabric's default (``AutoAddPolicy``: any key accepted) with known_hosts checking."""
        accept_new = _ACCEPT_NEW.get()
        pinned = self.host.known_hosts
        own = own_known_hosts()
        if pinned is not None:
            # the host's own file (and dsv4ctl's, where --accept-new-host-key records): the
            # inventory pins the host
            if os.path.lexists(pinned) or not (accept_new or os.path.isfile(own)):
                _load_known_hosts(conn, pinned, self.name, system=False)
            searched = [pinned]
        else:
            searched = []
            for path in (SYSTEM_KNOWN_HOSTS, os.path.expanduser(USER_KNOWN_HOSTS)):
                if os.path.isfile(path):
                    _load_known_hosts(conn, path, self.name, system=True)
                    searched.append(path)
        if os.path.isfile(own) and own not in searched:
            _load_known_hosts(conn, own, self.name, system=True)
            searched.append(own)
        record_to = own
        conn.client.set_missing_host_key_policy(
            _AcceptNew(record_to) if accept_new else _RejectUnknown(searched))
        return conn

    def _make(self) -> Connection:
        h = self.host
        gateway = None
        if h.jump is not None:
            gateway = self._pin_host_keys(Connection(
                h.jump.address, user=h.jump.user, port=h.jump.port,
                connect_timeout=h.connect_timeout_s, connect_kwargs=self._kwargs(h.key)))
        return self._pin_host_keys(Connection(
            h.address, user=h.user, port=h.port, gateway=gateway,
            connect_timeout=h.connect_timeout_s, connect_kwargs=self._kwargs(h.key)))

    def _check_key_file(self) -> None:
        """OpenSSH refuses a private key others can read ("UNPROTECTED PRIVATE KEY FILE",
        ssh(1) sshkey_perm_ok); so does dsv4ctl (issue 31: a 0644 key was used)."""
        key = self.host.key
        if key is None:
            return
        try:
            st = os.stat(key)
        except OSError as exc:
            raise RemoteError(f"cannot read the private key {key} for host '{self.name}': {exc}",
                              fix="fix the inventory's key: path") from exc
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            raise RemoteError(
                f"the private key {key} for host '{self.name}' is readable by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); OpenSSH refuses such a key and so does "
                "dsv4ctl", fix=f"chmod 600 {key}")

    def connect(self) -> RemoteHost:
        self._check_key_file()
        where = f"{self.host.user}@{self.host.address}:{self.host.port}"
        if self.host.jump is not None:
            where += f" via {self.host.jump.user}@{self.host.jump.address}:{self.host.jump.port}"
        failure = None
        for attempt in range(RETRIES + 1):
            conn = self._make()
            try:
                conn.open()
                self._conn = conn
                self._identify()
                return self
            except paramiko.BadHostKeyException as exc:
                conn.close()
                raise RemoteError(
                    f"host key of '{self.name}' ({where}) CHANGED: it is not the one in "
                    f"{self.host.known_hosts or 'known_hosts'}: {exc}",
                    fix="verify the host's key out of band, then update the known_hosts file; "
                        "a changed key can mean the host was replaced or the connection "
                        "intercepted (--accept-new-host-key never accepts a changed key)",
                ) from exc
            except _UnknownHostKey as exc:
                conn.close()
                raise RemoteError(
                    f"host key of '{self.name}' ({where}) is unknown: {exc}",
                    fix="verify the host's key out of band, then add it to the inventory's "
                        "known_hosts file (ssh-keyscan can fetch it), or accept it once with "
                        "--accept-new-host-key, which records it",
                ) from exc
            except paramiko.AuthenticationException as exc:
                conn.close()
                raise RemoteError(
                    f"SSH authentication to host '{self.name}' ({where}) failed: {exc}",
                    fix="check the inventory's user and key for this host "
                        "(the key's public half must be in the host's authorized_keys)",
                ) from exc
            except _TRANSIENT as exc:
                t = conn.client.get_transport()
                no_banner = t is not None and not t.remote_version  # TCP up, no SSH spoken
                conn.close()
                failure = classify(exc, address=self.host.address, port=self.host.port,
                                   timeout_s=self.host.connect_timeout_s,
                                   direct=self.host.jump is None, no_banner=no_banner)
                if not failure.retry:
                    raise RemoteError(f"cannot connect to host '{self.name}' ({where}): "
                                      f"{failure.cause}", fix=failure.fix) from None
                if attempt < RETRIES:
                    self._sleep(BACKOFF_S * (2 ** attempt))
        raise RemoteError(
            f"cannot connect to host '{self.name}' ({where}) after {RETRIES + 1} attempts: "
            f"{failure.cause if failure else 'no attempt made'}",
            fix=failure.fix if failure else None)

    def _identify(self) -> None:
        """Record which machine this is: the host key it proved it holds, and the address the
        TCP connection reached (a saved plan is bound to both; issue 31)."""
        import base64
        import hashlib

        t = self.transport
        key = t.get_remote_server_key()
        digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
        peer = None
        with contextlib.suppress(Exception):  # a jump host's channel has no peer address
            peer = str(t.getpeername()[0])
        self.identity = ConnectionFact(host_key=f"{key.get_name()} SHA256:{digest}", peer=peer)

    def close(self) -> None:
        if self._sftp_client is not None:
            with contextlib.suppress(Exception):
                self._sftp_client.close()
            self._sftp_client = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> RemoteHost:
        if self._conn is None:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connection(self) -> Connection:
        if self._conn is None:
            raise RemoteError(f"not connected to host '{self.name}'")
        return self._conn

    @property
    def transport(self) -> paramiko.Transport:
        t = self.connection.client.get_transport()
        if t is None or not t.is_active():
            raise RemoteError(f"the SSH connection to host '{self.name}' was lost",
                              fix="check the network to the host and retry")
        return t

    @property
    def alive(self) -> bool:
        try:
            return self.transport.is_active()
        except RemoteError:
            return False

    # --------------------------------------------------------------------------- commands ---
    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        """Run ``command`` with the login user's shell; never raises on a non-zero exit.

        A raw channel per command rather than fabric's ``Connection.run``: the latter's runner
        threads cost ~0.1-0.3 s per command on a small controller, and apply runs hundreds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            chan = self.transport.open_session()
            # stdin stays open: the wrapper's watcher ends the command when the channel closes
            # (the command itself reads /dev/null: it gets EOF, never hangs)
            chan.exec_command(die_with_channel(command))
            out, err = bytearray(), bytearray()
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(1 << 16)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                    got = True
                if len(out) > MAX_STDOUT or len(err) > MAX_STDERR:
                    chan.close()  # the watcher ends the command on the host
                    which, cap = ("output", MAX_STDOUT) if len(out) > MAX_STDOUT else \
                        ("error output", MAX_STDERR)
                    raise RemoteError(
                        f"the {which} of a command on host '{self.name}' passed "
                        f"{cap >> 20} MiB; dsv4ctl stopped reading and ended the command: "
                        f"{command[:120]!r}",
                        fix="something on the host answers far more than dsv4ctl asked for "
                            "(a file replaced by a huge one, a device): find it and fix it")
                # wait for EOF, not the exit status: sshd may send the status while output is
                # still queued behind the channel window
                if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not got:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    chan.close()
                    raise RemoteError(f"command timed out after {timeout}s on host "
                                      f"'{self.name}': {command[:200]}")
                if not got:
                    select.select([chan], [], [], 0.02)
            rc = chan.recv_exit_status()
            chan.close()
        except (EOFError, OSError, paramiko.SSHException) as exc:
            raise RemoteError(f"lost the SSH connection to host '{self.name}' while running "
                              f"{command[:120]!r}: {exc}",
                              fix="check the network to the host and retry") from exc
        return CommandResult(command=command, rc=rc, stdout=out.decode("utf-8", "replace"),
                             stderr=err.decode("utf-8", "replace"))

    def check(self, command: str, *, timeout: float | None = None, what: str = "") -> str:
        """Run ``command``; raise :class:`RemoteError` naming ``what`` unless it exits 0."""
        return checked(self.run(command, timeout=timeout), self.name, what)

    def _sftp(self) -> paramiko.SFTPClient:
        if self._sftp_client is None or self._sftp_client.sock.closed:
            self._sftp_client = self.connection.client.open_sftp()
        return self._sftp_client

    def _open_new(self, path: str, mode: int) -> paramiko.SFTPFile:
        """Create ``path`` with ``O_CREAT|O_EXCL`` and permissions ``mode`` from the first byte.

        paramiko's ``SFTPClient.open`` sends no attributes (the file is born 0666 & umask and only
        chmod'ed later) and has no way to ask for them; this is its own CMD_OPEN request with the
        permissions set. O_EXCL fails on any existing name, a dangling symbolic link included, so
        the write can never land in a link's target."""
        sftp = self._sftp()
        attrs = paramiko.SFTPAttributes()
        attrs.st_mode = mode
        flags = (paramiko.sftp.SFTP_FLAG_WRITE | paramiko.sftp.SFTP_FLAG_CREATE
                 | paramiko.sftp.SFTP_FLAG_EXCL)
        t, msg = sftp._request(paramiko.sftp.CMD_OPEN, path, flags, attrs)
        if t != paramiko.sftp.CMD_HANDLE:
            raise paramiko.SFTPError("Expected handle")
        return paramiko.SFTPFile(sftp, msg.get_binary(), "wb")

    def _refuse_link(self, remote_path: str) -> None:
        try:
            st = self._sftp().lstat(remote_path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode or 0):
            raise RemoteError(
                f"dsv4ctl refuses {remote_path} on host '{self.name}': it is a symbolic link "
                "(dsv4ctl never writes through one)",
                fix="remove the link if you did not make it, and find out who did")

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644,
                  chunk: int = 1 << 16, on_progress: Callable[[int, int], None] | None = None
                  ) -> None:
        """Write ``data`` to ``remote_path`` over SFTP (no shell, so no quoting issues), atomically
        and without following symbolic links: a fresh temp file beside it, created exclusively with
        its final ``mode`` (no window where it is readable by others), then renamed over it (SFTP
        posix-rename, rename(2), which replaces a name and never follows one). A symbolic link at
        ``remote_path`` is refused. The directory must be one dsv4ctl checked
        (:mod:`orchestrator.remote.hostfs`): only its owner could swap names in it."""
        head, _, name = remote_path.rpartition("/")
        tmp_path = f"{head}/.{name}.{secrets.token_hex(6)}.tmp"
        short: int | None = None
        try:
            self._refuse_link(remote_path)
            sftp = self._sftp()
            try:
                with self._open_new(tmp_path, mode) as fh:
                    fh.set_pipelined(True)
                    for off in range(0, len(data), chunk):
                        fh.write(data[off:off + chunk])
                        if on_progress is not None:
                            on_progress(min(off + chunk, len(data)), len(data))
                    fh.chmod(mode)  # fsetstat on the handle: the umask may have narrowed it
                # Pipelined writes can lose their error replies (a full disk then passes as a
                # short file): the temp file must hold every byte before it replaces anything
                # (issue 20 #3), or a record.json is renamed over by an empty one.
                size = sftp.stat(tmp_path).st_size
                if size != len(data):
                    short = size
                    raise OSError(f"only {size} of {len(data)} bytes arrived")
                sftp.posix_rename(tmp_path, remote_path)
            except BaseException:
                with contextlib.suppress(Exception):
                    sftp.remove(tmp_path)
                raise
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if short is not None:
                raise RemoteError(f"upload of {remote_path} to host '{self.name}' is short: "
                                  f"{short} of {len(data)} bytes arrived"
                                  f"{self._space_note(remote_path, len(data))}; nothing was "
                                  "replaced", fix="free disk space on the host, then re-run") \
                    from exc
            raise RemoteError(f"upload of {remote_path} to host '{self.name}' failed: {exc}"
                              f"{self._space_note(remote_path, len(data))}",
                              fix="check the network and free disk space on the host") from exc

    def _space_note(self, remote_path: str, need: int) -> str:
        """"; the disk is full (N KiB free ...)" when that explains a failed write, else ""."""
        import shlex

        parent = remote_path.rsplit("/", 1)[0] or "/"
        try:
            res = self.run(f"df -Pk {shlex.quote(parent)} | tail -n 1", timeout=15)
            free_kib = int(res.stdout.split()[3]) if res.ok else None
        except (RemoteError, ValueError, IndexError):
            return ""
        if free_kib is None or free_kib * 1024 >= need + (1 << 20):
            return ""
        return (f"; the disk is full: {free_kib} KiB free under {parent}, the file needs "
                f"{(need + 1023) // 1024} KiB")

    def replace_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644) -> None:
        """Atomically replace ``remote_path`` (what :meth:`put_bytes` does for every write)."""
        self.put_bytes(data, remote_path, mode=mode)

    def open_process(self, command: str) -> paramiko.Channel:
        """Start ``command`` on its own channel and return it; it lives until the channel closes
        (its stdin reaches EOF) or the SSH connection drops."""
        try:
            chan = self.transport.open_session()
            chan.exec_command(command)
            return chan
        except (EOFError, OSError, paramiko.SSHException) as exc:
            raise RemoteError(f"cannot start a process on host '{self.name}': {exc}") from exc

    # ------------------------------------------------------------------------------- HTTP ---
    def http(self, method: str, port: int, path: str, *, body: Any = None,
             timeout: float = 10.0, headers: dict[str, str] | None = None,
             address: str = "127.0.0.1") -> HttpResponse:
        """One HTTP request to ``address:port`` on the host (loopback unless a fleet engine
        listens on the host's service address), through the SSH transport.

        Raises :class:`ConnectionRefusedError` when nothing listens there (the caller decides
        whether that is "still starting" or "down"), :class:`RemoteError` when SSH itself fails."""
        try:
            chan = self.transport.open_channel("direct-tcpip", (address, port),
                                               ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as exc:
            # sshd answers "Connect failed" (OPEN_CONNECT_FAILED = 2) when the port is closed.
            if exc.code == 2:
                raise ConnectionRefusedError(f"{address}:{port} refused on {self.name}") from exc
            raise RemoteError(f"SSH refused a tunnel to port {port} on host '{self.name}': "
                              f"{exc.text}", fix="allow TCP forwarding in the host's sshd "
                              "(AllowTcpForwarding yes)") from exc
        except (EOFError, OSError, paramiko.SSHException) as exc:
            raise RemoteError(f"lost the SSH connection to host '{self.name}': {exc}") from exc
        chan.settimeout(timeout)
        conn = _ChannelHTTPConnection(chan, port, timeout)
        try:
            headers = {**(headers or {}), "Host": f"{address}:{port}", "Connection": "close"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return HttpResponse(status=resp.status,
                                body=read_bounded(resp, time.monotonic() + timeout))
        except TimeoutError as exc:
            raise TimeoutError(f"{method} {path} on port {port}: no answer in {timeout}s") from exc
        except (http.client.HTTPException, EOFError, OSError) as exc:
            raise ConnectionResetError(f"{method} {address}:{port}{path}: {exc}") from exc
        finally:
            conn.close()
            chan.close()


    @contextlib.contextmanager
    def forward(self, port: int) -> Iterator[int]:
        """Forward a local ephemeral port to ``127.0.0.1:port`` on the host (like ``ssh -L``) for
        code that needs a plain URL (the qualification run). Yields the local port."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.5)
        stop = threading.Event()

        def pump(a: Any, b: Any) -> None:
            try:
                while not stop.is_set():
                    r, _, _ = select.select([a, b], [], [], 0.5)
                    for src in r:
                        data = src.recv(65536)
                        if not data:
                            return
                        (b if src is a else a).sendall(data)
            except OSError:
                return
            finally:
                for s in (a, b):
                    with contextlib.suppress(Exception):
                        s.close()

        def accept() -> None:
            while not stop.is_set():
                try:
                    client, _ = server.accept()
                except (TimeoutError, OSError):
                    continue
                try:
                    chan = self.transport.open_channel("direct-tcpip", ("127.0.0.1", port),
                                                       client.getpeername())
                except Exception:
                    client.close()
                    continue
                threading.Thread(target=pump, args=(client, chan), daemon=True).start()

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        try:
            yield server.getsockname()[1]
        finally:
            stop.set()
            server.close()
            t.join(timeout=2)



def checked(res: CommandResult, host: str, what: str = "") -> str:
    """``res``'s stdout, or :class:`RemoteError` naming ``what`` and the host when it failed:
    how every ``check`` (a live shell's, or one answering from results run ahead) says it."""
    if not res.ok:
        detail = (res.stderr or res.stdout).strip()[-500:]
        raise RemoteError(f"{what or 'command'} failed on host '{host}' (exit {res.rc}): {detail}")
    return res.stdout


def listen_http(http: Callable[..., Any], dep: Any, headers: dict[str, str] | None = None, *,
                router_headers: dict[str, str] | None = None) -> Callable[..., Any]:
    """``http(method, port, path, ...)`` (:meth:`RemoteHost.http`) sent to the address each port
    of deployment ``dep`` listens on: loopback, or the host's service address for a fleet's
    engines that a router or PD peer on another host reaches (RoleDeployment.listen, issue 23) —
    the SSH tunnel must open to that address, 127.0.0.1 is refused there. ``router_headers``
    (default ``headers``) go to the router's port: a router with a key of its own wants that one."""
    where = {r.port: r.listen for r in dep.roles}
    router_port = None
    if dep.router is not None:
        router_port = dep.router.port
        # a router on every interface answers on loopback too; on one address only there
        if classify_listen(dep.router.host) != "all":
            where[dep.router.port] = dep.router.host

    def call(method: str, port: int, path: str, **kw: Any) -> Any:
        extra = router_headers if port == router_port and router_headers is not None else headers
        if extra:
            kw["headers"] = {**extra, **(kw.get("headers") or {})}
        return http(method, port, path, address=where.get(port, "127.0.0.1"), **kw)

    return call


def connect(name: str, host: Host, *, sleep: Callable[[float], None] = time.sleep) -> RemoteHost:
    """Open an SSH connection to inventory host ``name`` (retries with backoff)."""
    return RemoteHost(name, host, sleep=sleep).connect()
