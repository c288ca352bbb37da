"""Chat behaviour probe: the three things the operator had to fix by hand.

Owns three checks against ``/v1/chat/completions``, each naming the failing behaviour:

- ``reasoning``: with thinking requested (``chat_template_kwargs: {"thinking": true}``), the
  reasoning must come back in ``reasoning_content`` and the answer in ``content`` without think
  markup (needs SGLang's ``--reasoning-parser deepseek-v4``);
- ``tool_call``: a request carrying a tool definition (forced with ``tool_choice``) must come back
  as parsed ``tool_calls`` with JSON arguments, and no raw tool-call markup (DeepSeek DSML
  ``<｜DSML｜...>`` or the older ``<｜tool▁calls▁begin｜>``) in ``content`` (needs
  ``--tool-call-parser deepseekv4``);
- ``sampling_defaults``: a request that omits temperature/top_p must get the profile's defaults.
  Evidence: the server's advertised ``preferred_sampling_params`` (``/model_info``, SGLang
  0.5.23 ``http_server.py``), and, when the response echoes the effective parameters (the test
  double's ``sim_sampling``; a real server does not), that echo too. Nothing else on the wire
  shows the sampling a real server applied.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from orchestrator.probes.client import Endpoint, HTTPError, request_json

RAW_TOOL_MARKERS = ("<｜DSML｜", "DSML｜tool_calls", "<｜tool▁calls▁begin｜>",
                    "<｜tool▁call▁begin｜>", "<tool_call>")
THINK_MARKERS = ("</think>", "<think>")
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class ChatReport:
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def failing(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    def table(self) -> str:
        lines = [f"{'PASS' if c.passed else 'FAIL'}  {c.name:<18} {c.detail}" for c in self.checks]
        lines.append("all chat behaviours pass" if self.passed
                     else f"failing: {', '.join(self.failing())}")
        return "\n".join(lines)


def _message(resp: Any) -> dict[str, Any]:
    try:
        msg = resp["choices"][0]["message"]
        return msg if isinstance(msg, dict) else {}
    except (KeyError, IndexError, TypeError):
        return {}


async def check_reasoning(ep: Endpoint, model: str) -> Check:
    try:
        resp = await request_json(ep, "POST", "/v1/chat/completions", {
            "model": model, "max_tokens": 512,
            "messages": [{"role": "user", "content": "What is 17 + 25? Think first."}],
            "chat_template_kwargs": {"thinking": True},
        })
    except HTTPError as exc:
        return Check("reasoning", False, f"request failed: {exc.message}")
    msg = _message(resp)
    content = str(msg.get("content") or "")
    reasoning = str(msg.get("reasoning_content") or "")
    leaked = [m for m in THINK_MARKERS if m in content]
    if leaked:
        return Check("reasoning", False,
                     f"reasoning leaked into content (found {leaked[0]!r}); is the engine "
                     "started with --reasoning-parser deepseek-v4?")
    if not reasoning:
        return Check("reasoning", False,
                     "thinking was requested but no reasoning_content came back")
    if not content.strip():
        return Check("reasoning", False, "reasoning_content present but the answer is empty")
    return Check("reasoning", True,
                 f"reasoning_content {len(reasoning)} chars, answer {content.strip()[:40]!r}")


async def check_tool_call(ep: Endpoint, model: str) -> Check:
    try:
        resp = await request_json(ep, "POST", "/v1/chat/completions", {
            "model": model, "max_tokens": 256,
            "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        })
    except HTTPError as exc:
        return Check("tool_call", False, f"request failed: {exc.message}")
    msg = _message(resp)
    content = str(msg.get("content") or "")
    raw = [m for m in RAW_TOOL_MARKERS if m in content]
    if raw:
        return Check("tool_call", False,
                     f"raw tool-call markup in content (found {raw[0]!r}) instead of parsed "
                     "tool_calls; is the engine started with --tool-call-parser deepseekv4?")
    calls = msg.get("tool_calls") or []
    if not calls:
        return Check("tool_call", False, "a forced tool call came back without tool_calls "
                     f"(content: {content[:60]!r})")
    fn = (calls[0] or {}).get("function") or {}
    if fn.get("name") != "get_weather":
        return Check("tool_call", False, f"tool_calls names {fn.get('name')!r}, "
                     "expected 'get_weather'")
    try:
        args = json.loads(fn.get("arguments") or "")
    except (json.JSONDecodeError, TypeError):
        return Check("tool_call", False,
                     f"tool call arguments are not JSON: {str(fn.get('arguments'))[:60]!r}")
    if not isinstance(args, dict) or "city" not in args:
        return Check("tool_call", False, f"tool call arguments lack 'city': {args!r}")
    return Check("tool_call", True, f"get_weather({json.dumps(args)})")


def _close(a: Any, b: float) -> bool:
    try:
        return math.isclose(float(a), b, rel_tol=1e-6, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


def _params(d: dict[str, Any]) -> str:
    """``temperature 0.6, top_p unset``: sampling parameters in words, not a Python dict."""
    return ", ".join(f"{k} {'unset' if v is None else format(v, 'g') if isinstance(v, float) else v}"
                     for k, v in d.items())


async def check_sampling(ep: Endpoint, model: str, temperature: float, top_p: float) -> Check:
    want = {"temperature": temperature, "top_p": top_p}
    problems: list[str] = []
    evidence: list[str] = []
    info = None
    for path in ("/model_info", "/get_model_info"):
        try:
            info = await request_json(ep, "GET", path)
            break
        except HTTPError:
            continue
    if isinstance(info, dict) and "preferred_sampling_params" in info:
        pref = info.get("preferred_sampling_params") or {}
        if isinstance(pref, str):
            try:
                pref = json.loads(pref)
            except json.JSONDecodeError:
                pref = {}
        bad = {k: pref.get(k) for k, v in want.items() if not _close(pref.get(k), v)}
        evidence.append("model_info")
        if bad:
            problems.append(f"server's preferred_sampling_params ({_params(bad)}) differ from "
                            f"the profile's ({_params(want)}) (--preferred-sampling-params)")
    try:
        resp = await request_json(ep, "POST", "/v1/chat/completions", {
            "model": model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}],
        })
    except HTTPError as exc:
        return Check("sampling_defaults", False, f"request failed: {exc.message}")
    echo = resp.get("sim_sampling") if isinstance(resp, dict) else None
    if isinstance(echo, dict):
        evidence.append("response echo")
        bad = {k: echo.get(k) for k, v in want.items() if not _close(echo.get(k), v)}
        if bad:
            problems.append(f"a request without sampling parameters ran with {_params(bad)}, "
                            f"not the profile's defaults ({_params(want)})")
    if not evidence:
        return Check("sampling_defaults", False,
                     "cannot verify: the server exposes neither /model_info "
                     "preferred_sampling_params nor an echo of the applied parameters")
    if problems:
        return Check("sampling_defaults", False, "; ".join(problems))
    return Check("sampling_defaults", True,
                 f"temperature {temperature:g}, top_p {top_p:g} ({' + '.join(evidence)})")


async def run_chat(ep: Endpoint, model: str, *, temperature: float = 1.0,
                   top_p: float = 0.95) -> ChatReport:
    return ChatReport([
        await check_reasoning(ep, model),
        await check_tool_call(ep, model),
        await check_sampling(ep, model, temperature, top_p),
    ])
