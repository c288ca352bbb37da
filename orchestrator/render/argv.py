"""The engine and router command lines, as argv lists, for SGLang 0.5.23 and sglang-router 0.3.2.

Owns the mapping from a resolved :class:`~orchestrator.deployment.Deployment` to the exact
arguments the host runs. The launch scripts only quote these lists; keeping them as data lets the
tests feed the very same list to the real upstream parsers (``tests/parsers``) and compare it with
what a fake ``sglang`` on PATH received.

Flag names are the full names of 0.5.23 (its parsers keep ``allow_abbrev=True``, so ``--tp 8``
would start today and break when a new ``--tp-...`` flag lands). Sources:
``sglang/srt/arg_groups/fields/*.py`` of the installed 0.5.23 wheel and
``sglang_router/router_args.py`` of 0.3.2 (research digest: ../shared/research/sglang.md §2, §3,
§7).

Decisions worth knowing:

- ``--json-model-override-args '{"index_topk": N}'`` is always rendered, even when N equals the
  model's default: the value the engine runs with is then visible in the launch line, in
  ``/server_info`` and in every diff, and does not depend on a checkpoint ``config.json`` we cannot
  see at render time (repackaged checkpoints may carry their own value).
- Sampling defaults: ``--preferred-sampling-params`` (JSON) is the 0.5.23 flag whose values fill in
  what a request omits (``TokenizerManager._create_tokenized_object``: ``{**preferred,
  **request}``). The OpenAI endpoints resolve omitted values earlier, from the checkpoint's
  ``generation_config.json`` when ``--sampling-defaults model`` (``ChatCompletionRequest.
  to_sampling_params``), so ``--sampling-defaults model`` is rendered explicitly as well.
- ``--revision`` is not rendered: ``model.path`` is a local directory, the revision is what the
  download step fetches into it.
- ``model.expert_storage`` has no 0.5.23 flag; it is a planner input (memory), not an engine flag.
"""

from __future__ import annotations

import json

from orchestrator.catalog.flags import FlagTable
from orchestrator.deployment import LOOPBACK, Deployment, RoleDeployment
from orchestrator.errors import RenderError

# engines listen on loopback; clients reach the router (PD) or a proxy. In a fleet (issue 23) an
# engine that a router or PD peer on another host must reach listens on its host's service address
# instead (RoleDeployment.listen), never on every interface.
ENGINE_HOST = LOOPBACK

_SPEC_ALGORITHMS = {"eagle": "EAGLE", "dspark": "DSPARK"}


# Every engine flag this module renders, with the profile field that sets it ("" when dsv4ctl fixes
# the value by design, with the reason). extra_args may not repeat one: argparse keeps the last
# value, so `extra_args: [--host, 0.0.0.0]` silently moved the engine off loopback and
# `--model-path` could point it elsewhere (issue 19). tests/unit/test_hostile_reserved_flags.py checks
# that every flag engine_argv emits is listed here, so this table and the renderer cannot drift.
ENGINE_FLAG_FIELDS: dict[str, str] = {
    "--model-path": "model.path",
    "--served-model-name": "model.served_name",
    "--trust-remote-code": "model.trust_remote_code",
    "--host": "|engines listen on 127.0.0.1 (in a fleet, the host's service_address when another "
              "host must reach them); clients reach them through the router or a proxy",
    "--port": "topology.{role}.port",
    "--tp-size": "topology.{role}.tp",
    "--ep-size": "topology.{role}.ep",
    "--attn-dp-size": "topology.{role}.attn_dp",
    "--moe-runner-backend": "moe.runner_backend",
    "--kv-cache-dtype": "attention.kv_cache_dtype",
    "--json-model-override-args": "attention.index_topk",
    "--context-length": "attention.context_length",
    "--enable-deepseek-v4-fp4-indexer": "attention.fp4_indexer",
    "--mem-fraction-static": "topology.{role}.mem_fraction_static (or serving.mem_fraction_static)",
    "--max-running-requests": "topology.{role}.max_running_requests",
    "--chunked-prefill-size": "topology.{role}.chunked_prefill_size",
    "--cuda-graph-max-bs-decode": "topology.{role}.cuda_graph_max_bs",
    "--reasoning-parser": "|DeepSeek-V4's reasoning parser is always rendered",
    "--tool-call-parser": "|DeepSeek-V4's tool-call parser is always rendered",
    "--enable-metrics": "|health checks and monitoring read /metrics",
    "--enable-cache-report": "serving.enable_cache_report",
    "--watchdog-timeout": "serving.watchdog_timeout_s",
    "--nccl-port": "topology.{role}.nccl_port",
    "--engine-info-bootstrap-port": "topology.{role}.engine_info_bootstrap_port",
    "--disaggregation-mode": "topology.mode",
    "--disaggregation-transfer-backend": "topology.transfer_backend",
    "--disaggregation-bootstrap-port": "topology.prefill.bootstrap_port",
    "--speculative-algorithm": "speculative.algorithm",
    "--speculative-eagle-topk": "|DeepSeek-V4 accepts EAGLE only with top-k 1",
    "--speculative-num-steps": "speculative.num_steps",
    "--speculative-num-draft-tokens": "speculative.num_draft_tokens",
    "--speculative-dspark-block-size": "speculative.dspark_block_size",
    "--sampling-defaults": "|the checkpoint's generation config fills what a request omits",
    "--preferred-sampling-params": "serving.sampling_defaults",
}


def reserved_in_extra_args(table: FlagTable, role: RoleDeployment) -> list[tuple[int, str, str]]:
    """``(index, token, what to use instead)`` for each word of ``role.extra_args`` that names a
    flag dsv4ctl renders itself, under any of its aliases (``--model`` is ``--model-path``) or as
    ``--flag=value``."""
    owners: dict[str, str] = {}
    for flag, field in ENGINE_FLAG_FIELDS.items():
        spec = table.spec(flag)
        if spec is not None:
            owners[spec.dest] = f"{flag}|{field}"
    out: list[tuple[int, str, str]] = []
    for i, word in enumerate(role.extra_args):
        if not word.startswith("-"):
            continue
        spec = table.spec(word.split("=", 1)[0])
        if spec is None or spec.dest not in owners:
            continue
        flag, _, field = owners[spec.dest].partition("|")
        if field.startswith("|"):
            instead = f"dsv4ctl renders {flag} itself and it has no profile field: {field[1:]}"
        else:
            instead = f"dsv4ctl renders {flag} from {field.format(role=role.name)}; set that instead"
        out.append((i, word, instead))
    return out


def _num(value: float) -> str:
    """A float as the shortest text that round-trips (0.85, not 0.8500000000000001)."""
    return repr(float(value))


def engine_program(dep: Deployment) -> list[str]:
    """What precedes :func:`engine_argv`: ``<engine env>/bin/sglang serve``."""
    return [f"{dep.engine_env}/bin/sglang", "serve"]


def engine_argv(dep: Deployment, role: RoleDeployment) -> list[str]:
    """The arguments after ``sglang serve`` for one engine role."""
    if dep.engine_name != "sglang":
        raise RenderError(f"engine.name = {dep.engine_name!r}: only sglang can be rendered",
                          fix="set engine.name: sglang")
    a: list[str] = [
        "--model-path", dep.model_path,
        "--served-model-name", dep.served_name,
    ]
    if dep.trust_remote_code:  # runs code from the checkpoint dir: only when the profile asks
        a.append("--trust-remote-code")
    a += [
        "--host", role.listen,
        "--port", str(role.port),
        "--tp-size", str(role.tp),
    ]
    if role.ep > 1:
        a += ["--ep-size", str(role.ep)]
    if role.attn_dp > 1:
        a += ["--attn-dp-size", str(role.attn_dp)]
    if dep.moe_runner_backend != "auto":
        a += ["--moe-runner-backend", dep.moe_runner_backend]
    a += [
        "--kv-cache-dtype", dep.kv_cache_dtype,
        "--json-model-override-args", json.dumps({"index_topk": dep.index_topk}, sort_keys=True),
        "--context-length", str(int(dep.context_length)),
    ]
    if dep.fp4_indexer:
        a.append("--enable-deepseek-v4-fp4-indexer")
    if role.mem_fraction_static is not None:
        a += ["--mem-fraction-static", _num(role.mem_fraction_static)]
    if role.max_running_requests is not None:
        a += ["--max-running-requests", str(role.max_running_requests)]
    if role.chunked_prefill_size is not None:
        a += ["--chunked-prefill-size", str(role.chunked_prefill_size)]
    if role.cuda_graph_max_bs is not None:
        a += ["--cuda-graph-max-bs-decode", str(role.cuda_graph_max_bs)]
    a += [
        "--reasoning-parser", "deepseek-v4",
        "--tool-call-parser", "deepseekv4",
        "--enable-metrics",
    ]
    if dep.enable_cache_report:
        a.append("--enable-cache-report")
    a += [
        "--watchdog-timeout", str(dep.watchdog_timeout_s),
        "--nccl-port", str(role.nccl_port),
        "--engine-info-bootstrap-port", str(role.engine_info_bootstrap_port),
    ]
    if role.disaggregation_mode is not None:
        if dep.transfer_backend is None:
            raise RenderError(f"role {role.name}: PD mode without a transfer backend",
                              fix="set topology.transfer_backend")
        a += [
            "--disaggregation-mode", role.disaggregation_mode,
            "--disaggregation-transfer-backend", dep.transfer_backend,
        ]
        if role.bootstrap_port is not None:
            a += ["--disaggregation-bootstrap-port", str(role.bootstrap_port)]
    if dep.speculative_algorithm != "none":
        try:
            algo = _SPEC_ALGORITHMS[dep.speculative_algorithm]
        except KeyError:
            raise RenderError(
                f"speculative.algorithm = {dep.speculative_algorithm!r} cannot be rendered",
                fix=f"use one of: none, {', '.join(sorted(_SPEC_ALGORITHMS))}") from None
        a += ["--speculative-algorithm", algo]
        if algo == "EAGLE":
            # DeepSeek-V4 accepts EAGLE (the MTP head in the checkpoint) only with top-k 1
            # (sglang 0.5.23 arg_groups/model_overrides/deepseek_v4.py).
            a += ["--speculative-eagle-topk", "1"]
        if dep.speculative_num_steps is not None:
            a += ["--speculative-num-steps", str(dep.speculative_num_steps)]
        if dep.speculative_num_draft_tokens is not None:
            a += ["--speculative-num-draft-tokens", str(dep.speculative_num_draft_tokens)]
        if algo == "DSPARK" and dep.speculative_dspark_block_size is not None:
            a += ["--speculative-dspark-block-size", str(dep.speculative_dspark_block_size)]
    a += [
        "--sampling-defaults", "model",
        "--preferred-sampling-params",
        json.dumps({"temperature": dep.temperature, "top_p": dep.top_p}, sort_keys=True),
    ]
    a += list(role.extra_args)
    return a


def router_program(dep: Deployment) -> list[str]:
    """What precedes :func:`router_argv`: the engine env's python running the router module."""
    return [f"{dep.engine_env}/bin/python", "-m", "sglang_router.launch_router"]


def router_argv(dep: Deployment, *, worker_startup_timeout_s: int | None = None) -> list[str]:
    """Arguments of ``python -m sglang_router.launch_router``: PD mode (every prefill and decode of
    the fleet) or, for a colocated fleet (issue 23), regular mode with ``--worker-urls``.

    ``--prefill URL BOOTSTRAP_PORT`` always carries the port: omitted, router 0.3.2 takes it as
    "none" (no bootstrap) and PD transfers never start (sglang.md §3).
    ``worker_startup_timeout_s`` (from ``health.startup_timeout_s``) lets the router wait as long
    for its workers as the engines may take to load the model.
    """
    r = dep.router
    if r is None:
        raise RenderError(f"deployment {dep.name!r} has no router on host {dep.host!r}")
    if r.pd:
        a = ["--pd-disaggregation"]
        for url, port in r.prefill:
            a += ["--prefill", url, str(port)]
        for url in r.decode:
            a += ["--decode", url]
    else:
        a = ["--worker-urls", *r.worker_urls]
    a += [
        "--host", r.host,
        "--port", str(r.port),
        "--prometheus-host", r.host,
        "--prometheus-port", str(r.prometheus_port),
        "--policy", r.policy,
    ]
    if worker_startup_timeout_s is not None:
        a += ["--worker-startup-timeout-secs", str(worker_startup_timeout_s)]
    return a
