"""Behaviour switches for the engine simulator and router double: the control-file schema.

Owns reading, validating and resolving `sim-control.json` so that a test can make one simulated
instance (picked by port, by role or by a match on its argv) slow, broken or wrong, while the
others stay healthy. Read once at process start (a restart picks up a new file).

Schema (every section and key optional; unknown keys are an error so a typo cannot silently
make a fault switch do nothing)::

    {
      "default": {SWITCHES},
      "by_mode": {"unified"|"prefill"|"decode"|"router": {SWITCHES}},
      "by_port": {"30002": {SWITCHES}},
      "rules": [
        {"match": {"port": 30002, "mode": "decode", "served_model_name": "x",
                   "argv_contains": ["--mem-fraction-static 0.8"]},
         "set": {SWITCHES},
         "max_times": 1}
      ]
    }

Resolution order (later wins): built-in defaults, `default`, `by_mode[mode]`, `by_port[port]`,
then every matching rule in order. `argv_contains` entries are substrings of the argv joined
with single spaces. `max_times: N` makes a rule apply to the first N process starts that matched
it only (counted in `<control file>.state.json`), e.g. "the new release never becomes ready, but
the rolled-back one (same port, same argv) does".

SWITCHES (see `DEFAULTS` for the built-in values):
- start_delay_s: float. Port bound at once, but /ready, /health, generation answer 503 until then.
- listen_delay_s: float. Nothing listens on the port until then (connection refused).
- never_ready: bool. /ready and /health stay 503 forever.
- crash_after_s: float|null. The process exits with `crash_exit_code` that long after start.
- crash_exit_code: int (default 1).
- fail_generate: bool. /generate, /v1/chat/completions, /v1/completions answer 500, and /health
  (which generates one token in the real server) answers 503; /ready stays 200.
- wrong_answer: bool. Needle and arithmetic questions are answered wrongly.
- recall_horizon_tokens: int|null. Needle questions in prompts longer than this many tokens are
  answered wrongly (token rule in `textgen.count_tokens`).
- token_rate: float|null. Aggregate output tokens/s cap for the whole server (token bucket).
- ttft_s: float. Extra delay before the first output token of each request.
- output_tokens: int. Length of the generic (non-question) answer.
- reasoning_leak: bool. Reasoning is left in `content` (`...</think>answer`), no
  `reasoning_content`.
- raw_toolcall: bool. Tool calls come back as DSML markup in `content`, no `tool_calls`.
- ignore_sampling_defaults: bool. `--preferred-sampling-params` / generation_config defaults
  are not applied to requests that omit sampling parameters.
- cache_hit_rate: float, spec_accept_length: float. Values shown on /metrics.
- metrics: {"sglang:name": value}. Forces gauge values on /metrics (for alert tests).
- pool_factor: float (default 1.0), pool_tokens: int|null. The KV pool the engine reports
  (`max_total_num_tokens` on /server_info and /metrics, the scheduler's startup log line). The
  base stands in for SGLang's own sizing: the model's prediction in the release being started
  (`current/plan.json` in the unit's working directory, `model_tokens_per_rank` of this role),
  500000 without one. `pool_factor` scales it (0.7: 30% below, as a real engine can land);
  `pool_tokens` sets it outright.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = {
    "start_delay_s": 0.0,
    "listen_delay_s": 0.0,
    "never_ready": False,
    "crash_after_s": None,
    "crash_exit_code": 1,
    "fail_generate": False,
    "wrong_answer": False,
    "recall_horizon_tokens": None,
    "token_rate": None,
    "ttft_s": 0.0,
    "output_tokens": 32,
    "reasoning_leak": False,
    "raw_toolcall": False,
    "ignore_sampling_defaults": False,
    "cache_hit_rate": 0.0,
    "spec_accept_length": 3.2,
    "metrics": {},
    "pool_factor": 1.0,
    "pool_tokens": None,
}

_SECTIONS = {"default", "by_mode", "by_port", "rules"}
_MATCH_KEYS = {"port", "mode", "served_model_name", "argv_contains"}
_RULE_KEYS = {"match", "set", "max_times"}
MODES = ("unified", "prefill", "decode", "router")


class ControlError(Exception):
    """The control file is unreadable or invalid; the message says what, where and how to fix."""


def _check_switches(where: str, switches: Any) -> dict[str, Any]:
    if not isinstance(switches, dict):
        raise ControlError(f"{where}: expected an object of switches, got {switches!r}")
    unknown = sorted(set(switches) - set(DEFAULTS))
    if unknown:
        raise ControlError(
            f"{where}: unknown switch(es) {unknown}; known switches: {sorted(DEFAULTS)}"
        )
    return switches


def load_control(path: Path) -> dict[str, Any]:
    """Read and validate the control file; a missing file means "all defaults"."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError) as exc:
        raise ControlError(
            f"control file {path}: cannot parse JSON ({exc}); fix or delete it") from None
    if not isinstance(data, dict):
        raise ControlError(f"control file {path}: top level must be an object, got {data!r}")
    unknown = sorted(set(data) - _SECTIONS)
    if unknown:
        raise ControlError(
            f"control file {path}: unknown section(s) {unknown}; allowed: {sorted(_SECTIONS)}"
        )
    _check_switches(f"{path}: default", data.get("default", {}))
    for mode, sw in data.get("by_mode", {}).items():
        if mode not in MODES:
            raise ControlError(f"{path}: by_mode key {mode!r} is not one of {MODES}")
        _check_switches(f"{path}: by_mode.{mode}", sw)
    for port, sw in data.get("by_port", {}).items():
        if not str(port).isdigit():
            raise ControlError(f"{path}: by_port key {port!r} must be a port number string")
        _check_switches(f"{path}: by_port.{port}", sw)
    for i, rule in enumerate(data.get("rules", [])):
        if not isinstance(rule, dict) or set(rule) - _RULE_KEYS:
            raise ControlError(f"{path}: rules[{i}] must be an object with keys {_RULE_KEYS}")
        match = rule.get("match", {})
        if not isinstance(match, dict) or set(match) - _MATCH_KEYS:
            raise ControlError(f"{path}: rules[{i}].match may only use keys {_MATCH_KEYS}")
        _check_switches(f"{path}: rules[{i}].set", rule.get("set", {}))
    return data


def _rule_matches(match: dict[str, Any], port: int, mode: str, served: str, argv: str) -> bool:
    if "port" in match and int(match["port"]) != port:
        return False
    if "mode" in match and match["mode"] != mode:
        return False
    if "served_model_name" in match and match["served_model_name"] != served:
        return False
    needles = match.get("argv_contains", [])
    if isinstance(needles, str):
        needles = [needles]
    return all(n in argv for n in needles)


def _bump_rule_counter(state_path: Path, index: int, max_times: int) -> bool:
    """Count one start against rule `index`; True if the rule still applies (under flock)."""
    state_path.parent.mkdir(parents=True, exist_ok=True)
    with open(state_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        raw = fh.read()
        state = json.loads(raw) if raw.strip() else {}
        key = f"rule{index}"
        used = int(state.get(key, 0))
        if used >= max_times:
            return False
        state[key] = used + 1
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(state))
        return True


def resolve(
    path: Path, *, port: int, mode: str, served_model_name: str, argv: list[str]
) -> dict[str, Any]:
    """The switches in force for one process start."""
    data = load_control(path)
    eff: dict[str, Any] = dict(DEFAULTS)
    eff.update(data.get("default", {}))
    eff.update(data.get("by_mode", {}).get(mode, {}))
    eff.update(data.get("by_port", {}).get(str(port), {}))
    joined = " ".join(argv)
    for i, rule in enumerate(data.get("rules", [])):
        if not _rule_matches(rule.get("match", {}), port, mode, served_model_name, joined):
            continue
        if "max_times" in rule:
            state = state_dir(path.parent) / (path.name + ".state.json")
            if not _bump_rule_counter(state, i, int(rule["max_times"])):
                continue
        eff.update(rule.get("set", {}))
    return eff


def control_path(env_dir: Path) -> Path:
    """`$DSV4_SIM_CONTROL`, else `<engine env dir>/sim-control.json`."""
    return Path(os.environ.get("DSV4_SIM_CONTROL") or env_dir / "sim-control.json")


def state_dir(env_dir: Path) -> Path:
    """Where a start writes its run log and rule counters: the engine env dir, or, when the unit
    sees that dir read-only (the sandbox's ProtectSystem=strict, issue 19), the folder of the log
    file its stdout appends to, which the unit's ReadWritePaths keeps writable. The harness reads
    both places (`FakeHost.sim_runs`)."""
    if os.access(env_dir, os.W_OK):
        return env_dir
    try:
        out = Path(os.readlink("/proc/self/fd/1"))
    except OSError:
        return env_dir
    return out.parent if out.is_file() and os.access(out.parent, os.W_OK) else env_dir


def runs_log_path(env_dir: Path) -> Path:
    """`$DSV4_SIM_RUNS`, else `sim-runs.jsonl` in `state_dir(env_dir)` (one JSON line per start)."""
    return Path(os.environ.get("DSV4_SIM_RUNS") or state_dir(env_dir) / "sim-runs.jsonl")
