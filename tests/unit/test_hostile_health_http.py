"""The health checks' HTTP reads (RemoteHost.http, through an SSH tunnel) are bounded in size and
time (issue 19, Deliver 6): an endless chunked body or an endless trickle fails the check instead
of eating memory or holding apply. Here http.client reads from a local socket pair."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from orchestrator.remote.connection import read_bounded


def _serve(head: bytes, chunk: bytes, pause: float) -> tuple[http.client.HTTPResponse, threading.Event]:
    a, b = socket.socketpair()
    stop = threading.Event()

    def feed() -> None:
        try:
            b.sendall(head)
            while not stop.is_set():
                b.sendall(chunk)
                if pause:
                    time.sleep(pause)
        except OSError:
            pass
        finally:
            b.close()

    threading.Thread(target=feed, daemon=True).start()
    a.settimeout(5)
    resp = http.client.HTTPResponse(a, method="GET")
    resp.begin()
    return resp, stop


def test_endless_chunked_body_is_cut_at_the_limit() -> None:
    resp, stop = _serve(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFF\r\n",
                        b"x" * 65536, 0)
    try:
        with pytest.raises(http.client.HTTPException, match="larger than 1048576 bytes"):
            read_bounded(resp, time.monotonic() + 10, limit=1 << 20)
    finally:
        stop.set()


def test_endless_trickle_ends_at_the_deadline() -> None:
    resp, stop = _serve(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", b"x", 0.01)
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="deadline"):
            read_bounded(resp, time.monotonic() + 1.0)
    finally:
        stop.set()
    assert time.monotonic() - t0 < 2.0


def test_a_normal_answer_is_read_whole() -> None:
    resp, stop = _serve(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nready", b"", 0)
    stop.set()
    assert read_bounded(resp, time.monotonic() + 5) == b"ready"


def test_the_ssh_channel_adapter_gives_http_client_a_read1() -> None:
    """RemoteHost.http wraps the paramiko channel (recv/sendall, like a socket here) so that
    read_bounded can see each recv: a trickle still ends at the deadline."""
    from orchestrator.remote.connection import _ChannelHTTPConnection

    a, b = socket.socketpair()
    stop = threading.Event()

    def serve() -> None:
        try:
            b.recv(65536)
            b.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFF\r\n")
            while not stop.is_set():
                b.sendall(b"x")
                time.sleep(0.01)
        except OSError:
            pass
        finally:
            b.close()

    threading.Thread(target=serve, daemon=True).start()
    a.settimeout(5)
    conn = _ChannelHTTPConnection(a, 30000, 5)  # type: ignore[arg-type]
    conn.request("GET", "/health")
    resp = conn.getresponse()
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="deadline"):
            read_bounded(resp, time.monotonic() + 1.0)
    finally:
        stop.set()
        a.close()
    assert time.monotonic() - t0 < 2.0
