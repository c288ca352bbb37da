"""A small asyncio HTTP/1.1 client for OpenAI-compatible endpoints (SGLang, sglang-router).

Owns the wire: one connection per request (``Connection: close``), JSON bodies, chunked or
length-delimited responses and server-sent events, with a per-read idle timeout. Stdlib only, so
the probes add no dependency and ``dsv4ctl plan`` never imports them (only ``dsv4ctl probe`` and
apply's qualification do). Connection and HTTP failures become
:class:`orchestrator.errors.RemoteError` with the URL, the cause and a fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from orchestrator.errors import RemoteError

MAX_BODY = 64 << 20  # refuse absurd responses instead of eating memory


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests. ``base_url`` is the server root (a trailing ``/v1`` is accepted)."""

    base_url: str
    api_key: str | None = None
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(
                f"--url {self.base_url!r} is not an http(s) URL",
                fix="give the server root, e.g. http://127.0.0.1:8000 (the router) or "
                "http://127.0.0.1:30000 (an engine)",
            )

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


class _Response:
    def __init__(self, url: str, status: int, headers: dict[str, str],
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: float) -> None:
        self.url = url
        self.status = status
        self.headers = headers
        self._reader = reader
        self._writer = writer
        self._timeout = timeout

    async def _read(self, coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, self._timeout)
        except TimeoutError:
            raise RemoteError(f"{self.url}: no data for {self._timeout:g} s",
                              fix="raise --timeout, or check that the server is not stuck"
                              ) from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise RemoteError(f"{self.url}: connection lost while reading ({exc})",
                              fix="check the server's log: it may have crashed") from None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (de-chunked)."""
        te = self.headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            while True:
                line = await self._read(self._reader.readline())
                if not line:
                    return
                try:
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                except ValueError:
                    raise RemoteError(f"{self.url}: malformed chunked encoding ({line[:40]!r})",
                                      fix="is this an HTTP server?") from None
                if size == 0:
                    await self._read(self._reader.readline())
                    return
                data = await self._read(self._reader.readexactly(size))
                await self._read(self._reader.readexactly(2))
                yield data
        elif "content-length" in self.headers:
            n = int(self.headers["content-length"])
            if n > MAX_BODY:
                raise RemoteError(f"{self.url}: response of {n} bytes is too large",
                                  fix="is --url the inference server?")
            if n:
                yield await self._read(self._reader.readexactly(n))
        else:
            while True:
                data = await self._read(self._reader.read(65536))
                if not data:
                    return
                yield data

    async def body(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        async for c in self.chunks():
            parts.append(c)
            size += len(c)
            if size > MAX_BODY:
                raise RemoteError(f"{self.url}: response larger than {MAX_BODY} bytes",
                                  fix="is --url the inference server?")
        return b"".join(parts)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


async def _open(ep: Endpoint, method: str, path: str, body: dict[str, Any] | None,
                accept: str) -> _Response:
    url = ep.root + path
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    ctx = ssl.create_default_context() if parts.scheme == "https" else None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx, limit=1 << 20), ep.timeout_s)
    except TimeoutError:
        raise RemoteError(f"cannot connect to {ep.root}: no answer within {ep.timeout_s:g} s",
                          fix="check --url and that the server is running") from None
    except OSError as exc:
        why = ("connection refused (nothing listens there)"
               if isinstance(exc, ConnectionRefusedError) else str(exc.strerror or exc))
        raise RemoteError(
            f"cannot connect to {ep.root}: {why}",
            fix="check --url (host and port) and that the router or engine is running, e.g. "
            f"`curl {ep.root}/v1/models`",
        ) from None
    payload = json.dumps(body).encode() if body is not None else b""
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    head = [f"{method} {target or '/'} HTTP/1.1", f"Host: {parts.netloc}",
            "Connection: close", f"Accept: {accept}", "User-Agent: dsv4ctl-probe"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    if ep.api_key:
        head.append(f"Authorization: Bearer {ep.api_key}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    resp = _Response(url, 0, {}, reader, writer, ep.timeout_s)
    try:
        await resp._read(writer.drain())
        status_line = await resp._read(reader.readline())
        if not status_line:
            raise RemoteError(f"{url}: the server closed the connection without answering",
                              fix="check the server's log")
        fields = status_line.decode("latin-1").split(" ", 2)
        if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
            raise RemoteError(f"{url}: not an HTTP response ({status_line[:60]!r})",
                              fix="is --url an HTTP server (not https, not another protocol)?")
        resp.status = int(fields[1])
        while True:
            line = await resp._read(reader.readline())
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            resp.headers[k.strip().lower()] = v.strip()
    except BaseException:
        await resp.close()
        raise
    return resp


async def request_json(ep: Endpoint, method: str, path: str,
                       body: dict[str, Any] | None = None) -> Any:
    """Send a request, return the decoded JSON body; non-2xx raises :class:`HTTPError`."""
    resp = await _open(ep, method, path, body, "application/json")
    try:
        raw = await resp.body()
    finally:
        await resp.close()
    text = raw.decode("utf-8", "replace")
    if not 200 <= resp.status < 300:
        raise HTTPError(resp.url, resp.status, text)
    try:
        return json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        raise RemoteError(f"{resp.url}: expected JSON, got {text[:120]!r}",
                          fix="is --url an OpenAI-compatible server?") from None


async def stream_events(ep: Endpoint, path: str, body: dict[str, Any]) -> AsyncIterator[Any]:
    """POST with ``stream: true`` and yield each server-sent event's decoded JSON until [DONE]."""
    resp = await _open(ep, "POST", path, {**body, "stream": True}, "text/event-stream")
    try:
        if not 200 <= resp.status < 300:
            raw = await resp.body()
            raise HTTPError(resp.url, resp.status, raw.decode("utf-8", "replace"))
        buf = b""
        async for chunk in resp.chunks():
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    yield json.loads(data)
                except json.JSONDecodeError:
                    raise RemoteError(f"{resp.url}: malformed event {data[:120]!r}",
                                      fix="is --url an OpenAI-compatible server?") from None
    finally:
        await resp.close()


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
