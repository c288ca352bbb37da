"""sglang-router 0.3.2's runtime worker API: list, remove, add back, and drain an engine.

Owns the requests dsv4ctl sends to the router to take one engine out of service and put it back
(a rolling apply's drain and return; issue 23). The transport is the caller's ``http(method,
port, path, body=..., timeout=...)`` — the same callable :mod:`orchestrator.health` uses, in
production :meth:`RemoteHost.http <orchestrator.remote.connection.RemoteHost.http>` (HTTP
tunnelled over the router host's SSH connection), in tests a plain socket to a local router.

Request shapes, from the router's source, sgl-project/sglang ``sgl-router/src/server.rs``
(commit 00eb5eb7: ``worker_routes`` = ``POST /workers`` → ``create_worker``, ``GET /workers`` →
``list_workers_rest``, ``GET``/``DELETE /workers/{url}`` → ``get_worker``/``delete_worker``) and
``sgl-router/src/protocols/worker_spec.rs`` (commit 098565a6: ``WorkerConfigRequest`` = ``url``
(required), ``api_key``, ``model_id``, ``priority``, ``cost``, ``worker_type`` ("regular" |
"prefill" | "decode"), ``bootstrap_port`` (prefill), ``labels``). The 0.3.2 binary (the crate
``smg``: ``smg::server::create_worker`` and ``smg::protocols::worker_spec::WorkerConfigRequest``
are its symbols) differs from that snapshot where noted, so every shape below was checked
against the binary of the pinned wheel (research/sglang.md §3; tests/integration/
test_router_api.py):

- ``GET /workers`` → 200 ``{"workers": [{"id", "url", "worker_type", "is_healthy", "load",
  "bootstrap_port"?, ...}], "total", "stats"}``. ``load`` is the router's own count of requests
  it has in flight to that worker.
- ``POST /workers`` with ``{"url", "worker_type", "bootstrap_port"?}`` → 202 ``{"status":
  "accepted", "worker_id", "url", "location", "message"}``: queued; the router then reads the
  worker's ``/server_info`` and ``/model_info`` and lists it once registered.
- ``DELETE /workers/{worker_id}`` → 202, queued. In 0.3.2 the path segment is the worker's
  UUID from the list (a URL there → 400), not the URL of the older snapshot.
- ``/add_worker`` and ``/remove_worker`` answer 404 in 0.3.2 despite older docs.

Draining: after a removal the router sends the worker nothing new, and the requests it had
already sent finish normally (seen: a 4 s request completed after its worker was removed in its
first second). The router forgets a removed worker's in-flight count at once (its
``smg_worker_requests_active`` gauge drops to 0 while the request still runs), so "drained" is
read from the engine itself: ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs`` (+ the PD
queues) on its ``/metrics`` (:func:`engine_inflight`), which dsv4ctl always enables.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from orchestrator.errors import RemoteError

Http = Callable[..., Any]  # http(method, port, path, body=..., timeout=...) -> .status, .json()
WORKER_TYPES = ("regular", "prefill", "decode")
# gauges whose sum is the number of requests an engine still holds (SGLang 0.5.23 names,
# srt/observability/metrics_collector.py; the PD queues exist on prefill/decode servers only)
INFLIGHT_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs",
                   "sglang:num_prefill_bootstrap_queue_reqs",
                   "sglang:num_prefill_inflight_queue_reqs",
                   "sglang:num_decode_prealloc_queue_reqs",
                   "sglang:num_decode_transfer_queue_reqs")


class RouterApiError(RemoteError):
    """The router refused or did not carry out a worker-API request."""


@dataclass(frozen=True)
class RouterWorker:
    id: str
    url: str
    worker_type: str
    is_healthy: bool
    load: int
    bootstrap_port: int | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RouterWorker:
        """One entry of ``GET /workers``; host data (issue 31): every field of its type and in
        range, else :class:`RouterApiError` (a hostile answer crashed ``status``)."""
        port, load = d.get("bootstrap_port"), d.get("load") or 0
        wid, url, kind = d.get("id", ""), d.get("url", ""), d.get("worker_type", "regular")
        if not (isinstance(wid, str) and len(wid) <= 256 and isinstance(url, str)
                and len(url) <= 2048 and isinstance(kind, str) and len(kind) <= 32
                and isinstance(load, int) and not isinstance(load, bool) and 0 <= load <= 1 << 32
                and (port is None or (isinstance(port, int) and 0 < port < 65536))):
            raise RouterApiError(f"the router's worker list has an entry that is not a worker: "
                                 f"{str(d)[:200]!r}", fix="is this sglang-router 0.3.2?")
        return cls(id=wid, url=_norm(url), worker_type=kind.lower(),
                   is_healthy=d.get("is_healthy") is True, load=load,
                   bootstrap_port=port if isinstance(port, int) else None)


@dataclass(frozen=True)
class DrainResult:
    drained: bool  # the engine held no request when the wait ended
    inflight: int | None  # what it held last (None: never read)
    waited_s: float


def _norm(url: str) -> str:
    return url.rstrip("/")


class RouterApi:
    """The worker API of one router, reached through ``http`` on ``port``."""

    def __init__(self, http: Http, port: int, *, name: str = "router", timeout_s: float = 10.0,
                 api_key: str | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``api_key``: the router's ``--api-key`` when it has one — 0.3.2 then refuses its
        worker API (401) and generation routes to a client without it (seen on the binary)."""
        self.http, self.port, self.name, self.timeout_s = http, port, name, timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.sleep, self.clock = sleep, clock

    # -- requests ----------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            extra = {"headers": self.headers} if self.headers else {}
            resp = self.http(method, self.port, path, body=body, timeout=self.timeout_s, **extra)
        except (OSError, TimeoutError) as exc:
            raise RouterApiError(f"{self.name} (port {self.port}): {method} {path} got no answer: "
                                 f"{exc}", fix="check that the router unit runs and listens on "
                                 "that port") from None
        from orchestrator.host_data import HostDataError, bounded_json

        try:  # bounded, finite JSON (issue 31); not JSON reads as no answer body
            data = bounded_json(resp.body, f"{self.name}'s answer to {method} {path}")
        except HostDataError:
            data = None
        return resp.status, data

    def workers(self) -> list[RouterWorker]:
        status, data = self._call("GET", "/workers")
        if status == 401:
            raise RouterApiError(f"{self.name}: GET /workers answered 401 (the router has an "
                                 "--api-key)", fix="pass the router's key (the deployment's "
                                 "DSV4_SECRET_API_KEY)")
        if status != 200 or not isinstance(data, dict) or not isinstance(data.get("workers"),
                                                                           list):
            raise RouterApiError(f"{self.name}: GET /workers answered {status} {data!r:.200}",
                                 fix="is this sglang-router 0.3.2? (its /workers lists workers)")
        return [RouterWorker.from_json(w) for w in data["workers"] if isinstance(w, dict)]

    def find(self, url: str) -> RouterWorker | None:
        url = _norm(url)
        return next((w for w in self.workers() if w.url == url), None)

    def remove(self, url: str, *, timeout_s: float = 30.0, poll_s: float = 0.2
               ) -> RouterWorker | None:
        """Take ``url`` out of the router and wait until it is no longer listed (the removal is
        queued by the router). Returns what the router had for it, None when it was not there."""
        worker = self.find(url)
        if worker is None:
            return None
        status, data = self._call("DELETE", f"/workers/{quote(worker.id, safe='')}")
        if status not in (200, 202):
            raise RouterApiError(f"{self.name}: removing worker {worker.url} (id {worker.id}) "
                                 f"answered {status} {data!r:.200}",
                                 fix="see the router's log; list its workers with GET /workers")
        self._until(lambda: self.find(url) is None, timeout_s, poll_s,
                    f"worker {worker.url} is still listed by {self.name}")
        return worker

    def add(self, url: str, *, worker_type: str = "regular", bootstrap_port: int | None = None,
            api_key: str | None = None, timeout_s: float = 60.0, poll_s: float = 0.2,
            healthy: bool = True) -> RouterWorker:
        """Put ``url`` (back) into the router and wait until it is listed (and healthy when
        ``healthy``). ``bootstrap_port``: a prefill's KV bootstrap port, required for prefill —
        without it PD transfers never start. ``api_key``: the engine's key, when it has one
        (sent in the body, never logged)."""
        if worker_type not in WORKER_TYPES:
            raise RouterApiError(f"worker_type {worker_type!r} is not one of {WORKER_TYPES}")
        if worker_type == "prefill" and bootstrap_port is None:
            raise RouterApiError(f"prefill worker {url} needs its bootstrap_port",
                                 fix="pass the prefill's --disaggregation-bootstrap-port")
        present = self.find(url)
        if present is None:
            body: dict[str, Any] = {"url": _norm(url), "worker_type": worker_type}
            if bootstrap_port is not None:
                body["bootstrap_port"] = bootstrap_port
            if api_key:
                body["api_key"] = api_key
            status, data = self._call("POST", "/workers", body)
            if status not in (200, 201, 202):
                raise RouterApiError(f"{self.name}: adding worker {_norm(url)} ({worker_type}) "
                                     f"answered {status} {_redact(data, api_key)!r:.200}",
                                     fix="check that the engine answers /server_info and "
                                     "/model_info from the router's host")

        def listed() -> bool:
            w = self.find(url)
            return w is not None and (w.is_healthy or not healthy)

        self._until(listed, timeout_s, poll_s,
                    f"worker {_norm(url)} is not listed{' healthy' if healthy else ''} by "
                    f"{self.name}")
        found = self.find(url)
        assert found is not None
        return found

    # -- waiting -----------------------------------------------------------------------------
    def _until(self, done: Callable[[], bool], timeout_s: float, poll_s: float, what: str) -> None:
        end = self.clock() + timeout_s
        while not done():
            if self.clock() >= end:
                raise RouterApiError(f"{what} after {timeout_s:g} s",
                                     fix="see the router's log (the worker API queues its jobs)")
            self.sleep(poll_s)


def _redact(data: Any, secret: str | None) -> Any:
    return str(data).replace(secret, "<redacted>") if secret else data


def engine_inflight(metrics_text: str) -> int:
    """Requests an engine still holds, from its Prometheus ``/metrics`` text: the sum of
    :data:`INFLIGHT_GAUGES` over every series (ranks, labels). Raises ValueError when none of them
    is there (metrics disabled, or not an SGLang server)."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in INFLIGHT_GAUGES:
            try:
                value = float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            if not 0 <= value <= 1 << 32:  # NaN, inf and negatives are not request counts
                continue
            total += value
            seen = True
    if not seen:
        raise ValueError("no sglang:num_running_reqs on /metrics (is --enable-metrics set?)")
    return round(total)


def wait_drained(read_inflight: Callable[[], int], *, timeout_s: float, poll_s: float = 0.25,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> DrainResult:
    """Poll ``read_inflight`` until it reads 0 or ``timeout_s`` passes. A read that fails
    (OSError, ValueError: the engine is gone or not answering) counts as not drained yet."""
    start = clock()
    last: int | None = None
    while True:
        with contextlib.suppress(OSError, ValueError, TimeoutError):
            last = read_inflight()
        if last == 0:
            return DrainResult(True, 0, clock() - start)
        if clock() - start >= timeout_s:
            return DrainResult(False, last, clock() - start)
        sleep(poll_s)
