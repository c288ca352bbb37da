"""The router worker-API client against the real sglang-router 0.3.2 binary (issue 23).

Proves `orchestrator.remote.router_api` speaks the API of the router dsv4ctl pins: list, remove and
add back a regular worker and a PD prefill (with its bootstrap port, which the simulators check:
a wrong port fails the PD handshake), and the drain — a request in flight when its worker is
removed still completes, and `wait_drained` reads the engine's own running count down to zero
(or reports the timeout). The router and the simulators run as local processes on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from orchestrator.remote.router_api import (
    RouterApi,
    RouterApiError,
    engine_inflight,
    wait_drained,
)
from tests.promtool.support import Sims

pytestmark = pytest.mark.integration


@dataclass
class Resp:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def local_http(method: str, port: int, path: str, *, body: Any = None,
               timeout: float = 10.0, headers: dict[str, str] | None = None) -> Resp:
    """What RemoteHost.http does through SSH, over a local socket."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={
            **(headers or {}), **({"Content-Type": "application/json"} if data else {})})
        resp = conn.getresponse()
        return Resp(resp.status, resp.read())
    finally:
        conn.close()


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def generate(router: str, text: str = "What is 6 * 7?") -> tuple[int, Any]:
    req = urllib.request.Request(router + "/generate", data=json.dumps(
        {"text": text, "sampling_params": {"max_new_tokens": 16}}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def inflight_of(engine: str) -> Any:
    return lambda: engine_inflight(local_http("GET", port_of(engine), "/metrics").body.decode())


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sims]:
    s = Sims(tmp_path_factory.mktemp("router-api"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def regular(sims: Sims) -> tuple[str, str, str]:
    """Two engines (the second answers after 2 s) behind one regular-mode router."""
    a = sims.engine()
    b = sims.engine(ttft_s=2.0)
    return a, b, sims.router(workers=(a, b))


def test_list_remove_add_regular(regular: tuple[str, str, str]) -> None:
    a, b, router = regular
    api = RouterApi(local_http, port_of(router))
    assert sorted((w.url, w.worker_type, w.is_healthy) for w in api.workers()) == sorted(
        [(a, "regular", True), (b, "regular", True)])
    removed = api.remove(b)
    assert removed is not None and removed.url == b
    assert [w.url for w in api.workers()] == [a]
    assert api.remove(b) is None  # not there any more: nothing to do
    for _ in range(4):  # every request now goes to a
        assert generate(router)[0] == 200
    back = api.add(b)
    assert back.url == b and back.is_healthy and back.worker_type == "regular"
    assert sorted(w.url for w in api.workers()) == sorted([a, b])
    assert api.add(b).id == back.id  # already there: not added twice


def test_drain_waits_for_the_request_in_flight(regular: tuple[str, str, str]) -> None:
    a, b, router = regular
    api = RouterApi(local_http, port_of(router))
    api.remove(a)  # only b (2 s per request) serves
    try:
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(generate(router)))
        t.start()
        wait_drained(lambda: 1 - inflight_of(b)(), timeout_s=5, poll_s=0.05)  # it arrived
        api.remove(b)
        drain = wait_drained(inflight_of(b), timeout_s=10, poll_s=0.1)
        t.join(timeout=10)
        assert drain.drained and drain.inflight == 0 and drain.waited_s > 0.5, drain
        assert result and result[0][0] == 200, result  # removal did not cut it off
    finally:
        api.add(a)
        api.add(b)


def test_drain_timeout_reports_what_is_left(regular: tuple[str, str, str]) -> None:
    a, b, router = regular
    api = RouterApi(local_http, port_of(router))
    api.remove(a)
    try:
        t = threading.Thread(target=lambda: generate(router))
        t.start()
        wait_drained(lambda: 1 - inflight_of(b)(), timeout_s=5, poll_s=0.05)
        drain = wait_drained(inflight_of(b), timeout_s=0.3, poll_s=0.05)
        assert not drain.drained and drain.inflight == 1, drain
        t.join(timeout=10)
    finally:
        api.add(a)


def test_pd_prefill_removed_and_added_back_with_its_bootstrap_port(sims: Sims) -> None:
    prefill = sims.engine(mode="prefill")
    decode = sims.engine(mode="decode")
    router = sims.router(prefill, decode)
    api = RouterApi(local_http, port_of(router))
    boot = sims.bootstrap[prefill]
    workers = {w.worker_type: w for w in api.workers()}
    assert workers["prefill"].url == prefill and workers["prefill"].bootstrap_port == boot
    assert generate(router)[0] == 200
    api.remove(prefill)
    assert generate(router)[0] >= 500  # no prefill: nothing can serve
    with pytest.raises(RouterApiError, match="bootstrap_port"):
        api.add(prefill, worker_type="prefill")
    # a wrong bootstrap port is accepted by the router but fails every PD request
    api.add(prefill, worker_type="prefill", bootstrap_port=boot + 1)
    status, body = generate(router)
    assert status >= 400, (status, body)
    api.remove(prefill)
    back = api.add(prefill, worker_type="prefill", bootstrap_port=boot)
    assert back.bootstrap_port == boot and back.is_healthy
    status, body = generate(router)
    assert status == 200 and body["text"] == "6 * 7 = 42.", body


def test_errors_name_the_router_and_the_fix(sims: Sims) -> None:
    api = RouterApi(local_http, port_of(sims.engine()), name="router on host1")
    with pytest.raises(RouterApiError, match="router on host1: GET /workers answered 404"):
        api.workers()  # an engine is not a router
    with pytest.raises(RouterApiError, match="worker_type 'mixed'"):
        api.add("http://127.0.0.1:1", worker_type="mixed")


def test_router_with_an_api_key_needs_it_for_its_worker_api(sims: Sims) -> None:
    engine = sims.engine()
    router = sims.router(workers=(engine,), extra=("--api-key", "sk-router-test"))
    with pytest.raises(RouterApiError, match="401"):
        RouterApi(local_http, port_of(router)).workers()
    api = RouterApi(local_http, port_of(router), api_key="sk-router-test")
    assert [w.url for w in api.workers()] == [engine]
    api.remove(engine)
    assert api.add(engine).is_healthy
