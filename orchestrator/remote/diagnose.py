"""Why an SSH connection failed, in one line: refused, timed out, not SSH, unresolvable.

Owns the classification of connect failures that are not about keys (authentication and host keys
are classified where they are raised, in :mod:`orchestrator.remote.connection`) and the decision
which of them are worth a retry. paramiko reports a peer that accepts TCP but never speaks SSH as
"Error reading SSH protocol banner" after its banner timeout, or "No existing session" when its
negotiation deadline passes first, and one that answers something else the same way (or as
"Indecipherable protocol version"); :func:`peek_banner` looks at what the port
really says, once, so the message can name the cause instead of the symptom.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

import paramiko

PEEK_TIMEOUT_S = 2.0  # how long the diagnosis waits for a first byte (the banner wait already ran)


@dataclass(frozen=True)
class Failure:
    cause: str  # one line, what really happened
    retry: bool  # whether trying again can help (sshd restarting, a network blip)
    fix: str


def _is_banner_error(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, paramiko.SSHException) and (
        "protocol banner" in text or "Indecipherable protocol version" in text
        or "Invalid SSH banner" in text)


def _errnos(exc: BaseException) -> set[int]:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return {e.errno for e in exc.errors.values() if getattr(e, "errno", None) is not None}
    return {exc.errno} if isinstance(exc, OSError) and exc.errno is not None else set()


def peek_banner(address: str, port: int, timeout: float = PEEK_TIMEOUT_S) -> str | None:
    """The first line the port sends within ``timeout`` (shortened), '' if it sends nothing, None
    if it cannot be reached any more."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            try:
                data = s.recv(256)
            except TimeoutError:
                return ""
    except OSError:
        return None
    line = data.decode("utf-8", "replace").splitlines()[0] if data.strip() else ""
    line = "".join(ch if ch.isprintable() else "?" for ch in line.strip())
    return line[:60] + ("..." if len(line) > 60 else "")


def classify(exc: BaseException, *, address: str, port: int, timeout_s: float,
             direct: bool, no_banner: bool = False) -> Failure:
    """One-line cause of a connect failure. ``direct``: no jump host, so the port can be peeked;
    ``no_banner``: a TCP connection was made but no SSH banner arrived (paramiko then often reports
    a later symptom, "No existing session", once its negotiation deadline passed)."""
    if no_banner or _is_banner_error(exc):
        seen = peek_banner(address, port) if direct else None
        if seen:
            cause = f"port {port} answered '{seen}', which is not SSH"
        elif seen == "":
            cause = (f"port {port} accepted the connection but sent no SSH banner within "
                     f"{timeout_s:g}s (not an SSH server, or one that hangs)")
        else:
            cause = f"port {port} did not send an SSH banner within {timeout_s:g}s (not SSH)"
        return Failure(cause, retry=False,
                       fix="check the inventory's port for this host: something other than sshd "
                           "listens there (or sshd hangs; try `ssh -v` to the same address)")
    if isinstance(exc, socket.gaierror):
        return Failure(f"cannot resolve '{address}' ({exc.strerror})", retry=False,
                       fix="check the inventory's address for this host")
    codes = _errnos(exc)
    if isinstance(exc, ConnectionRefusedError) or (codes and codes <= {errno.ECONNREFUSED}):
        return Failure(f"connection refused on port {port} (nothing listens there)", retry=True,
                       fix="check that sshd runs on the host and the inventory's port is its port")
    if isinstance(exc, (TimeoutError, socket.timeout)) or errno.ETIMEDOUT in codes:
        return Failure(f"TCP connect timed out after {timeout_s:g}s", retry=False,
                       fix="check the address, that the network (or jump host) lets you through, "
                           "and connect_timeout_s in the inventory")
    if codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
        return Failure("host unreachable (no route)", retry=False,
                       fix="check the address and the route to the host")
    text = str(exc) or type(exc).__name__
    return Failure(f"{text}", retry=True,
                   fix="check the address and port in the inventory and that sshd runs on the host")
