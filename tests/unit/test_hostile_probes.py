"""Hostile HTTP servers against the probe client (issue 19, Deliver 6 and its acceptance).

A fake server on raw sockets sends each malformed answer the attack review found: a chunk size of
``FFFFFFFFFF`` followed by endless data, endless header lines, a header trickled one byte at a
time, an SSE stream without a newline, an endless valid SSE stream, ``Content-Length: -1``. The
client runs in a child process (so its memory is its own): each probe must end within its deadline
with a one-line RemoteError (no traceback), and its resident memory must stay bounded.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DEADLINE_S = 4.0
IDLE_S = 2.0
RSS_BOUND_MB = 80  # max_body is 16 MiB; the joined body and aiohttp's buffers stay well below this

# The child: run one probe against URL, print what happened as JSON. It limits its own address
# space so that a client without bounds fails fast instead of taking the machine's memory.
CHILD = r"""
import asyncio, json, resource, sys, time, traceback
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from orchestrator.errors import RemoteError
from orchestrator.probes import client

def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024

url, kind, idle, deadline = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
try:
    ep = client.Endpoint(url, timeout_s=idle, deadline_s=deadline, connect_s=idle)
except TypeError:  # the pre-issue-19 client had only an idle timeout: let it show what it does
    ep = client.Endpoint(url, timeout_s=idle)

async def probe():
    if kind == "json":
        return await client.request_json(ep, "POST", "/v1/chat/completions", {"model": "m"})
    n = 0
    async for _ in client.stream_events(ep, "/v1/chat/completions", {"model": "m"}):
        n += 1
    return n

base = rss_kb()
t0 = time.monotonic()
out = {}
try:
    out["result"] = repr(asyncio.run(probe()))[:200]
except RemoteError as exc:
    out["error"] = exc.message
except BaseException as exc:
    out["traceback"] = traceback.format_exc()[-2000:]
out["elapsed_s"] = time.monotonic() - t0
# VmHWM is this address space's peak; ru_maxrss is not: Linux carries the parent's peak across
# exec, so under a large pytest process it reported that process's size, not the probe's.
with open("/proc/self/status") as f:
    hwm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
out["rss_growth_mb"] = (hwm_kb - base) / 1024
print(json.dumps(out))
"""

Behaviour = Callable[[socket.socket, threading.Event], None]


class FakeServer:
    """Accepts connections on 127.0.0.1, reads the request head, then runs ``behaviour`` until
    the client goes away or the test ends."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            self.behaviour(conn, self.stop)
        except OSError:
            pass  # the client hung up: that is what a bounded client does
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


def _forever(conn: socket.socket, stop: threading.Event, data: bytes, pause: float = 0.0) -> None:
    while not stop.is_set():
        conn.sendall(data)
        if pause:
            time.sleep(pause)


def huge_chunk(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFF\r\n")
    _forever(conn, stop, b"x" * 65536)


def endless_headers(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    _forever(conn, stop, b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" * 1000)


def trickled_header(conn: socket.socket, stop: threading.Event) -> None:
    # a slow loris: a header value growing by one byte every 0.2 s, never finished
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    _forever(conn, stop, b"a", pause=0.2)


def negative_length(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: -1\r\n\r\n{}")
    stop.wait(10)


_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_no_newline(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(_SSE_HEAD + _chunk(b"data: {\"choices\": [\""))
    _forever(conn, stop, _chunk(b"a" * 65536))


def sse_endless(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(_SSE_HEAD)
    event = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
    _forever(conn, stop, _chunk(event * 20), pause=0.005)


CASES = {
    # name: (behaviour, "json" or "stream", a phrase the error must contain)
    "chunk_size_FFFFFFFFFF": (huge_chunk, "json", "larger than"),
    "endless_header_lines": (endless_headers, "json", "malformed HTTP answer"),
    "header_trickled_forever": (trickled_header, "json", "no complete status line and headers"),
    "content_length_minus_1": (negative_length, "json", "malformed HTTP answer"),
    "sse_without_newline": (sse_no_newline, "stream", "event line longer than"),
    "sse_endless_valid": (sse_endless, "stream", "deadline"),
    "chunk_size_FFFFFFFFFF_streamed": (huge_chunk, "stream", "event line longer than"),
}


@pytest.fixture
def server() -> Iterator[Callable[[Behaviour], FakeServer]]:
    made: list[FakeServer] = []

    def make(b: Behaviour) -> FakeServer:
        made.append(FakeServer(b))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_answer_ends_in_time_with_bounded_memory_and_a_clean_error(
        name: str, server: Callable[[Behaviour], FakeServer]) -> None:
    behaviour, kind, phrase = CASES[name]
    srv = server(behaviour)
    url = f"http://127.0.0.1:{srv.port}"
    res = subprocess.run([sys.executable, "-c", CHILD, url, kind, str(IDLE_S), str(DEADLINE_S)],
                         cwd=REPO, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "traceback" not in out, out["traceback"]
    assert "error" in out, f"the probe returned {out.get('result')!r} from a hostile server"
    assert phrase in out["error"], out["error"]
    assert "\n" not in out["error"] and "Traceback" not in out["error"]
    assert out["elapsed_s"] < DEADLINE_S + 1.0, out
    assert out["rss_growth_mb"] < RSS_BOUND_MB, out


def test_connect_refused_is_a_clean_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    res = subprocess.run([sys.executable, "-c", CHILD, f"http://127.0.0.1:{port}", "json", "2", "4"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "connection refused" in out.get("error", ""), out


def test_limits_must_be_positive() -> None:
    from orchestrator.errors import RemoteError
    from orchestrator.probes.client import Endpoint

    with pytest.raises(RemoteError, match="deadline_s=0"):
        Endpoint("http://127.0.0.1:1", deadline_s=0)
