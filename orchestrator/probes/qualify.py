"""Release qualification: the probes as a gate that apply runs after the health checks pass.

Owns :func:`run_qualification`, called by apply with the deployment's entry URL and the profile's
``health.qualify`` section. It measures what users feel and returns figures for the release record
(so ``dsv4ctl history`` shows regressions between releases) plus a pass/fail with a reason:

- chat behaviours (always): reasoning separated, tool calls parsed, sampling defaults applied
  (the profile's temperature/top_p); a failure fails qualification;
- recall (when ``min_recall_tokens`` is set): a needle grid at min/4, min/2 and min tokens ×
  depths 0, 0.5, 1; passes when every cell up to ``min_recall_tokens`` is recalled;
- load (always; gated when ``min_output_tok_s`` is set): ``load_concurrency`` streams for
  ``load_duration_s`` seconds; figures: output tok/s, requests/s, TTFT and ITL percentiles.

Synchronous from the caller's view (it runs its own event loop, in a worker thread if the caller
already has one). It never raises for an unhealthy endpoint: that is a failed qualification with
the cause in ``reason``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from orchestrator.deployment import Deployment
from orchestrator.errors import DsvError
from orchestrator.probes.chat import run_chat
from orchestrator.probes.client import Endpoint
from orchestrator.probes.load import run_load
from orchestrator.probes.recall import run_recall
from orchestrator.profile.schema import Qualify

T = TypeVar("T")
RECALL_DEPTHS = (0.0, 0.5, 1.0)
LOAD_MAX_TOKENS = 256
LOAD_PROMPT_TOKENS = 512


@dataclass(frozen=True)
class QualifyResult:
    passed: bool
    figures: dict[str, float | int | str] = field(default_factory=dict)
    reason: str = ""


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, even if this thread has a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def recall_lengths(min_tokens: int) -> list[int]:
    return sorted({max(100, min_tokens // 4), max(100, min_tokens // 2), max(100, min_tokens)})


async def _qualify(base_url: str, dep: Deployment, cfg: Qualify,
                   api_key: str | None = None) -> QualifyResult:
    ep = Endpoint(base_url, api_key=api_key, timeout_s=600.0, deadline_s=3600.0)
    model = dep.served_name
    figures: dict[str, float | int | str] = {}
    failures: list[str] = []
    notes: list[str] = []

    chat = await run_chat(ep, model, temperature=dep.temperature, top_p=dep.top_p)
    for c in chat.checks:
        figures[f"chat_{c.name}"] = "pass" if c.passed else "fail"
        if not c.passed:
            failures.append(f"chat {c.name}: {c.detail}")
    if chat.passed:
        notes.append("chat behaviours pass")

    if cfg.min_recall_tokens is not None:
        need = cfg.min_recall_tokens
        figures["recall_required_tokens"] = need
        if need >= dep.context_length:
            failures.append(f"min_recall_tokens {need} is not below the context length "
                            f"{dep.context_length}")
        else:
            rep = await run_recall(ep, model, recall_lengths(need), RECALL_DEPTHS)
            best = rep.longest_full_recall
            figures["recall_full_tokens"] = best or 0
            for n in rep.lengths:
                figures[f"recall_at_{n}"] = round(rep.recall(n), 3)
            if best is None or best < need:
                failures.append(f"recall: full recall only up to {best or 0} tokens, "
                                f"{need} required")
            else:
                notes.append(f"full recall to {best} tokens")

    load = await run_load(ep, model, concurrency=cfg.load_concurrency,
                          duration_s=cfg.load_duration_s, max_tokens=LOAD_MAX_TOKENS,
                          prompt_tokens=LOAD_PROMPT_TOKENS)
    for k, v in load.figures().items():
        if v is not None:
            figures[f"load_{k}"] = v
    if load.requests_ok == 0:
        failures.append(f"load: no request succeeded ({load.errors[0] if load.errors else '?'})")
    elif cfg.min_output_tok_s is not None:
        figures["load_required_tok_s"] = cfg.min_output_tok_s
        if load.output_tok_s < cfg.min_output_tok_s:
            failures.append(f"load: {load.output_tok_s:.1f} output tok/s at concurrency "
                            f"{cfg.load_concurrency}, {cfg.min_output_tok_s:g} required")
        else:
            notes.append(f"{load.output_tok_s:.1f} tok/s")
    if failures:
        return QualifyResult(False, figures, "; ".join(failures))
    return QualifyResult(True, figures, "qualified: " + ", ".join(notes))


def run_qualification(base_url: str, deployment: Deployment, cfg: Qualify,
                      api_key: str | None = None) -> QualifyResult:
    """Qualify the release serving at ``base_url`` (the router in PD, else the engine);
    ``api_key``: the engine's (``secrets: DSV4_SECRET_API_KEY``), sent as a bearer token."""
    try:
        return run_sync(_qualify(base_url, deployment, cfg, api_key))
    except DsvError as exc:  # unreachable, malformed answers: a failed qualification
        return QualifyResult(False, {}, f"qualification could not run: {exc.message}")
