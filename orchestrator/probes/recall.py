"""Needle-in-a-haystack recall probe: can the deployment find a fact at depth in a long context?

Owns the grid (context lengths × needle depths), the prompts, the scoring and the report. The
operator lost recall beyond ~2–4K tokens (``index_topk`` 512) and found it only by probing by
hand; this makes that probe one command and a qualification gate.

Protocol (plain language, any chat model can do it): a long document of filler sentences holds
one needle ``The secret code for <KEY> is <VALUE>.`` at the given depth (0 = start, 1 = end);
the same user message ends with ``What is the secret code for <KEY>?``. A cell is recalled when
VALUE appears in the answer's ``content``. Prompt sizes are calibrated with two requests against
the server's own ``usage.prompt_tokens`` (tokenizers differ), and each cell reports the server's
count, so "length" means tokens as the deployment counts them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import DsvError
from orchestrator.probes import text
from orchestrator.probes.client import Endpoint, HTTPError, request_json

HEADER = ("Below is a long document. Read all of it; a question about one fact in it follows "
          "at the end.\n\n")
DEFAULT_LENGTHS = (1000, 2000, 4000, 8000, 16000, 32000, 64000)
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Cell:
    length: int  # target length (tokens)
    depth: float
    prompt_tokens: int | None  # the server's count
    recalled: bool
    answer: str
    error: str | None = None


@dataclass
class RecallReport:
    lengths: list[int]
    depths: list[float]
    cells: list[Cell] = field(default_factory=list)

    def cell(self, length: int, depth: float) -> Cell:
        for c in self.cells:
            if c.length == length and c.depth == depth:
                return c
        raise KeyError((length, depth))

    def recall(self, length: int) -> float:
        row = [c for c in self.cells if c.length == length]
        return sum(c.recalled for c in row) / len(row) if row else 0.0

    @property
    def longest_full_recall(self) -> int | None:
        """The largest length L such that every cell at every length <= L was recalled."""
        best = None
        for length in sorted(self.lengths):
            if self.recall(length) < 1.0:
                break
            best = length
        return best

    def measured_tokens(self, length: int) -> int | None:
        counts = [c.prompt_tokens for c in self.cells if c.length == length and c.prompt_tokens]
        return max(counts) if counts else None

    def table(self) -> str:
        head = f"{'length':>8} {'tokens':>8} " + " ".join(
            f"{f'd={d:g}':>7}" for d in self.depths) + f" {'recall':>7}"
        lines = [head]
        for length in self.lengths:
            marks = []
            for d in self.depths:
                c = self.cell(length, d)
                marks.append(f"{'ok' if c.recalled else ('ERR' if c.error else 'miss'):>7}")
            tok = self.measured_tokens(length)
            lines.append(f"{length:>8} {tok if tok is not None else '-':>8} " + " ".join(marks)
                         + f" {self.recall(length) * 100:>6.0f}%")
        best = self.longest_full_recall
        lines.append(
            "longest length with full recall: "
            + (f"{best} tokens" if best is not None else "none (the shortest length failed)"))
        errors = [c for c in self.cells if c.error]
        if errors:
            lines.append(f"{len(errors)} cell(s) failed with an error, e.g. length "
                         f"{errors[0].length} depth {errors[0].depth:g}: {errors[0].error}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "lengths": self.lengths, "depths": self.depths,
            "longest_full_recall": self.longest_full_recall,
            "recall_by_length": {str(k): self.recall(k) for k in self.lengths},
            "cells": [c.__dict__ for c in self.cells],
        }


def needle(length: int, depth: float) -> tuple[str, str]:
    """(key, value) for one cell, deterministic and distinct per cell."""
    h = hashlib.sha256(f"{length}/{depth}".encode()).hexdigest().upper()
    key = f"the {text._ADJ[int(h[0:2], 16) % 16]} vault {int(h[2:6], 16) % 9000 + 1000}"
    value = "".join(ch for ch in h[6:] if ch.isalnum())[:4] + "-" + h[20:24]
    return key, value


def _prompt(sentences: Sequence[str], depth: float, key: str, value: str) -> str:
    at = round(depth * len(sentences))
    body = [*sentences[:at], f"The secret code for {key} is {value}.", *sentences[at:]]
    return (HEADER + " ".join(body)
            + f"\n\nWhat is the secret code for {key}? Reply with the code only.")


@dataclass(frozen=True)
class Calibration:
    per_est_token: float  # server tokens per estimated token
    overhead: float  # server tokens beyond the message text (chat template)

    def sentences_for(self, target: int, seed: int) -> list[str]:
        est = max(0.0, (target - self.overhead) / self.per_est_token)
        overhead_est = text.estimate_tokens(HEADER) + 40  # needle + question
        return text.filler(max(int(est) - overhead_est, 1), seed)


def _content(resp: Any) -> str:
    try:
        msg = resp["choices"][0]["message"]
        return str(msg.get("content") or "")
    except (KeyError, IndexError, TypeError):
        raise DsvError(f"unexpected chat completion shape: {str(resp)[:200]}",
                       fix="is --url an OpenAI-compatible chat server?") from None


def _usage_prompt(resp: Any) -> int | None:
    try:
        return int(resp["usage"]["prompt_tokens"])
    except (KeyError, TypeError, ValueError):
        return None


async def _chat(ep: Endpoint, model: str, prompt: str, max_tokens: int) -> Any:
    return await request_json(ep, "POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0.0,
    })


async def calibrate(ep: Endpoint, model: str) -> Calibration:
    """Two requests: a tiny prompt and ~2000 estimated tokens give slope and overhead."""
    small = "Reply with the single word: ok"
    big_sentences = text.filler(2000, seed=99)
    big = " ".join(big_sentences)
    r0 = await _chat(ep, model, small, 1)
    r1 = await _chat(ep, model, big, 1)
    t0, t1 = _usage_prompt(r0), _usage_prompt(r1)
    e0, e1 = text.estimate_tokens(small), text.estimate_tokens(big)
    if t0 is None or t1 is None or t1 <= t0:
        # No usage: fall back to the estimate itself (1:1) and say so in the figures.
        return Calibration(1.0, 0.0)
    slope = (t1 - t0) / (e1 - e0)
    return Calibration(slope, t0 - e0 * slope)


async def run_recall(ep: Endpoint, model: str, lengths: Sequence[int],
                     depths: Sequence[float], *, concurrency: int = 4, max_tokens: int = 64,
                     on_cell: Callable[[Cell], None] | None = None) -> RecallReport:
    if not lengths or not depths:
        raise DsvError("recall grid is empty", fix="give at least one length and one depth")
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad:
        raise DsvError(f"depths {bad} are outside 0..1", fix="use fractions like 0,0.5,1")
    if any(n < 100 for n in lengths):
        raise DsvError(f"lengths {list(lengths)} include values below 100 tokens",
                       fix="use lengths of at least 100 tokens")
    cal = await calibrate(ep, model)
    report = RecallReport(sorted(set(lengths)), sorted(set(depths)))
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(length: int, depth: float) -> Cell:
        key, value = needle(length, depth)
        prompt = _prompt(cal.sentences_for(length, seed=length), depth, key, value)
        async with sem:
            try:
                resp = await _chat(ep, model, prompt, max_tokens)
            except HTTPError as exc:  # e.g. longer than the context: a failed cell, not a crash
                cell = Cell(length, depth, None, False, "", f"HTTP {exc.status}")
            else:
                answer = _content(resp)
                cell = Cell(length, depth, _usage_prompt(resp), value in answer, answer[:200])
        if on_cell is not None:
            on_cell(cell)
        return cell

    cells = await asyncio.gather(*(one(n, d) for n in report.lengths for d in report.depths))
    report.cells = list(cells)
    return report
