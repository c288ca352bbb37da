"""Small stdlib HTTP plumbing shared by the engine simulator and the router double.

Owns the threaded HTTP/1.1 server, JSON and chunked server-sent-event responses, the
aggregate token bucket and the process-level fault timers (start delay, crash), so both
doubles behave the same way on the wire. Stdlib only: the doubles must run in a bare venv.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Server(ThreadingHTTPServer):
    """Threaded server; one thread per connection, daemon so the process can exit."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


class TokenBucket:
    """Aggregate rate cap: `acquire(n)` blocks so that tokens leave at `rate` per second.

    Reservation style (each caller books the next free slot under a lock, then sleeps until it)
    so the long-run aggregate rate is exact whatever the concurrency; `burst` tokens may go
    out at once after an idle period.
    """

    def __init__(self, rate: float, burst: float = 1.0) -> None:
        if rate <= 0:
            raise ValueError(f"token_rate must be > 0, got {rate}")
        self.rate = float(rate)
        self.burst = max(1.0, float(burst))
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self, n: int = 1) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(self._next, now - (self.burst - 1) / self.rate)
            self._next = start + n / self.rate
            wait = self._next - n / self.rate - now
        if wait > 0:
            time.sleep(wait)


class Handler(BaseHTTPRequestHandler):
    """Base handler: HTTP/1.1 keep-alive, JSON helpers, chunked SSE."""

    protocol_version = "HTTP/1.1"
    server_version = "dsv4-sim/1"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def read_json(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            self.send_json(400, {"error": {"message": f"invalid JSON body: {exc}"}})
            return None
        if not isinstance(data, dict):
            self.send_json(400, {"error": {"message": "JSON body must be an object"}})
            return None
        return data

    def send_bytes(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, code: int, obj: Any) -> None:
        self.send_bytes(code, json.dumps(obj).encode(), "application/json")

    def send_text(self, code: int, text: str, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_bytes(code, text.encode(), ctype)

    def start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def sse_event(self, obj: Any) -> None:
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        self.send_chunk(f"data: {payload}\n\n".encode())

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def start_crash_timer(after_s: float | None, code: int, what: str) -> None:
    """Exit the whole process with `code` after `after_s` seconds (the `crash_after_s` fault)."""
    if after_s is None:
        return

    def _crash() -> None:
        time.sleep(float(after_s))
        sys.stderr.write(f"{what}: simulated crash (crash_after_s={after_s}), exit {code}\n")
        sys.stderr.flush()
        os._exit(int(code))

    threading.Thread(target=_crash, daemon=True, name="crash-timer").start()


def serve_forever(server: Server) -> int:
    """Serve until SIGTERM/SIGINT; return the exit status (0 on a clean stop)."""
    import signal

    def _stop(signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    return 0
