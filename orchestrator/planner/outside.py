"""The memory outside the static pool, as the planner checks it: ``capacity.headroom`` and
``capacity.calibrated`` (issue 22).

Owns turning a deployment role into :class:`~orchestrator.planner.headroom.HeadroomInputs` (which
indexer path the engine's env selects on this GPU), the headroom check with its two ways out, and
the info check that shows a calibrated KV pool. :mod:`orchestrator.planner.capacity` calls it per
role; the arithmetic is :mod:`orchestrator.planner.headroom`'s. Pure functions.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace

from orchestrator.catalog import Catalog, EngineRules, ModelVariant
from orchestrator.deployment import Deployment, RoleDeployment
from orchestrator.facts import PoolMeasurement
from orchestrator.planner import headroom as hr
from orchestrator.planner.checks import check, gib
from orchestrator.planner.headroom import HostGpu
from orchestrator.planner.kvpool import PoolSizing
from orchestrator.planner_model import Check
from orchestrator.profile.schema import Profile


def headroom_inputs(cat: Catalog, engine: EngineRules, model: ModelVariant, dep: Deployment,
                     role: RoleDeployment, profile: Profile, gpu: HostGpu, mfs: float
                     ) -> hr.HeadroomInputs:
    cfg = cat.config_of(model)
    w = profile.workload
    drafts = 1
    if dep.speculative_algorithm == "eagle":
        drafts = dep.speculative_num_draft_tokens or 1
    elif dep.speculative_algorithm == "dspark":
        drafts = (dep.speculative_dspark_block_size or 0) + 1
    env = _engine_env(engine, dep, role, gpu)
    tilelang = _truthy(env.get("SGLANG_OPT_USE_TILELANG_INDEXER"))
    torch_env = _truthy(env.get("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"))
    # the torch function is dsv4ctl's kernel where the role's indexer takes the bundled path
    # (orchestrator/kernel_paths.py decided it; render wrote the env read here)
    hooked = any(p.op == "indexer" and p.path == "bundled" for p in role.kernels)
    path = ("deepgemm" if dep.fp4_indexer else "tilelang" if tilelang else
            ("dsv4-kernels" if hooked else "torch-sm120") if torch_env and
            gpu.arch == "sm_120" else "deepgemm")
    return hr.HeadroomInputs(
        gpu_total_bytes=gpu.total_bytes, mem_fraction_static=mfs, tp=role.tp,
        attn_dp=role.attn_dp, disaggregation_mode=role.disaggregation_mode or "null",
        chunked_prefill_size=role.chunked_prefill_size, cuda_graph_max_bs=role.cuda_graph_max_bs,
        max_running_requests=role.max_running_requests, tokens_per_request=drafts,
        speculative=dep.speculative_algorithm != "none",
        longest_request_tokens=min(w.longest_request_tokens or w.context_tokens,
                                   dep.context_length),
        hidden_size=cfg.hidden_size.value, hc_mult=cfg.hc_mult.value,
        num_attention_heads=cfg.num_attention_heads.value, head_dim=cfg.head_dim.value,
        q_lora_rank=cfg.q_lora_rank.value, moe_intermediate_size=cfg.moe_intermediate_size.value,
        num_experts_per_tok=cfg.num_experts_per_tok.value,
        n_shared_experts=cfg.n_shared_experts.value, index_n_heads=cfg.index_n_heads.value,
        fp4_indexer=dep.fp4_indexer, is_sm120=gpu.arch == "sm_120",
        full_nvlink=gpu.spec.nvlink, indexer_path=path, torch_mqa_env=torch_env)


def _truthy(v: str | None) -> bool:
    # sglang 0.5.23 EnvBool.parse (srt/environ.py L143-151): these are true, anything else not
    return (v or "").lower() in ("1", "true", "yes", "y")


def _engine_env(engine: EngineRules, dep: Deployment, role: RoleDeployment, gpu: HostGpu
                ) -> dict[str, str]:
    """The env the engine's indexer sees: the role's env file as render writes it
    (``render.engine_env``: dsv4ctl's kernel switches, then the role's env), then what sglang
    0.5.23's V4 hook sets on sm_120 where those left a variable unset (model_hook.py L482-502:
    ``if not envs.X.is_set(): envs.X.set(...)``)."""
    from orchestrator.render import engine_env

    env = {k: v for k, v, _ in engine_env(dep, role, f"topology.{role.name}")}
    if gpu.arch == "sm_120":
        for k, v in engine.env_set_on_sm120.values.items():
            env.setdefault(k, v)
    return env


def calibration_check(role: RoleDeployment, m: PoolMeasurement, model_tokens: int, s: PoolSizing,
                      host: str, h: hr.HeadroomModel | None = None) -> tuple[str, Check]:
    """The calibration term of a role, as a sentence and as the info check that shows it. With
    the scheduler's ``available_gpu_mem`` (free memory once weights, pools and CUDA graphs exist)
    the sentence also sets it beside what the headroom model expects at that moment."""
    u = m.unexplained_bytes
    where = f"release {m.release}" if m.release else m.source
    text = (f"calibrated from host {host}'s measurement (sglang {m.engine_version}, "
            f"{m.model_variant}, {where}, {m.measured_at}): the model predicts {model_tokens:,} "
            f"tokens per rank, the engine reported {m.measured_tokens:,} for a configuration the "
            f"model put at {m.model_tokens:,}; {gib(abs(u))} per rank "
            + ("the model does not explain is subtracted" if u >= 0 else
               "more than the model expected is added")
            + f": {s.max_total_num_tokens:,} tokens per rank")
    if m.available_gpu_mem_gib is not None and h is not None:
        graphs = sum(t.bytes for t in h.terms if t.id == "cuda_graphs")
        text += (f"; after its start the engine reported {m.available_gpu_mem_gib:.2f} GiB free "
                 f"where the headroom model expects {(s.headroom_bytes - graphs) / 2**30:.2f} GiB "
                 "(headroom less CUDA graphs)")
    return text, check(
        "capacity.calibrated", "info", "KV pool calibrated from the host's engine",
        f"role {role.name}: {text}",
        f"reset with `dsv4ctl calibrate --host {shlex.quote(host)} --reset` to plan from the "
        "model alone",
        subject=role.name, model_tokens=model_tokens, measured_tokens=m.measured_tokens,
        calibrated_tokens=s.max_total_num_tokens, calibration_bytes=u,
        engine_version=m.engine_version,
        **({"available_gpu_mem_gib": m.available_gpu_mem_gib}
           if m.available_gpu_mem_gib is not None else {}))


def headroom_checks(role: RoleDeployment, s: PoolSizing, h: hr.HeadroomModel, mfs: float,
                     hx: hr.HeadroomInputs,
                     sized: Callable[[float], tuple[PoolSizing, hr.HeadroomModel]]) -> list[Check]:
    """``capacity.headroom``: the runtime terms at the worst moment must fit what the KV pool left.

    An error when the exact terms alone do not fit; a warning when the estimates tip it. The fix
    names both ways out with their price: the highest mem_fraction_static that fits (and the pool
    it leaves), and the largest chunk that fits (and how many prefill steps the longest request
    then takes).
    """
    need, have = h.runtime_bytes, max(0, s.headroom_bytes)
    if need <= have:
        return []
    big = h.largest_runtime
    exact_need = sum(t.bytes for t in h.terms if t.phase == "runtime" and t.exact)
    ways = []
    if big.id == "cuda_graphs":
        # the largest term's own lever first: fewer captured batch sizes shrink the graphs
        # without shrinking the pool (batches above it run without a graph)
        bs = h.cuda_graph_max_bs
        while bs > 1:
            bs //= 2
            h4 = hr.build(replace(hx, cuda_graph_max_bs=bs), have)
            if h4.runtime_bytes <= have:
                graphs = sum(t.bytes for t in h4.terms if t.id == "cuda_graphs")
                ways.append(f"lower cuda_graph_max_bs to {bs} (CUDA graphs then take "
                            f"{gib(graphs)} instead of {gib(big.bytes)}; batches above {bs} run "
                            "without a graph)")
                break
        else:
            ways.append("no smaller cuda_graph_max_bs fits it")
    for step in range(1, int(mfs * 100)):
        m = round(mfs - step / 100, 2)
        s2, h2 = sized(m)
        if s2.fits and h2.runtime_bytes <= s2.headroom_bytes:
            ways.append(f"lower mem_fraction_static to {m:.2f} (the pool then holds "
                        f"{s2.max_total_num_tokens:,} tokens per rank instead of "
                        f"{s.max_total_num_tokens:,})")
            break
    else:
        ways.append("no lower mem_fraction_static fits it: give the role more GPUs or hold less")
    longest = h.longest_request_tokens
    if hx.disaggregation_mode != "decode":
        chunk = h.chunked_prefill_size
        while chunk > 256:
            chunk //= 2
            h3 = hr.build(replace(hx, chunked_prefill_size=chunk), have)
            if h3.runtime_bytes <= have:
                ways.append(
                    f"set chunked_prefill_size to {chunk} (the {longest:,}-token request then "
                    f"takes {-(-longest // chunk)} prefill steps instead of "
                    f"{-(-longest // h.chunked_prefill_size)}: slower prefill)")
                break
        else:
            ways.append("no smaller chunk fits at this mem_fraction_static")
    else:
        ways.append("lower max_running_requests or cuda_graph_max_bs (a smaller decode batch)")
    if big.id == "indexer_logits" and hx.indexer_path == "torch-sm120":
        ways.append("score the indexer with TileLang, sglang's sm_120 default (drop "
                    "SGLANG_OPT_USE_TILELANG_INDEXER=0 from the role's env): its logits are one "
                    "fp32 [rows, keys] piece, not the torch function's per-head working set")
    exact = exact_need > have
    return [check(
        "capacity.headroom", "error" if exact else "warning",
        "the longest request does not fit outside the static pool",
        f"role {role.name}: at its worst moment ({h.notes[0]}) a rank needs {gib(need)} outside "
        f"mem_fraction_static {mfs:.2f} but the KV pool leaves {gib(have)}; the largest term is "
        f"{big.id} ({gib(big.bytes)}{'' if big.exact else ', an estimate'}: {big.detail})",
        "; or ".join(ways),
        field=(f"topology.{role.name}.cuda_graph_max_bs" if big.id == "cuda_graphs"
               else "serving.mem_fraction_static"),
        subject=role.name, need_bytes=need, headroom_bytes=have,
        largest_term=big.id, largest_bytes=big.bytes, longest_request_tokens=longest,
        source="planner/headroom.py; docs/headroom-sglang-0.5.23.md")]
