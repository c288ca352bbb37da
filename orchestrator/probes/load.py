"""Load probe: a real async client at a fixed concurrency for a fixed time, measured from streams.

Owns the closed-loop load generator and its report: ``concurrency`` workers each send streaming
chat completions back to back until ``duration_s`` has passed (requests in flight then finish).
From the streams it measures time to first token (request sent → first content or reasoning
chunk), inter-token latency (gaps between later chunks; SGLang streams about one token per
chunk), and end-to-end latency; output tokens come from the final ``usage`` chunk
(``stream_options.include_usage``), else from the number of token chunks. Throughput is total
output tokens / elapsed wall time (start → last request done).

``ignore_eos`` (an SGLang extension the OpenAI API lacks) makes every answer exactly
``max_tokens`` long, so runs compare across releases.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import DsvError, RemoteError
from orchestrator.probes import text
from orchestrator.probes.client import Endpoint, stream_events
from orchestrator.probes.stats import percentile


@dataclass
class Progress:
    elapsed_s: float
    duration_s: float
    requests: int
    output_tokens: int
    in_flight: int


@dataclass
class LoadReport:
    concurrency: int
    duration_s: float
    elapsed_s: float
    requests_ok: int
    requests_failed: int
    output_tokens: int
    prompt_tokens: int
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def requests_s(self) -> float:
        return self.requests_ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def figures(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {
            "concurrency": self.concurrency,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "output_tokens": self.output_tokens,
            "output_tok_s": round(self.output_tok_s, 2),
            "requests_s": round(self.requests_s, 3),
        }
        for name, xs in (("ttft_s", self.ttft_s), ("itl_s", self.itl_s), ("e2e_s", self.e2e_s)):
            for q in (50, 90, 99):
                v = percentile(xs, q)
                out[f"{name}_p{q}"] = round(v, 4) if v is not None else None
        return out

    def table(self) -> str:
        f = self.figures()

        def ms(v: float | int | None) -> str:
            return f"{v * 1000:9.1f}" if v is not None else f"{'-':>9}"

        lines = [
            f"concurrency {self.concurrency}, {self.elapsed_s:.1f} s, "
            f"{self.requests_ok} requests ok, {self.requests_failed} failed",
            f"output tokens/s   {self.output_tok_s:10.1f}",
            f"requests/s        {self.requests_s:10.2f}",
            f"{'latency (ms)':<16}{'p50':>9}{'p90':>9}{'p99':>9}",
        ]
        for label, key in (("TTFT", "ttft_s"), ("inter-token", "itl_s"), ("end-to-end", "e2e_s")):
            lines.append(f"{label:<16}" + "".join(ms(f[f"{key}_p{q}"]) for q in (50, 90, 99)))
        if self.errors:
            lines.append(f"first error: {self.errors[0]}")
        return "\n".join(lines)


def _delta_text(ev: Any) -> tuple[bool, int | None, int | None]:
    """(has a token, completion_tokens, prompt_tokens) of one chat stream event."""
    usage = ev.get("usage") if isinstance(ev, dict) else None
    ct = pt = None
    if isinstance(usage, dict):
        ct = usage.get("completion_tokens")
        pt = usage.get("prompt_tokens")
    has = False
    for ch in (ev.get("choices") or []) if isinstance(ev, dict) else []:
        delta = ch.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            has = True
    return has, ct, pt


async def run_load(ep: Endpoint, model: str, *, concurrency: int, duration_s: float,
                   max_tokens: int = 256, prompt_tokens: int = 512,
                   progress: Callable[[Progress], None] | None = None,
                   progress_interval_s: float = 0.5) -> LoadReport:
    if concurrency < 1 or duration_s <= 0 or max_tokens < 1 or prompt_tokens < 1:
        raise DsvError(
            f"load: concurrency={concurrency}, duration={duration_s}, max_tokens={max_tokens}, "
            f"prompt_tokens={prompt_tokens}: all must be positive",
            fix="e.g. --concurrency 16 --duration 30")
    prompt = ("Write a long story about the places in these notes. "
              + " ".join(text.filler(prompt_tokens, seed=7)))
    report = LoadReport(concurrency, duration_s, 0.0, 0, 0, 0, 0)
    start = time.monotonic()
    deadline = start + duration_s
    in_flight = 0
    live_tokens = 0  # token chunks seen so far, for the progress display
    fatal: list[BaseException] = []

    async def one(worker: int, n: int) -> None:
        nonlocal in_flight, live_tokens
        body = {
            "model": model,
            # A per-request prefix defeats the prefix cache, as distinct users would.
            "messages": [{"role": "user", "content": f"[{worker}.{n}] {prompt}"}],
            "max_tokens": max_tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.monotonic()
        first = last = None
        chunks = 0
        usage_ct = usage_pt = None
        in_flight += 1
        try:
            async for ev in stream_events(ep, "/v1/chat/completions", body):
                has, ct, pt = _delta_text(ev)
                if ct is not None:
                    usage_ct, usage_pt = int(ct), int(pt or 0)
                if not has:
                    continue
                now = time.monotonic()
                if first is None:
                    first = now
                    report.ttft_s.append(now - t0)
                elif last is not None:
                    report.itl_s.append(now - last)
                last = now
                chunks += 1
                live_tokens += 1
        except RemoteError as exc:
            report.requests_failed += 1
            if len(report.errors) < 5:
                report.errors.append(exc.message)
            if "cannot connect" in exc.message and report.requests_ok == 0:
                fatal.append(exc)
            return
        finally:
            in_flight -= 1
        report.requests_ok += 1
        report.e2e_s.append(time.monotonic() - t0)
        report.output_tokens += usage_ct if usage_ct is not None else chunks
        report.prompt_tokens += usage_pt or 0

    async def worker(w: int) -> None:
        n = 0
        while time.monotonic() < deadline and not fatal:
            await one(w, n)
            n += 1

    async def ticker() -> None:
        while True:
            await asyncio.sleep(progress_interval_s)
            if progress is not None:
                progress(Progress(time.monotonic() - start, duration_s,
                                  report.requests_ok, live_tokens, in_flight))

    tick = asyncio.create_task(ticker())
    try:
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    finally:
        tick.cancel()
    if fatal:
        raise fatal[0]
    report.elapsed_s = time.monotonic() - start
    if progress is not None:
        progress(Progress(report.elapsed_s, duration_s, report.requests_ok,
                          report.output_tokens, 0))
    return report
