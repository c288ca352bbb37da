"""Engine simulator: a test double for `sglang serve` (SGLang 0.5.23) behind its HTTP surface.

Owns the process that the fake hosts' units start instead of the real engine (which cannot run
here: no weights, no sm_120). It parses the real flag names, records its argv, and serves
`/health`, `/health_generate`, `/ready`, `/model_info` (+`/get_model_info`), `/server_info`
(+`/get_server_info`), `/v1/models`, `/metrics` (only with `--enable-metrics`, like the real
server), `/generate`, `/v1/chat/completions` and `/v1/completions` (both with SSE streaming).
What it answers is defined in `textgen` (token rule, needle protocol, reasoning, tool calls);
how it misbehaves is chosen by the control file (`control`). Stdlib only, Python >= 3.11.

PD handshake (what sglang-router 0.3.2 sends, seen on the wire: it adds `bootstrap_host` (the
prefill worker's URL host), `bootstrap_port` (the port given after `--prefill URL`) and a random
`bootstrap_room` to the request body and sends it to a prefill and a decode worker at once). A
prefill or decode simulator refuses a generation without those three fields (400): a PD request
without them can never be paired. A prefill refuses a `bootstrap_port` other than its own
`--disaggregation-bootstrap-port` (400) and registers the room with its bootstrap server; a decode
asks that server, at `bootstrap_host:bootstrap_port`, for the room (for up to
`BOOTSTRAP_WAIT_S`, the two requests race) and fails the request (500, "KV transfer failed")
when it never appears there. So a router that points a decode at the wrong prefill address or
bootstrap port fails its requests here as it would on real hosts.

Every start appends one JSON line to `<engine env>/sim-runs.jsonl` (or `$DSV4_SIM_RUNS`):
`{"pid", "time", "argv", "mode", "port", "switches", "unknown_args"}`, so tests can count
restarts per role. Exit codes: 2 bad argv or control file, 1 cannot start (model path
missing, port in use), `crash_exit_code` for a simulated crash, 0 on SIGTERM.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from . import control, textgen
from .httpbase import Handler, Server, TokenBucket, serve_forever, start_crash_timer
from .metrics import EngineMetrics

VERSION = "0.5.23"
BOOTSTRAP_WAIT_S = 5.0  # how long a decode waits for its room to appear at the prefill


def build_parser() -> argparse.ArgumentParser:
    """The subset of sglang 0.5.23 flags the simulator interprets (others are tolerated)."""
    p = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=True)
    a = p.add_argument
    a("--model-path", "--model", dest="model_path", required=True)
    a("--served-model-name", dest="served_model_name")
    a("--tokenizer-path", dest="tokenizer_path")
    a("--trust-remote-code", action="store_true")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    a("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size", type=int,
      default=1)
    a("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    a("--base-gpu-id", type=int, default=0)
    a("--gpu-id-step", type=int, default=1)
    a("--nccl-port", type=int)
    a("--dist-init-addr")
    a("--engine-info-bootstrap-port", type=int, default=6789)
    a("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    a("--disaggregation-transfer-backend", default="mooncake",
      choices=["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"])
    a("--disaggregation-bootstrap-port", type=int, default=8998)
    a("--disaggregation-ib-device")
    a("--enable-metrics", action="store_true")
    a("--enable-cache-report", action="store_true")
    a("--json-model-override-args", default="{}")
    a("--preferred-sampling-params")
    a("--sampling-defaults", choices=["openai", "model"], default="model")
    a("--reasoning-parser")
    a("--tool-call-parser")
    a("--context-length", type=int)
    a("--mem-fraction-static", type=float)
    a("--max-running-requests", type=int)
    a("--chunked-prefill-size", type=int)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--kv-cache-dtype", default="auto")
    a("--page-size", type=int)
    a("--quantization")
    a("--moe-runner-backend", default="auto")
    a("--attention-backend")
    a("--dsv4-attn-backend", default="auto")
    a("--speculative-algorithm")
    a("--speculative-num-steps", type=int)
    a("--speculative-eagle-topk", type=int)
    a("--speculative-num-draft-tokens", type=int)
    a("--cuda-graph-max-bs-decode", type=int)
    a("--watchdog-timeout", type=float, default=300)
    a("--log-level", default="info")
    a("--api-key")
    a("--skip-server-warmup", action="store_true")
    return p


class Engine:
    """Process-wide state of one simulated server."""

    def __init__(self, args: argparse.Namespace, argv: list[str], unknown: list[str],
                 switches: dict[str, Any], env_dir: Path) -> None:
        self.args = args
        self.argv = argv
        self.unknown = unknown
        self.sw = switches
        self.env_dir = env_dir
        self.start = time.monotonic()
        self.start_wall = time.time()
        self.mode = "unified" if args.disaggregation_mode == "null" else args.disaggregation_mode
        self.served = args.served_model_name or args.model_path
        self.context_length = args.context_length or 1048576
        self.bucket = TokenBucket(float(switches["token_rate"])) if switches["token_rate"] else None
        self.slots = threading.Semaphore(args.max_running_requests or 256)
        self.metrics = EngineMetrics(
            model_name=self.served, engine_type=self.mode, attn_dp_size=args.attn_dp_size,
            max_total_tokens=self._pool_tokens(), speculative=bool(args.speculative_algorithm),
            start_time=self.start_wall)
        self.metrics.cache_hit_rate = float(switches["cache_hit_rate"])
        self.metrics.spec_accept_length = float(switches["spec_accept_length"])
        self.metrics.overrides = {k: float(v) for k, v in switches["metrics"].items()}
        self.sampling_defaults = self._sampling_defaults()
        self.rooms: set[int] = set()  # prefill: bootstrap rooms its requests registered
        self.rooms_lock = threading.Lock()

    def _pool_tokens(self) -> int:
        """The pool this engine reports (control switches pool_tokens / pool_factor)."""
        if self.sw["pool_tokens"] is not None:
            return int(self.sw["pool_tokens"])
        base = 500000
        role = "engine" if self.mode == "unified" else self.mode
        try:  # the unit's WorkingDirectory is the install root; `current` is being started
            plan = json.loads(Path("current/plan.json").read_text())
            cap = next(c for c in plan["capacity"] if c["role"] == role)
            base = int(cap.get("model_tokens_per_rank") or cap["max_total_tokens_per_rank"])
        except (OSError, ValueError, KeyError, StopIteration):
            pass
        return int(base * float(self.sw["pool_factor"])) // 256 * 256

    def scheduler_line(self) -> str:
        """SGLang 0.5.23's startup line (managers/scheduler.py L1267-1276), with its log prefix."""
        a = self.args
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.start_wall))
        return (f"[{stamp} TP0] max_total_num_tokens={self.metrics.max_total_tokens}, "
                f"chunked_prefill_size={a.chunked_prefill_size}, max_prefill_tokens=16384, "
                f"max_running_requests={a.max_running_requests or 256}, "
                f"context_len={self.context_length}, available_gpu_mem=11.42 GB")

    def _sampling_defaults(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.args.sampling_defaults == "model":
            gc = Path(self.args.model_path) / "generation_config.json"
            if gc.is_file():
                try:
                    cfg = json.loads(gc.read_text())
                    out.update({k: cfg[k] for k in textgen.OPENAI_SAMPLING if k in cfg})
                except (OSError, json.JSONDecodeError):
                    pass
        out.update(self.args.preferred_sampling_params or {})
        return out

    def ready(self) -> bool:
        if self.sw["never_ready"]:
            return False
        return time.monotonic() - self.start >= float(self.sw["start_delay_s"])

    def server_info(self) -> dict[str, Any]:
        info = dict(vars(self.args))
        info["served_model_name"] = self.served
        info["launch_command"] = shlex.join(["sglang", "serve", *self.argv])
        info.update({
            "max_total_num_tokens": self.metrics.max_total_tokens,
            "max_req_input_len": self.context_length - 1,
            "startup_time": self.start_wall,
            "internal_states": [{
                "last_gen_throughput": self.metrics._gen_throughput(),
                "avg_spec_accept_length": self.metrics.spec_accept_length
                if self.args.speculative_algorithm else None,
            }],
            "version": VERSION,
            "frontend": "python",
            "sim_unknown_args": self.unknown,
        })
        return info

    def model_info(self) -> dict[str, Any]:
        a = self.args
        return {
            "model_path": a.model_path, "served_model_name": self.served,
            "tokenizer_path": a.tokenizer_path or a.model_path, "is_generation": True,
            "preferred_sampling_params": a.preferred_sampling_params,
            "weight_version": "default", "load_format": "auto",
            "reasoning_parser": a.reasoning_parser, "tool_call_parser": a.tool_call_parser,
            "disaggregation_mode": a.disaggregation_mode,
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
        }


class EngineHandler(Handler):
    engine: Engine

    def _authorized(self, path: str) -> bool:
        """SGLang 0.5.23 with --api-key (sglang/srt/utils/auth.py): every path but /health*,
        /ready* and /metrics* needs `Authorization: Bearer KEY`; else 401."""
        key = self.engine.args.api_key
        if not key or path.startswith(("/health", "/ready", "/metrics")):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self.send_json(401, {"error": "Unauthorized"})
        return False

    # -- routing -------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._count()
        e = self.engine
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            self._done()
            return
        if path in ("/health", "/health_generate"):
            ok = e.ready() and not e.sw["fail_generate"]
            self.send_bytes(200 if ok else 503, b"", "text/plain")
        elif path == "/ready":
            self.send_bytes(200 if e.ready() else 503, b"", "text/plain")
        elif path in ("/model_info", "/get_model_info"):
            self.send_json(200, e.model_info())
        elif path in ("/server_info", "/get_server_info"):
            self.send_json(200, e.server_info())
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [self._model_card()]})
        elif path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name == e.served:
                self.send_json(200, self._model_card())
            else:
                self.send_json(404, {"error": {"message": f"model {name!r} not found"}})
        elif path == "/metrics" and e.args.enable_metrics:
            self.send_text(200, e.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self.send_json(404, {"detail": "Not Found"})
        self._done()

    def do_POST(self) -> None:
        self._count()
        path = self.path.split("?", 1)[0]
        try:
            if not self._authorized(path):
                return
            body = self.read_json()
            if body is None:
                return
            routes = {"/generate": self._generate, "/v1/chat/completions": self._chat,
                      "/v1/completions": self._completions}
            fn = routes.get(path)
            if fn is None:
                self.send_json(404, {"detail": "Not Found"})
            elif self._gate() and self._bootstrap(body):
                fn(body)
        except (BrokenPipeError, ConnectionResetError):
            with self.engine.metrics.lock:
                self.engine.metrics.aborted_total += 1
        finally:
            self._done()

    def _count(self) -> None:
        m = self.engine.metrics
        with m.lock:
            m.http_total += 1
            m.http_active += 1

    def _done(self) -> None:
        m = self.engine.metrics
        with m.lock:
            m.http_active -= 1

    def _model_card(self) -> dict[str, Any]:
        e = self.engine
        return {"id": e.served, "object": "model", "created": int(e.start_wall),
                "owned_by": "sglang", "root": e.served, "max_model_len": e.context_length}

    def _gate(self) -> bool:
        e = self.engine
        if not e.ready():
            self.send_json(503, {"error": {"message": "The server is not ready yet."}})
            return False
        if e.sw["fail_generate"]:
            self.send_json(500, {"error": {"message": "simulated generation failure "
                                           "(fail_generate)", "type": "InternalServerError"}})
            return False
        return True

    def _bootstrap(self, body: dict[str, Any]) -> bool:
        """The PD handshake (see the module docstring); True when the request may go on."""
        e = self.engine
        if e.mode == "unified":
            return True
        host, port, room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port",
                                                 "bootstrap_room"))
        if not (isinstance(host, str) and host and isinstance(port, int)
                and isinstance(room, int) and not isinstance(room, bool)):
            self.send_json(400, {"error": {"message": (
                f"{e.mode} server needs bootstrap_host, bootstrap_port and bootstrap_room in a "
                f"disaggregated request, got {host!r}, {port!r}, {room!r}"),
                "type": "BadRequestError"}})
            return False
        if e.mode == "prefill":
            own = e.args.disaggregation_bootstrap_port
            if port != own:
                self.send_json(400, {"error": {"message": (
                    f"bootstrap_port {port} is not this prefill's bootstrap port {own}"),
                    "type": "BadRequestError"}})
                return False
            with e.rooms_lock:
                e.rooms.add(room)
            return True
        deadline = time.monotonic() + BOOTSTRAP_WAIT_S
        why = ""
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection(host, port, timeout=2)
                conn.request("GET", f"/sim/room/{room}")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return True
                why = f"room {room} unknown there"
            except (OSError, http.client.HTTPException) as exc:
                why = f"cannot reach it: {exc}"
            time.sleep(0.05)
        self.send_json(500, {"error": {"message": (
            f"KV transfer failed: bootstrap server {host}:{port}: {why}"),
            "type": "InternalServerError"}})
        return False

    # -- the shared generation loop ------------------------------------------------------
    def _run(self, prompt_tokens: int, pieces: list[str], emit: Any, stream: bool) -> float:
        """Admit, wait TTFT, release `pieces` one token at a time through the bucket."""
        e, m = self.engine, self.engine.metrics
        t0 = time.monotonic()
        with m.lock:
            m.queued += 1
        e.slots.acquire()
        try:
            with m.lock:
                m.queued -= 1
                m.running += 1
                m.active_tokens += prompt_tokens
                m.prompt_tokens_total += prompt_tokens
                m.requests_total += 1
                m.queue_time.observe(time.monotonic() - t0)
                m.note_kv_transfer()
            if float(e.sw["ttft_s"]) > 0:
                time.sleep(float(e.sw["ttft_s"]))
            first = last = None
            for piece in pieces:
                if e.bucket is not None:
                    e.bucket.acquire(1)
                now = time.monotonic()
                if first is None:
                    first = now
                    with m.lock:
                        m.ttft[str(stream).lower()].observe(now - t0)
                elif last is not None:
                    with m.lock:
                        m.itl.observe(now - last)
                last = now
                m.note_tokens(1)
                emit(piece)
            e2e = time.monotonic() - t0
            with m.lock:
                m.e2e[str(stream).lower()].observe(e2e)
            return e2e
        finally:
            with m.lock:
                m.running -= 1
                m.active_tokens -= prompt_tokens
            e.slots.release()

    def _too_long(self, prompt_tokens: int) -> bool:
        if prompt_tokens >= self.engine.context_length:
            self.send_json(400, {"object": "error", "message": (
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({self.engine.context_length} tokens).")})
            return True
        return False

    def _max_tokens(self, value: Any, default: int = 128) -> int:
        n = int(value) if value is not None else default
        return 1 if self.engine.mode == "prefill" else max(0, n)

    # -- /v1/chat/completions -------------------------------------------------------------
    def _chat(self, body: dict[str, Any]) -> None:
        e = self.engine
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self.send_json(400, {"object": "error", "message": "messages must be a non-empty list"})
            return
        texts = [textgen.message_text(m.get("content")) for m in messages if isinstance(m, dict)]
        prompt = "\n".join(texts)
        prompt_tokens = sum(textgen.count_tokens(t) for t in texts)
        if self._too_long(prompt_tokens):
            return
        users = [textgen.message_text(m.get("content")) for m in messages
                 if isinstance(m, dict) and m.get("role") == "user"]
        last_user = users[-1] if users else ""
        answer, reasoning, meta = textgen.answer_text(
            prompt, last_user, prompt_tokens=prompt_tokens, switches=e.sw)
        max_tokens = self._max_tokens(body.get("max_completion_tokens", body.get("max_tokens")))
        answer, finish = textgen.limit_tokens(answer, max_tokens, bool(body.get("ignore_eos")))
        thinking = textgen.thinking_requested(body)
        separate = (bool(e.args.reasoning_parser) and not e.sw["reasoning_leak"]
                    and body.get("separate_reasoning", True) is not False)
        call = textgen.choose_tool_call(body, last_user)
        parse_tools = bool(e.args.tool_call_parser) and not e.sw["raw_toolcall"]
        sampling = textgen.effective_sampling(body, e.sampling_defaults,
                                              bool(e.sw["ignore_sampling_defaults"]))
        # Build the segments the "model" emits: (field, text).
        segs: list[tuple[str, str]] = []
        if thinking:
            if separate:
                segs.append(("reasoning_content", reasoning))
            else:
                segs.append(("content", reasoning + "</think>\n\n"))
        tool_calls = None
        if call is not None:
            if parse_tools:
                tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "index": 0,
                               "type": "function", "function": {
                                   "name": call["name"],
                                   "arguments": json.dumps(call["arguments"])}}]
                finish = "tool_calls"
            else:
                segs.append(("content", textgen.dsml_markup(call)))
        else:
            segs.append(("content", answer))
        pieces: list[tuple[str, str]] = [
            (fld, p) for fld, text in segs for p in textgen.split_stream_pieces(text)]
        if tool_calls is not None:
            pieces.append(("tool_calls", ""))
        completion_tokens = sum(textgen.count_tokens(t) for _, t in segs)
        if tool_calls is not None and call is not None:
            # The model generated the DSML markup even when the parser turned it into tool_calls.
            completion_tokens += textgen.count_tokens(textgen.dsml_markup(call))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        if e.args.enable_cache_report:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        base = {"id": rid, "object": "chat.completion.chunk", "created": created,
                "model": e.served}
        if body.get("stream"):
            self.start_sse()
            self.sse_event({**base, "choices": [{"index": 0, "delta": {
                "role": "assistant", "content": ""}, "finish_reason": None}],
                "sim_sampling": sampling})

            def emit(item: tuple[str, str]) -> None:
                fld, text = item
                delta: dict[str, Any] = (
                    {"tool_calls": tool_calls} if fld == "tool_calls" else {fld: text})
                self.sse_event({**base, "choices": [{"index": 0, "delta": delta,
                                                     "finish_reason": None}]})

            self._run(prompt_tokens, pieces, emit, stream=True)  # type: ignore[arg-type]
            self.sse_event({**base, "choices": [{"index": 0, "delta": {},
                                                 "finish_reason": finish}]})
            opts = body.get("stream_options") or {}
            if opts.get("include_usage"):
                self.sse_event({**base, "choices": [], "usage": usage})
            self.sse_event("[DONE]")
            self.end_chunks()
            return
        self._run(prompt_tokens, pieces, lambda _p: None, stream=False)
        message: dict[str, Any] = {"role": "assistant", "content": None,
                                   "reasoning_content": None, "tool_calls": tool_calls}
        for fld, text in segs:
            message[fld] = (message.get(fld) or "") + text
        if tool_calls is not None and message["content"] is None:
            message["content"] = None
        self.send_json(200, {"id": rid, "object": "chat.completion", "created": created,
                             "model": e.served, "choices": [{"index": 0, "message": message,
                                                             "finish_reason": finish}],
                             "usage": usage, "sim_sampling": sampling, "sim_meta": meta})

    # -- /v1/completions ---------------------------------------------------------------
    def _completions(self, body: dict[str, Any]) -> None:
        e = self.engine
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(x) for x in prompt)
        prompt = str(prompt)
        prompt_tokens = textgen.count_tokens(prompt)
        if self._too_long(prompt_tokens):
            return
        answer, _r, meta = textgen.answer_text(prompt, prompt, prompt_tokens=prompt_tokens,
                                               switches=e.sw)
        answer, finish = textgen.limit_tokens(answer, self._max_tokens(body.get("max_tokens"), 16),
                                              bool(body.get("ignore_eos")))
        sampling = textgen.effective_sampling(body, e.sampling_defaults,
                                              bool(e.sw["ignore_sampling_defaults"]))
        pieces = textgen.split_stream_pieces(answer)
        ct = textgen.count_tokens(answer)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": ct,
                 "total_tokens": prompt_tokens + ct}
        base = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": e.served}
        if body.get("stream"):
            self.start_sse()
            self._run(prompt_tokens, pieces, lambda p: self.sse_event(
                {**base, "choices": [{"index": 0, "text": p, "finish_reason": None}]}), True)
            self.sse_event({**base, "choices": [{"index": 0, "text": "",
                                                 "finish_reason": finish}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                self.sse_event({**base, "choices": [], "usage": usage})
            self.sse_event("[DONE]")
            self.end_chunks()
            return
        self._run(prompt_tokens, pieces, lambda _p: None, False)
        self.send_json(200, {**base, "choices": [{"index": 0, "text": answer,
                                                  "finish_reason": finish}],
                             "usage": usage, "sim_sampling": sampling, "sim_meta": meta})

    # -- /generate (native) ----------------------------------------------------------------
    def _generate(self, body: dict[str, Any]) -> None:
        e = self.engine
        text = body.get("text")
        if isinstance(text, list):
            text = text[0] if text else ""
        if text is None and body.get("input_ids") is None:
            self.send_json(400, {"error": {"message": "Either text or input_ids should be "
                                           "provided."}})
            return
        prompt = str(text or "")
        ids = body.get("input_ids")
        prompt_tokens = len(ids) if isinstance(ids, list) else textgen.count_tokens(prompt)
        if self._too_long(prompt_tokens):
            return
        sp = body.get("sampling_params") or {}
        answer, _r, meta = textgen.answer_text(prompt, prompt, prompt_tokens=prompt_tokens,
                                               switches=e.sw)
        answer, finish = textgen.limit_tokens(answer, self._max_tokens(sp.get("max_new_tokens")),
                                              bool(sp.get("ignore_eos")))
        sampling = textgen.effective_sampling(body, e.sampling_defaults,
                                              bool(e.sw["ignore_sampling_defaults"]))
        pieces = textgen.split_stream_pieces(answer)
        rid = body.get("rid") or uuid.uuid4().hex

        def meta_info(done: str, e2e: float | None) -> dict[str, Any]:
            mi: dict[str, Any] = {"id": rid, "prompt_tokens": prompt_tokens,
                                  "completion_tokens": textgen.count_tokens(done),
                                  "cached_tokens": 0,
                                  "finish_reason": {"type": finish} if e2e is not None else None}
            if e2e is not None:
                mi["e2e_latency"] = e2e
            return mi

        if body.get("stream"):
            self.start_sse()
            acc: list[str] = []

            def emit(p: str) -> None:
                acc.append(p)
                self.sse_event({"text": "".join(acc), "meta_info": meta_info("".join(acc), None),
                                "sim_sampling": sampling})

            e2e = self._run(prompt_tokens, pieces, emit, True)
            self.sse_event({"text": answer, "meta_info": meta_info(answer, e2e),
                            "sim_sampling": sampling})
            self.sse_event("[DONE]")
            self.end_chunks()
            return
        e2e = self._run(prompt_tokens, pieces, lambda _p: None, False)
        self.send_json(200, {"text": answer, "meta_info": meta_info(answer, e2e),
                             "sim_sampling": sampling, "sim_meta": meta})


class BootstrapHandler(Handler):
    """Stand-in for the prefill side's KV bootstrap server: binds its port, answers /health, and
    `/sim/room/ROOM` with 200 once a request of that room reached this prefill (else 404)."""

    engine: Engine

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.startswith("/sim/room/"):
            try:
                room = int(path[len("/sim/room/"):])
            except ValueError:
                self.send_text(400, "bad room")
                return
            with self.engine.rooms_lock:
                known = room in self.engine.rooms
            self.send_text(200 if known else 404, "OK" if known else "unknown room")
            return
        self.send_text(200, "OK")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a decode polls here for every request


def _env_dir() -> Path:
    return Path(os.environ.get("DSV4_SIM_ENV_DIR") or sys.prefix)


def _fail(code: int, msg: str) -> int:
    sys.stderr.write(f"sglang (simulator): error: {msg}\n")
    sys.stderr.flush()
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "serve":
        return _fail(2, f"expected `sglang serve ARGS`, got {argv[:1]}; the simulator only "
                        "implements the `serve` subcommand")
    args, unknown = build_parser().parse_known_args(argv[1:])
    for name in ("json_model_override_args", "preferred_sampling_params"):
        raw = getattr(args, name)
        if raw is None:
            continue
        try:
            val = json.loads(raw)
        except json.JSONDecodeError as exc:
            return _fail(2, f"--{name.replace('_', '-')} is not valid JSON ({exc}): {raw!r}")
        if name == "preferred_sampling_params":
            args.preferred_sampling_params = val
    # SGLang 0.5.23 logs its parsed arguments at startup, api_key in clear (entrypoints/engine.py:
    # `logger.info(f"server_args={_server_args_for_logging(server_args)}")`, which redacts only
    # watermark keys): the simulator does the same, so tests see what a real engine log holds.
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="[%(asctime)s] %(message)s", force=True)
    logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args={vars(args)}")
    if unknown:
        sys.stderr.write(f"sglang (simulator): warning: unrecognised arguments kept: {unknown}\n")
    env_dir = _env_dir()
    mode = "unified" if args.disaggregation_mode == "null" else args.disaggregation_mode
    served = args.served_model_name or args.model_path
    try:
        switches = control.resolve(control.control_path(env_dir), port=args.port, mode=mode,
                                   served_model_name=served, argv=argv[1:])
    except control.ControlError as exc:
        return _fail(2, str(exc))
    try:
        with open(control.runs_log_path(env_dir), "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "time": time.time(), "argv": argv,
                                 "mode": mode, "port": args.port, "switches": switches,
                                 "unknown_args": unknown}) + "\n")
    except OSError as exc:
        sys.stderr.write(f"sglang (simulator): warning: cannot record run: {exc}\n")
    if args.model_path.startswith(("/", ".")) and not Path(args.model_path).exists():
        return _fail(1, f"--model-path {args.model_path!r} does not exist on this host")
    start_crash_timer(switches["crash_after_s"], switches["crash_exit_code"], "sglang")
    if float(switches["listen_delay_s"]) > 0:
        time.sleep(float(switches["listen_delay_s"]))
    engine = Engine(args, argv[1:], unknown, switches, env_dir)
    handler = type("BoundEngineHandler", (EngineHandler,), {"engine": engine})
    try:
        server = Server((args.host, args.port), handler)
        if mode == "prefill":
            boot = Server((args.host, args.disaggregation_bootstrap_port),
                          type("BoundBootstrapHandler", (BootstrapHandler,), {"engine": engine}))
            threading.Thread(target=boot.serve_forever, daemon=True).start()
    except OSError as exc:
        return _fail(1, f"cannot listen on {args.host}:{args.port} or its bootstrap port: {exc}")
    sys.stderr.write(engine.scheduler_line() + "\n")
    sys.stderr.write(f"sglang (simulator) {VERSION}: serving {served} ({mode}) on "
                     f"http://{args.host}:{args.port}\n")
    sys.stderr.flush()
    return serve_forever(server)


if __name__ == "__main__":
    sys.exit(main())
