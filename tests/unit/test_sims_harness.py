"""The live tests' harness under a busy CI box: `Sims.router` and the router load loop.

`Sims.router` hands a test a router only once every start-up worker is listed healthy.

sglang-router 0.3.2 answers `/readiness` once one worker is healthy and registers the rest through
its job queue; a CI run on 2 cores had a router list one of its two workers right after start
(`test_router_api.py::test_list_remove_add_regular`). These tests drive `wait_workers` against a
stand-in `/workers` that fills in over time."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.promtool.support import Load, wait_workers

A, B = "http://127.0.0.1:1001", "http://127.0.0.1:1002"


class Listing:
    """What `/workers` answers on its n-th call (the last entry from then on)."""

    def __init__(self, answers: list[list[tuple[str, bool]]], key: str | None = None) -> None:
        self.answers, self.key, self.calls = answers, key, 0


@pytest.fixture
def server() -> Iterator[tuple[str, Listing]]:
    listing = Listing([[]])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if listing.key and self.headers.get("Authorization") != f"Bearer {listing.key}":
                self.send_response(401)
                self.end_headers()
                return
            answer = listing.answers[min(listing.calls, len(listing.answers) - 1)]
            listing.calls += 1
            body = json.dumps({"workers": [{"url": u, "is_healthy": h} for u, h in answer]})
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", listing
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_waits_until_every_worker_is_listed_healthy(server: tuple[str, Listing]) -> None:
    url, listing = server
    listing.answers = [[(A, True)], [(A, True), (B, False)], [(A, True), (B, True)]]
    wait_workers(url, {A, B}, None, timeout=10)
    assert listing.calls == 3  # one worker, then one unhealthy, then both healthy


def test_names_the_workers_and_the_last_answer_when_they_never_come(
        server: tuple[str, Listing]) -> None:
    url, listing = server
    listing.answers = [[(A, True)]]
    with pytest.raises(RuntimeError, match=r"not all listed healthy.*1001"):
        wait_workers(url, {A, B}, None, timeout=0.5)


def test_sends_the_routers_api_key(server: tuple[str, Listing]) -> None:
    url, listing = server
    listing.key, listing.answers = "sk-test", [[(A, True)]]
    with pytest.raises(RuntimeError):
        wait_workers(url, {A}, None, timeout=0.5)
    wait_workers(url, {A}, "sk-test", timeout=5)


def test_the_load_loop_goes_on_after_a_stream_cut_off_mid_body() -> None:
    """A test that kills an engine mid-stream cuts a chunked response: the client sees an
    IncompleteRead, which is not an OSError. The loop counts it and keeps sending (a CI run's
    test_fleet_surface lost both clients this way and its TTFT alert never fired)."""
    served = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            served["n"] += 1
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            if served["n"] <= 2:  # each client's first stream: cut after its headers
                self.wfile.flush()
                return
            self.wfile.write(b"5\r\ndata:\r\n0\r\n\r\n")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    load = Load(f"http://127.0.0.1:{httpd.server_address[1]}")
    try:
        deadline = time.monotonic() + 10
        while load.ok < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(t.is_alive() for t in load.threads)
        assert load.failed >= 1 and load.ok >= 3, (load.failed, load.ok)
    finally:
        load.stop()
        httpd.shutdown()
        httpd.server_close()
