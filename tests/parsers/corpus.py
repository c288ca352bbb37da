"""Shared argv corpus: what the flag snapshot validator and the real parsers must both accept/reject.

Owns the hand-written cases (the sketches of research/sglang.md §7 adapted to sglang 0.5.23, and
known-bad spellings) and a generator that derives, from a flag snapshot, a good and several bad argvs
for every option. Pure data: importing this never imports sglang.

``expect`` is ``"ok"``, ``"deprecated"`` (accepted upstream with a warning; dsv4ctl must not render
it) or the :data:`orchestrator.catalog.flags.validator.ProblemKind` the validator must report.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

MODEL = "/models/DeepSeek-V4-Flash"


@dataclass(frozen=True)
class Case:
    name: str
    tool: str  # "sglang" (argv after `sglang serve`) or "sglang-router"
    argv: tuple[str, ...]
    expect: str


def _s(name: str, expect: str, *argv: str) -> Case:
    return Case(name, "sglang", tuple(argv), expect)


def _r(name: str, expect: str, *argv: str) -> Case:
    return Case(name, "sglang-router", tuple(argv), expect)


MONOLITHIC = (
    "--model-path", MODEL, "--served-model-name", "deepseek-v4-flash", "--trust-remote-code",
    "--tp-size", "8", "--ep-size", "8", "--kv-cache-dtype", "fp8_e4m3",
    "--context-length", "1048576", "--chunked-prefill-size", "2048",
    "--max-running-requests", "64", "--mem-fraction-static", "0.88",
    "--cuda-graph-max-bs-decode", "64", "--reasoning-parser", "deepseek-v4",
    "--tool-call-parser", "deepseekv4", "--enable-metrics", "--enable-cache-report",
    "--watchdog-timeout", "1800", "--host", "127.0.0.1", "--port", "30000",
    "--json-model-override-args", '{"index_topk": 1024}', "--moe-runner-backend", "flashinfer_mxfp4",
)

PD_COMMON = (
    "--model-path", MODEL, "--served-model-name", "deepseek-v4-flash", "--trust-remote-code",
    "--tp-size", "4", "--kv-cache-dtype", "fp8_e4m3", "--reasoning-parser", "deepseek-v4",
    "--tool-call-parser", "deepseekv4", "--enable-metrics", "--host", "127.0.0.1",
    "--disaggregation-transfer-backend", "mooncake_tcp", "--disaggregation-bootstrap-port", "8998",
)

PREFILL = (
    *PD_COMMON, "--disaggregation-mode", "prefill", "--base-gpu-id", "0", "--port", "30001",
    "--nccl-port", "30301", "--engine-info-bootstrap-port", "6789", "--chunked-prefill-size", "2048",
)

DECODE = (
    *PD_COMMON, "--disaggregation-mode", "decode", "--base-gpu-id", "4", "--port", "30002",
    "--nccl-port", "30401", "--engine-info-bootstrap-port", "6790",
    "--cuda-graph-max-bs-decode", "64", "--attn-dp-size", "4", "--swa-full-tokens-ratio", "0.1",
)

ROUTER = (
    "--pd-disaggregation", "--prefill", "http://127.0.0.1:30001", "8998",
    "--decode", "http://127.0.0.1:30002", "--host", "0.0.0.0", "--port", "8000",
    "--prometheus-port", "29000", "--prometheus-host", "127.0.0.1",
)

CASES: tuple[Case, ...] = (
    # --- accepted: the rendering sketches, adapted to 0.5.23 ---
    _s("monolithic sketch", "ok", *MONOLITHIC),
    _s("pd prefill sketch", "ok", *PREFILL),
    _s("pd decode sketch", "ok", *DECODE),
    _s("positional model path (sglang serve MODEL)", "ok", MODEL, "--tp-size", "8"),
    _s("--model alias", "ok", "--model", MODEL),
    _s("--opt=value form", "ok", f"--model-path={MODEL}", "--tp-size=8", "--port=30000"),
    _s("negative value is a value", "ok", MODEL, "--chunked-prefill-size", "-1"),
    _s("SI context length", "ok", MODEL, "--context-length", "1M"),
    _s("IEC context length", "ok", MODEL, "--context-length", "1Mi"),
    _s("speculative EAGLE", "ok", MODEL, "--speculative-algorithm", "EAGLE",
       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
       "--speculative-num-draft-tokens", "4"),
    _s("fp4 indexer + page size", "ok", MODEL, "--enable-deepseek-v4-fp4-indexer",
       "--page-size", "256"),
    _s("preferred sampling params", "ok", MODEL, "--preferred-sampling-params",
       '{"temperature": 0.6, "top_p": 0.95}', "--sampling-defaults", "model"),
    _s("api key from a variable-free literal", "ok", MODEL, "--api-key", "sk-abc"),
    _s("model-type llm selector", "ok", "--model-type", "llm", MODEL),
    _s("cuda graph config JSON", "ok", MODEL, "--cuda-graph-config",
       '{"decode": {"max_bs": 64, "backend": "full"}, "prefill": {"backend": "disabled"}}'),
    # --- rejected ---
    _s("removed --cuda-graph-max-bs", "abbreviation", MODEL, "--cuda-graph-max-bs", "64"),
    _s("abbreviated --tp", "abbreviation", MODEL, "--tp", "8"),
    _s("abbreviated --tp=8", "abbreviation", MODEL, "--tp=8"),
    _s("bad kv dtype", "invalid_choice", MODEL, "--kv-cache-dtype", "bf17"),
    _s("port not an int", "invalid_type", MODEL, "--port", "abc"),
    _s("float not a float", "invalid_type", MODEL, "--mem-fraction-static", "lots"),
    _s("IEC with decimals", "invalid_type", MODEL, "--context-length", "1.5Mi"),
    _s("bad reasoning parser", "invalid_choice", MODEL, "--reasoning-parser", "deepseek_v4"),
    _s("bad tool parser", "invalid_choice", MODEL, "--tool-call-parser", "deepseek-v4"),
    _s("removed --nsa-decode-backend", "unknown_option", MODEL, "--nsa-decode-backend",
       "flashmla_sparse"),
    _s("not an sglang flag", "unknown_option", MODEL, "--gpu-memory-utilization", "0.9"),
    _s("missing value at end", "missing_value", MODEL, "--port"),
    _s("value starting with dash", "missing_value", MODEL, "--api-key", "-secret"),
    _s("value on a flag", "unexpected_value", MODEL, "--enable-metrics", "true"),
    _s("explicit value on a flag", "explicit_value_on_flag", MODEL, "--enable-metrics=true"),
    _s("two values for one", "unexpected_value", MODEL, "--port", "30000", "30001"),
    _s("no model path", "missing_required", "--tp-size", "8"),
    _s("help", "help_requested", MODEL, "--help"),
    _s("bad override JSON", "invalid_json", MODEL, "--json-model-override-args", "{index_topk:1024}"),
    _s("override JSON not an object", "invalid_json", MODEL, "--json-model-override-args", "[1024]"),
    _s("bad preferred sampling JSON", "invalid_type", MODEL, "--preferred-sampling-params",
       "temperature=0.6"),
    _s("cuda graph config unknown key", "invalid_type", MODEL, "--cuda-graph-config",
       '{"decode": {"maxbs": 64}}'),
    _s("cuda graph config retired backend", "invalid_type", MODEL, "--cuda-graph-backend-decode",
       "tc_piecewise"),
    _s("bad sampling defaults", "invalid_choice", MODEL, "--sampling-defaults", "vllm"),
    _s("diffusion backend selector", "backend_selector", "--model-type", "diffusion", MODEL),
    _s("double dash", "unexpected_value", MODEL, "--", "--tp-size", "8"),
    # --- deprecated: accepted upstream with a warning ---
    _s("deprecated --enable-dp-attention", "deprecated", MODEL, "--tp-size", "8", "--dp-size", "8",
       "--enable-dp-attention"),
    _s("deprecated --disable-cuda-graph", "deprecated", MODEL, "--disable-cuda-graph"),
    _s("deprecated by help --grpc-mode", "deprecated", MODEL, "--grpc-mode"),
    # --- router ---
    _r("pd router sketch", "ok", *ROUTER),
    _r("pd router, explicit none port", "ok", "--pd-disaggregation", "--prefill",
       "http://127.0.0.1:30001", "none", "--decode", "http://127.0.0.1:30002"),
    _r("pd router, two prefills", "ok", "--pd-disaggregation", "--prefill", "http://a:30001", "8998",
       "--prefill", "http://b:30003", "8999", "--decode", "http://c:30002",
       "--prefill-policy", "cache_aware", "--decode-policy", "power_of_two"),
    _r("router health knobs", "ok", "--pd-disaggregation", "--prefill", "http://a:1", "8998",
       "--decode", "http://b:2", "--worker-startup-timeout-secs", "3600",
       "--health-check-interval-secs", "10", "--request-timeout-secs", "1800"),
    _r("router bad policy", "invalid_choice", *ROUTER, "--policy", "fastest"),
    _r("router bad port", "invalid_type", *ROUTER, "--port", "http"),
    _r("router abbreviated --prom", "abbreviation", *ROUTER, "--prom", "29000"),
    _r("router abbreviated --prometheus", "abbreviation", *ROUTER, "--prometheus", "29000"),
    _r("router unknown", "unknown_option", *ROUTER, "--metrics-port", "29000"),
    _r("router decode without url", "missing_value", "--pd-disaggregation", "--decode"),
    _r("router decode two urls", "unexpected_value", "--pd-disaggregation", "--prefill",
       "http://a:1", "8998", "--decode", "http://b:2", "http://c:3"),
    _r("router prefill bad port", "invalid_type", "--pd-disaggregation", "--prefill", "http://a:1",
       "eighty", "--decode", "http://b:2"),
    _r("router prefill three values", "extra_values", "--pd-disaggregation", "--prefill",
       "http://a:1", "8998", "9000", "--decode", "http://b:2"),
    _r("router tool parser is worker-side", "invalid_choice", *ROUTER, "--tool-call-parser",
       "deepseekv4"),
)


# --------------------------------------------------------------------------------------------
# Generated corpus: every option of a snapshot, good and bad.
# --------------------------------------------------------------------------------------------

# Options whose good value cannot be guessed from the snapshot, or that act outside argparse
# (--config reads a YAML file; --help exits), are only checked with the bad shapes.
_NO_GOOD_VALUE = {"--config", "-h", "--help"}
_GOOD_BY_TYPE: dict[str | None, str] = {
    None: "x",
    "str": "x",
    "int": "7",
    "float": "0.5",
    "json.loads": '{"a": 1}',
    "sglang.srt.utils.common.human_readable_int": "4k",
    "sglang.srt.utils.common.json_list_type": "[1, 2]",
    "sglang.srt.utils.common.nullable_str": "x",
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": "{}",
}


def _prefix(tool: str) -> tuple[str, ...]:
    return (MODEL,) if tool == "sglang" else ()


def generated_cases(tool: str, snapshot: Mapping[str, Any]) -> Iterator[Case]:
    """For each option: a good use, a missing value, a bad type/choice, '=' on a flag, a prefix."""
    strings = {s for o in snapshot["options"] for s in o["option_strings"]}
    pre = _prefix(tool)
    for option in snapshot["options"]:
        for name in option["option_strings"]:
            if name in _NO_GOOD_VALUE:
                continue
            if not option["takes_value"]:
                yield Case(f"{name} flag", tool, (*pre, name), "gen")
                yield Case(f"{name}=x on flag", tool, (*pre, f"{name}=x"), "gen")
                continue
            choices = option["choices"]
            good = str(choices[0]) if choices else _GOOD_BY_TYPE.get(option["type"], "x")
            count = option["nargs"] if isinstance(option["nargs"], int) else 1
            if name.endswith("prefill") and tool == "sglang-router":
                good_values: tuple[str, ...] = ("http://a:1", "8998")
            else:
                good_values = (good,) * count
            yield Case(f"{name} good", tool, (*pre, name, *good_values), "gen")
            yield Case(f"{name}=good", tool, (*pre, f"{name}={good_values[0]}"), "gen")
            yield Case(f"{name} missing value", tool, (*pre, name), "gen")
            yield Case(f"{name} then flag", tool, (*pre, name, "--zz-not-an-option"), "gen")
            yield Case(f"{name} bad value", tool, (*pre, name, "zz-bogus"), "gen")
            yield Case(f"{name} negative", tool, (*pre, name, "-3"), "gen")
        first = option["option_strings"][0]
        if first.startswith("--") and len(first) > 4:
            cut = first[:-1]
            if cut not in strings:
                yield Case(f"{cut} (prefix)", tool, (*pre, cut, "1"), "gen")
