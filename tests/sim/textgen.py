"""The simulator's "model": token counting, the needle protocol, answers, reasoning and tool calls.

Owns every rule that decides what text the engine simulator returns, so that probe authors can
rely on one documented, deterministic behaviour (no randomness, no hidden backdoor):

Token rule: a token is a maximal run of word characters or a single non-space, non-word
character (`re.findall(r"\\w+|[^\\w\\s]", text)`). `usage.prompt_tokens` is the sum of that
count over every message's text content (chat) or over the prompt text (`/generate`,
`/v1/completions`); `usage.completion_tokens` counts the returned text (content plus
reasoning) by the same rule. Streaming sends one token per chunk.

Needle protocol (plain natural language):
- needle, anywhere in any message: ``The secret code for <KEY> is <VALUE>.`` where KEY is the
  words between "for" and "is" and VALUE is one whitespace-free word (a trailing period ends the
  sentence, it is not part of VALUE);
- question, in the last user message: ``What is the secret code for <KEY>?``;
- answer: ``The secret code for <KEY> is <VALUE>.`` when the prompt has at most
  `recall_horizon_tokens` tokens (or no horizon is set); otherwise, or with `wrong_answer`, the
  same sentence with a different VALUE (deterministically derived, never equal to the real one).
  A key that is not in the prompt is answered ``I do not know the secret code for <KEY>.``

Other prompts: a question ``What is A + B?`` (also -, *, integers) is answered ``A + B = C.``
(C wrong under `wrong_answer`); anything else gets a generic answer of `output_tokens` tokens
(`max_tokens` caps every answer; with `ignore_eos` the answer is padded to exactly `max_tokens`).

Thinking: requested by `chat_template_kwargs` `{"thinking": true}` or
`{"enable_thinking": true}`. The server separates it into `reasoning_content` only when started
with `--reasoning-parser` (as the real server does) and `reasoning_leak` is off; otherwise the
reasoning stays in `content` as ``<reasoning></think>\\n\\n<answer>``.

Tools: a request with `tools` (and `tool_choice` not "none") is answered with a call of the
named tool (`tool_choice` function) or the first tool, with arguments filled from its JSON schema
(required properties only: strings get the last capitalised word of the last user message or
"example", numbers 1, booleans true). The call is parsed into `tool_calls` only when the server
was started with `--tool-call-parser` and `raw_toolcall` is off; otherwise the DeepSeek-V4 DSML
markup is returned in `content` (format from sglang 0.5.23
`srt/function_call/deepseekv4_detector.py`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
NEEDLE_RE = re.compile(r"The secret code for (.+?) is (\S+?)\.?(?=\s|$)")
QUESTION_RE = re.compile(r"What is the secret code for (.+?)\?")
ARITH_RE = re.compile(r"What is (-?\d+)\s*([+*-])\s*(-?\d+)\s*\?")
FILLER = [
    "the", "simulated", "engine", "answers", "with", "this", "deterministic", "filler", "text",
    "so", "that", "clients", "can", "measure", "throughput", "latency", "and", "token",
    "accounting", "without", "a", "real", "model",
]


def count_tokens(text: str) -> int:
    """Tokens in `text` by the documented rule."""
    return len(TOKEN_RE.findall(text))


def split_stream_pieces(text: str) -> list[str]:
    """Split text into stream chunks, one token each, keeping the whitespace before a token."""
    return re.findall(r"\s*(?:\w+|[^\w\s])", text) or ([text] if text else [])


def message_text(content: Any) -> str:
    """Text of an OpenAI message `content` (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return str(content)


def _wrong_value(value: str) -> str:
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    wrong = f"X{digest}"
    return wrong if wrong != value else f"Y{digest}"


@dataclass
class Answer:
    """What the model 'generated' before the server's parsers run."""

    content: str
    reasoning: str = ""
    tool_call: dict[str, Any] | None = None
    finish_reason: str = "stop"
    meta: dict[str, Any] = field(default_factory=dict)


def answer_text(
    prompt: str, last_user: str, *, prompt_tokens: int, switches: dict[str, Any]
) -> tuple[str, str, dict[str, Any]]:
    """(answer, reasoning, meta) for a plain-text request."""
    wrong = bool(switches.get("wrong_answer"))
    q = QUESTION_RE.search(last_user)
    if q:
        key = q.group(1).strip()
        values = [v for k, v in NEEDLE_RE.findall(prompt) if k.strip() == key]
        reasoning = f"The user asks for the secret code for {key}. I look for it in the context."
        if not values:
            return f"I do not know the secret code for {key}.", reasoning, {"needle": "absent"}
        horizon = switches.get("recall_horizon_tokens")
        beyond = horizon is not None and prompt_tokens > int(horizon)
        value = values[-1]
        if beyond or wrong:
            value = _wrong_value(value)
        meta = {"needle": "beyond_horizon" if beyond else ("wrong" if wrong else "recalled")}
        return f"The secret code for {key} is {value}.", reasoning, meta
    a = ARITH_RE.search(last_user)
    if a:
        x, op, y = int(a.group(1)), a.group(2), int(a.group(3))
        res = x + y if op == "+" else x - y if op == "-" else x * y
        if wrong:
            res += 1
        return f"{x} {op} {y} = {res}.", f"I compute {x} {op} {y}.", {"arith": True}
    n = max(1, int(switches.get("output_tokens", 32)))
    words = [FILLER[i % len(FILLER)] for i in range(n)]
    return " ".join(words), "The user wants a general answer. I write one.", {"generic": True}


def limit_tokens(text: str, max_tokens: int | None, ignore_eos: bool) -> tuple[str, str]:
    """Cap `text` at `max_tokens` tokens; pad to exactly `max_tokens` with `ignore_eos`."""
    pieces = split_stream_pieces(text)
    if max_tokens is None:
        return text, "stop"
    if len(pieces) > max_tokens:
        return "".join(pieces[:max_tokens]), "length"
    if ignore_eos and len(pieces) < max_tokens:
        extra = [" " + FILLER[i % len(FILLER)] for i in range(max_tokens - len(pieces))]
        return "".join(pieces + extra), "length"
    return text, "stop"


def thinking_requested(body: dict[str, Any]) -> bool:
    """True when the request asks for thinking via chat_template_kwargs."""
    kwargs = body.get("chat_template_kwargs") or {}
    return bool(kwargs.get("thinking") or kwargs.get("enable_thinking"))


def _fill_arg(schema: dict[str, Any], last_user: str) -> Any:
    typ = schema.get("type")
    if typ in ("number", "integer"):
        return 1
    if typ == "boolean":
        return True
    if schema.get("enum"):
        return schema["enum"][0]
    caps = re.findall(r"\b[A-Z][a-zA-Z]+\b", last_user)
    return caps[-1] if caps else "example"


def choose_tool_call(body: dict[str, Any], last_user: str) -> dict[str, Any] | None:
    """The tool call the 'model' makes for a request carrying tools, or None."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    functions = [t.get("function", {}) for t in tools if isinstance(t, dict)]
    fn = functions[0] if functions else {}
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        fn = next((f for f in functions if f.get("name") == wanted), fn)
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required") or list(props)
    args = {name: _fill_arg(props.get(name, {}), last_user) for name in required}
    return {"name": fn.get("name", "unknown"), "arguments": args}


def dsml_markup(call: dict[str, Any]) -> str:
    """DeepSeek-V4 DSML tool-call markup, as the model emits it before parsing."""
    lines = ["<｜DSML｜tool_calls>", f'<｜DSML｜invoke name="{call["name"]}">']
    for k, v in call["arguments"].items():
        is_str = isinstance(v, str)
        val = v if is_str else json.dumps(v)
        lines.append(
            f'<｜DSML｜parameter name="{k}" string="{str(is_str).lower()}">{val}</｜DSML｜parameter>'
        )
    lines += ["</｜DSML｜invoke>", "</｜DSML｜tool_calls>"]
    return "\n".join(lines)


OPENAI_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}


def effective_sampling(
    body: dict[str, Any], defaults: dict[str, Any], ignore_defaults: bool
) -> dict[str, Any]:
    """Sampling params used: OpenAI defaults < server defaults < explicit request values."""
    eff = dict(OPENAI_SAMPLING)
    if not ignore_defaults:
        eff.update({k: v for k, v in defaults.items() if k in OPENAI_SAMPLING})
    sp = body.get("sampling_params") if isinstance(body.get("sampling_params"), dict) else body
    for k in OPENAI_SAMPLING:
        if sp.get(k) is not None:
            eff[k] = sp[k]
    return eff
