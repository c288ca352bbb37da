"""The HTTP client of the probes, for OpenAI-compatible endpoints (SGLang, sglang-router).

Owns the wire through aiohttp (HTTP/1.1, chunked and length-delimited bodies, TLS) and the bounds a
probe holds to whatever the server does: a connect timeout, an idle-read timeout, an overall
deadline per request, at most ``max_headers`` header lines of at most ``max_line`` bytes (aiohttp's
parser enforces both), at most ``max_body`` bytes of body and ``max_event_line`` bytes per
server-sent-event line. The answer of a hostile or broken server (a chunk size of ``FFFFFFFFFF``,
endless header lines, ``Content-Length: -1``, an SSE stream without a newline or one that never
ends) becomes :class:`orchestrator.errors.RemoteError` with the URL, the cause and a fix, never a
traceback (issue 19: the hand-written client this replaces ate 1.5 GB in 5 s or never returned).

Only ``dsv4ctl probe`` and apply's qualification import this module, so ``dsv4ctl plan`` never
pays for aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

import aiohttp

from orchestrator.errors import RemoteError

MAX_BODY = 16 << 20  # a JSON answer of a chat completion or /model_info is a few KB
MAX_EVENT_LINE = 1 << 20  # one SSE ``data:`` line carries one token's delta
MAX_LINE = 8190  # status and header lines (aiohttp's default, as nginx's large_client_header_buffers)
MAX_HEADERS = 64


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests and how long to wait. ``base_url`` is the server root (a trailing
    ``/v1`` is accepted). ``timeout_s`` bounds each wait for data, ``deadline_s`` a whole request
    (a streamed one included), ``connect_s`` the TCP (and TLS) connect."""

    base_url: str
    api_key: str | None = None
    timeout_s: float = 300.0
    deadline_s: float = 3600.0
    connect_s: float = 30.0
    max_body: int = MAX_BODY
    max_event_line: int = MAX_EVENT_LINE

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(
                f"--url {self.base_url!r} is not an http(s) URL",
                fix="give the server root, e.g. http://127.0.0.1:8000 (the router) or "
                "http://127.0.0.1:30000 (an engine)",
            )
        for name in ("timeout_s", "deadline_s", "connect_s", "max_body", "max_event_line"):
            if not getattr(self, name) > 0:
                raise RemoteError(f"probe {name}={getattr(self, name)!r} must be positive",
                                  fix="e.g. --timeout 600 --deadline 3600")

    @property
    def root(self) -> str:
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


class HTTPError(RemoteError):
    """The server answered with a status other than 2xx."""

    def __init__(self, url: str, status: int, body: str) -> None:
        short = body.strip().replace("\n", " ")[:300]
        super().__init__(
            f"{url} answered HTTP {status}: {short or '(empty body)'}",
            fix="check the model name (--model) and the server's log; 503 means it is not ready",
        )
        self.status = status
        self.body = body


class _Request:
    """One request's clock and error mapping: every wait is bounded by the idle timeout and by what
    is left of the overall deadline, whichever is shorter."""

    def __init__(self, ep: Endpoint, url: str) -> None:
        self.ep = ep
        self.url = url
        self.end = time.monotonic() + ep.deadline_s

    async def wait(self, coro: Any, what: str = "no data") -> Any:
        left = self.end - time.monotonic()
        if left <= 0:
            if hasattr(coro, "close"):
                coro.close()
            self._deadline()
        idle = left >= self.ep.timeout_s
        try:
            return await asyncio.wait_for(coro, min(self.ep.timeout_s, left))
        except TimeoutError:
            if idle:
                raise RemoteError(f"{self.url}: {what} for {self.ep.timeout_s:g} s",
                                  fix="raise --timeout, or check that the server is not stuck"
                                  ) from None
            self._deadline()

    def _deadline(self) -> NoReturn:
        raise RemoteError(f"{self.url}: no complete answer within the deadline of "
                          f"{self.ep.deadline_s:g} s",
                          fix="raise --deadline, or check that the server is not stuck")

    def fail(self, exc: BaseException) -> NoReturn:
        """Map aiohttp's exceptions to a RemoteError (a clean one-line message)."""
        root = self.ep.root
        if isinstance(exc, aiohttp.ClientConnectorError):
            os_err = exc.os_error
            why = ("connection refused (nothing listens there)"
                   if isinstance(os_err, ConnectionRefusedError) else str(os_err.strerror or os_err))
            raise RemoteError(
                f"cannot connect to {root}: {why}",
                fix="check --url (host and port) and that the router or engine is running, e.g. "
                f"`curl {root}/v1/models`") from None
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            raise RemoteError(f"cannot connect to {root}: no answer within {self.ep.connect_s:g} s",
                              fix="check --url and that the server is running") from None
        if isinstance(exc, aiohttp.ServerTimeoutError):  # aiohttp's idle backstop
            raise RemoteError(f"{self.url}: no data for {self.ep.timeout_s:g} s",
                              fix="raise --timeout, or check that the server is not stuck") from None
        if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
            raise RemoteError(f"{self.url}: connection lost ({_short(exc)})",
                              fix="check the server's log: it may have crashed") from None
        # ClientResponseError (a bad status line or header, a header too long or too many),
        # ClientPayloadError (a broken chunk or length), InvalidURL, ...
        raise RemoteError(f"{self.url}: malformed HTTP answer ({_short(exc)})",
                          fix="is --url an HTTP server (not https, not another protocol), and an "
                          "OpenAI-compatible one?") from None


_NO_HEAD = "no complete status line and headers"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _session(ep: Endpoint) -> aiohttp.ClientSession:
    # aiohttp's own timeouts back ours up; _Request.wait is the one that reports.
    timeout = aiohttp.ClientTimeout(total=ep.deadline_s + 1, sock_connect=ep.connect_s,
                                    connect=ep.connect_s, sock_read=ep.timeout_s + 1)
    return aiohttp.ClientSession(
        timeout=timeout, max_line_size=MAX_LINE, max_field_size=MAX_LINE, max_headers=MAX_HEADERS,
        auto_decompress=False,  # a small gzip body must not inflate past max_body
        trust_env=False, headers={"User-Agent": "dsv4ctl-probe"},
        connector=aiohttp.TCPConnector(force_close=True, limit=0))


def _headers(ep: Endpoint, accept: str) -> dict[str, str]:
    h = {"Accept": accept, "Accept-Encoding": "identity"}
    if ep.api_key:
        h["Authorization"] = f"Bearer {ep.api_key}"
    return h


async def _read_body(req: _Request, resp: aiohttp.ClientResponse) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = await req.wait(resp.content.readany())
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > req.ep.max_body:
            raise RemoteError(f"{req.url}: response larger than {req.ep.max_body} bytes",
                              fix="is --url the inference server?")
        parts.append(chunk)


async def request_json(ep: Endpoint, method: str, path: str,
                       body: dict[str, Any] | None = None) -> Any:
    """Send a request, return the decoded JSON body; non-2xx raises :class:`HTTPError`."""
    url = ep.root + path
    req = _Request(ep, url)
    try:
        async with _session(ep) as session:
            resp = await req.wait(session.request(method, url, json=body,
                                                  headers=_headers(ep, "application/json")),
                                  _NO_HEAD)
            async with resp:
                raw = await _read_body(req, resp)
    except aiohttp.ClientError as exc:
        req.fail(exc)
    except TimeoutError:  # aiohttp's backstop fired before ours
        req._deadline()
    text = raw.decode("utf-8", "replace")
    if not 200 <= resp.status < 300:
        raise HTTPError(url, resp.status, text)
    try:
        return json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        raise RemoteError(f"{url}: expected JSON, got {text[:120]!r}",
                          fix="is --url an OpenAI-compatible server?") from None


async def _lines(req: _Request, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body's lines, each at most ``max_event_line`` bytes, under the request's deadline."""
    buf = b""
    limit = req.ep.max_event_line
    while True:
        chunk = await req.wait(resp.content.readany())
        if not chunk:
            if buf:
                yield buf
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line
        if len(buf) > limit:
            raise RemoteError(f"{req.url}: a server-sent event line longer than {limit} bytes",
                              fix="is --url an OpenAI-compatible server?")


async def stream_events(ep: Endpoint, path: str, body: dict[str, Any]) -> AsyncIterator[Any]:
    """POST with ``stream: true`` and yield each server-sent event's decoded JSON until [DONE].

    The whole stream is one request: it ends by the endpoint's deadline whatever the server does."""
    url = ep.root + path
    req = _Request(ep, url)
    try:
        async with _session(ep) as session:
            resp = await req.wait(session.post(url, json={**body, "stream": True},
                                               headers=_headers(ep, "text/event-stream")),
                                  _NO_HEAD)
            async with resp:
                if not 200 <= resp.status < 300:
                    raw = await _read_body(req, resp)
                    raise HTTPError(url, resp.status, raw.decode("utf-8", "replace"))
                async for line in _lines(req, resp):
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    try:
                        event = json.loads(data)
                    except json.JSONDecodeError:
                        raise RemoteError(f"{url}: malformed event {data[:120]!r}",
                                          fix="is --url an OpenAI-compatible server?") from None
                    yield event
    except aiohttp.ClientError as exc:
        req.fail(exc)
    except TimeoutError:
        req._deadline()


async def list_models(ep: Endpoint) -> list[str]:
    data = await request_json(ep, "GET", "/v1/models")
    try:
        return [str(m["id"]) for m in data["data"]]
    except (KeyError, TypeError):
        raise RemoteError(f"{ep.root}/v1/models: unexpected answer {str(data)[:120]}",
                          fix="is --url an OpenAI-compatible server?") from None


async def resolve_model(ep: Endpoint, model: str | None) -> str:
    """``model`` when given, else the only model the server lists."""
    if model:
        return model
    models = await list_models(ep)
    if len(models) != 1:
        raise RemoteError(
            f"{ep.root} serves {len(models)} models ({', '.join(models) or 'none'}); "
            "cannot pick one", fix="pass --model NAME")
    return models[0]
