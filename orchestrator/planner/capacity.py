"""GPU memory per role: weights per rank, the SGLang 0.5.23 KV pool, headroom, and whether it fits.

For each engine role the catalog gives the weight bytes one rank holds (sharding rules of SGLang's
V4 model), :mod:`orchestrator.planner.kvpool` reproduces how ``sglang serve`` sizes the KV pool from
what is left inside ``--mem-fraction-static``, and the checks say what does not fit, by how much,
and what to change. Pure functions.
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from orchestrator import calibration
from orchestrator.catalog import (
    Catalog,
    EngineRules,
    Gpu,
    ModelVariant,
    UnknownCatalogEntry,
    WeightBreakdown,
)
from orchestrator.catalog.errors import UnknownCatalogData, UnsupportedLayout
from orchestrator.deployment import Deployment, RoleDeployment
from orchestrator.facts import Facts
from orchestrator.planner import headroom as hr
from orchestrator.planner import outside
from orchestrator.planner.checks import check, gib, layout_check
from orchestrator.planner.headroom import HostGpu
from orchestrator.planner.kvpool import KVPoolError, KVPoolInputs, PoolSizing, size_pool
from orchestrator.planner_model import Check, GpuRow, HeadroomTermRow, RoleCapacity, WeightGroup
from orchestrator.profile.schema import Profile

# What is in use on each GPU before SGLang measures its baseline (the CUDA context, NCCL and
# custom all-reduce buffers) comes from the headroom model's "before-baseline" terms
# (planner/headroom.py); the CUDA context there is an unconfirmed estimate.
PRELOAD_NOTE = ("memory in use before SGLang's baseline (CUDA context, NCCL, custom all-reduce) "
                "is the headroom model's estimate; compare the engine log's 'Memory baseline "
                "taken' and 'max_total_num_tokens=' lines, or calibrate the host")

DEFAULT_MFS = 0.85  # used only when a profile sets mem_fraction_static to null (engine "auto")

_SPEC = {"none": None, "eagle": "EAGLE", "dspark": "DSPARK"}


def host_gpu(cat: Catalog, facts: Facts, dep: Deployment) -> tuple[list[Check], HostGpu | None]:
    """The GPU model the deployment runs on, from probed or declared facts."""
    used = sorted({g for r in dep.roles for g in r.gpus})
    present = [g for g in facts.gpus if g.index in used] or list(facts.gpus)
    if not present:
        return [check("host.no-gpus", "error", "no GPUs on the host",
                      f"host {facts.host} reports no GPUs", "check the inventory's gpus or the driver",
                      subject=facts.host)], None
    specs: dict[str, Gpu] = {}
    checks: list[Check] = []
    known: tuple[str, ...] = ()
    unknown: dict[str, list[int]] = {}  # one inventory typo names every GPU: report it once
    for g in present:
        try:
            specs[g.name] = cat.gpu(g.name)
        except UnknownCatalogEntry as exc:
            unknown.setdefault(g.name, []).append(g.index)
            known = exc.known
    for name, idx in unknown.items():
        which = f"GPU {idx[0]}" if len(idx) == 1 else f"GPUs {', '.join(map(str, idx))}"
        close = difflib.get_close_matches(name, known, n=1)
        checks.append(check(
            "host.gpu-unknown", "error", "GPU model not in the catalog",
            f"host {facts.host}: GPU model '{name}' ({which}) is not in the catalog",
            (f"did you mean '{close[0]}'? " if close else "")
            + "Set the inventory's gpus.model to a GPU id from `dsv4ctl catalog gpus`, or add the "
            "GPU to orchestrator/catalog/data/gpus.yaml with sources", subject=facts.host))
    if checks:
        return checks, None
    ids = sorted({s.id for s in specs.values()})
    if len(ids) > 1:
        checks.append(check(
            "host.gpu-mixed", "warning", "GPUs of different models",
            f"the deployment's GPUs are {', '.join(ids)}; the plan sizes every rank by the smallest",
            "use one GPU model per role", subject=facts.host))
    totals = []
    for g in present:
        spec = specs[g.name]
        totals.append((g.memory_mib << 20) if g.memory_mib else spec.memory_bytes)
    smallest = min(specs.values(), key=lambda s: s.memory_bytes)
    return checks, HostGpu(spec=smallest, total_bytes=min(totals), arch=smallest.arch)


def _kv_inputs(cat: Catalog, model: ModelVariant, dep: Deployment, role: RoleDeployment,
               engine: EngineRules) -> KVPoolInputs:
    cfg = cat.config_of(model)
    mrr = role.max_running_requests or int(
        engine.forced_for_v4["max_running_requests_when_unset"].value)
    return KVPoolInputs(
        num_hidden_layers=cfg.num_hidden_layers.value,
        compress_ratios=tuple(cfg.compress_ratios.value),
        qk_nope_head_dim=cfg.qk_nope_head_dim.value,
        qk_rope_head_dim=cfg.qk_rope_head_dim.value,
        index_head_dim=cfg.index_head_dim.value,
        sliding_window=cfg.sliding_window.value,
        kv_cache_dtype=dep.kv_cache_dtype,  # type: ignore[arg-type]
        fp4_indexer=dep.fp4_indexer,
        max_running_requests=mrr,
        attn_dp_size=role.attn_dp,
        speculative_algorithm=_SPEC[dep.speculative_algorithm],  # type: ignore[arg-type]
        # kvpool refuses draft sizes for an algorithm that does not use them
        speculative_num_draft_tokens=(dep.speculative_num_draft_tokens
                                      if dep.speculative_algorithm == "eagle" else None),
        dspark_block_size=(dep.speculative_dspark_block_size
                           if dep.speculative_algorithm == "dspark" else None),
        disaggregation_mode=role.disaggregation_mode or "null",
        context_length=dep.context_length,
    )


def plan_capacity(cat: Catalog, engine: EngineRules, model: ModelVariant, dep: Deployment,
                  profile: Profile, gpu: HostGpu, facts: Facts
                  ) -> tuple[list[RoleCapacity], list[GpuRow], list[Check]]:
    caps: list[RoleCapacity] = []
    rows: dict[int, GpuRow] = {}
    checks: list[Check] = []
    accepted_kv = engine.accepts("kv_cache_dtype", dep.kv_cache_dtype)
    for role in dep.roles:
        mfs = role.mem_fraction_static if role.mem_fraction_static is not None else DEFAULT_MFS
        notes = [PRELOAD_NOTE]
        if role.mem_fraction_static is None:
            notes.append(f"mem_fraction_static unset (engine picks); planned with {DEFAULT_MFS}")
        try:
            wb = cat.weight_bytes_per_rank(
                model, dep.expert_storage, role.tp, role.ep, role.attn_dp,
                include_mtp=dep.speculative_algorithm == "eagle",
                include_dspark=dep.speculative_algorithm == "dspark",
                engine=engine, gpu_arch=gpu.arch)
        except (UnsupportedLayout, UnknownCatalogData) as exc:
            checks.append(layout_check(role.name, exc))
            continue
        notes += list(wb.unconfirmed)
        static_budget = int(gpu.total_bytes * mfs)
        if wb.total_bytes > static_budget:
            need = wb.total_bytes / gpu.total_bytes
            checks.append(check(
                "capacity.weights", "error", "weights do not fit the GPU",
                f"role {role.name}: each of its {role.tp} GPUs must hold {gib(wb.total_bytes)} of "
                f"{dep.expert_storage} weights, but mem_fraction_static {mfs:.2f} of "
                f"{gib(gpu.total_bytes)} allows {gib(static_budget)}"
                + (f" ({need:.0%} of the GPU)" if need < 1 else " (more than the whole GPU)"),
                "spread the role over more GPUs (higher tp/ep), store experts in a smaller format "
                "(expert_storage: native keeps the checkpoint's fp4), or drop the PD split",
                field=f"topology.{role.name}.gpus", subject=role.name, weights_bytes=wb.total_bytes,
                budget_bytes=static_budget))
            caps.append(_cap(role, gpu, mfs, wb, None, notes))
            for g in role.gpus:
                rows[g] = GpuRow(index=g, role=role.name, model=gpu.spec.id, total_bytes=gpu.total_bytes,
                                 weights_bytes=wb.total_bytes, kv_bytes=0,
                                 headroom_bytes=max(0, gpu.total_bytes - wb.total_bytes),
                                 free_static_bytes=0)
            continue
        if not accepted_kv:
            continue  # engine_checks reports the dtype; the pool cannot be sized for it
        hx = outside.headroom_inputs(cat, engine, model, dep, role, profile, gpu, mfs)
        try:
            kvx = _kv_inputs(cat, model, dep, role, engine)

            meas = calibration.lookup(facts.calibration, role.name, dep.engine_version,
                                      dep.model_variant)
            unexplained = meas.unexplained_bytes if meas else 0

            def sized(m: float, hx: hr.HeadroomInputs = hx, kvx: KVPoolInputs = kvx,
                      wbytes: int = wb.total_bytes, tp: int = role.tp, u: int = unexplained
                      ) -> tuple[PoolSizing, hr.HeadroomModel]:
                # The calibration term is memory taken before KV profiling that the model does
                # not predict (u > 0), or room it did not expect (u < 0): it moves "avail".
                pre = hr.build(replace(hx, mem_fraction_static=m))
                s = size_pool(kvx, gpu.total_bytes, max(0, wbytes + min(u, 0)), m,
                              other_static_bytes=max(u, 0),
                              preload_used_bytes=pre.preload_bytes, world_size=tp)
                return s, hr.build(replace(hx, mem_fraction_static=m),
                                   max(0, s.headroom_bytes) if s.fits else None)

            sizing, hmodel = sized(mfs)
            model_tokens = sized(mfs, u=0)[0].max_total_num_tokens if meas else None
        except KVPoolError as exc:
            checks.append(check("capacity.kv-inputs", "error", "KV pool cannot be sized",
                                f"role {role.name}: {exc.message}", exc.fix,
                                field=f"topology.{role.name}", subject=role.name))
            continue
        notes += list(sizing.notes) + [f"headroom: the worst moment is {n}" for n in hmodel.notes]
        cal = None
        if meas is not None and model_tokens is not None:
            cal = outside.calibration_check(role, meas, model_tokens, sizing, facts.host,
                                            hmodel)
            checks.append(cal[1])
        caps.append(_cap(role, gpu, mfs, wb, sizing, notes, hmodel,
                         model_tokens if cal else None, cal[0] if cal else None,
                         unexplained if cal else 0))
        checks += _pool_checks(dep, profile, role, sizing, mfs, gpu)
        if sizing.fits:
            checks += outside.headroom_checks(role, sizing, hmodel, mfs, hx, sized)
        kv = sizing.pool_bytes.total if sizing.pool_bytes else 0
        for g in role.gpus:
            rows[g] = GpuRow(index=g, role=role.name, model=gpu.spec.id, total_bytes=gpu.total_bytes,
                             weights_bytes=wb.total_bytes, kv_bytes=kv,
                             headroom_bytes=max(0, sizing.headroom_bytes),
                             free_static_bytes=max(0, sizing.unused_budget_bytes),
                             preload_bytes=sizing.preload_used_bytes,
                             req_to_token_bytes=sizing.req_to_token_bytes)
    for g in facts.gpus:
        if g.index not in rows:
            rows[g.index] = GpuRow(index=g.index, role=None, model=gpu.spec.id,
                                   total_bytes=gpu.total_bytes, weights_bytes=0, kv_bytes=0,
                                   headroom_bytes=gpu.total_bytes, free_static_bytes=0)
    return caps, [rows[i] for i in sorted(rows)], checks


def _cap(role: RoleDeployment, gpu: HostGpu, mfs: float, wb: WeightBreakdown, sizing: PoolSizing | None,
         notes: list[str], hmodel: hr.HeadroomModel | None = None,
         model_tokens: int | None = None, calibrated: str | None = None,
         calibration_bytes: int = 0) -> RoleCapacity:
    groups = [WeightGroup(name=g.id, bytes=g.bytes_per_rank) for g in wb.groups]
    tokens = sizing.max_total_num_tokens if sizing else 0
    return RoleCapacity(
        role=role.name, gpu_model=gpu.spec.id, gpu_total_bytes=gpu.total_bytes, tp=role.tp,
        ep=role.ep, attn_dp=role.attn_dp, mem_fraction_static=mfs, weights_per_rank=groups,
        weights_per_rank_bytes=wb.total_bytes,
        static_budget_bytes=int(gpu.total_bytes * mfs),
        headroom_bytes=sizing.headroom_bytes if sizing else 0,
        kv_pool_bytes_per_rank=sizing.pool_bytes.total if sizing and sizing.pool_bytes else 0,
        bytes_per_token=sizing.bytes_per_full_token if sizing else 0.0,
        fixed_bytes_per_rank=sizing.fixed_bytes if sizing else 0,
        max_total_tokens_per_rank=tokens, token_capacity=tokens * role.attn_dp,
        max_running_requests=(sizing.max_running_requests * role.attn_dp) if sizing else 0,
        notes=sorted(set(notes)), **(_arithmetic(sizing) if sizing else {}),
        headroom_terms=[HeadroomTermRow(id=t.id, phase=t.phase, bytes=t.bytes, exact=t.exact,
                                        source=t.source, detail=t.detail)
                        for t in (hmodel.terms if hmodel else ())],
        headroom_need_bytes=hmodel.runtime_bytes if hmodel else 0,
        longest_request_tokens=hmodel.longest_request_tokens if hmodel else 0,
        chunked_prefill_size=hmodel.chunked_prefill_size if hmodel else 0,
        model_tokens_per_rank=model_tokens if model_tokens is not None else tokens,
        calibration_bytes=calibration_bytes, calibrated=calibrated)


def _arithmetic(s: PoolSizing) -> dict[str, object]:
    """The terms `plan --explain` shows, from the sizing that produced the numbers."""
    pools = s.pool_bytes.as_dict() if s.pool_bytes else {}
    return dict(
        preload_bytes=s.preload_used_bytes, req_to_token_bytes=s.req_to_token_bytes,
        kv_budget_bytes=s.budget_bytes, slack_bytes=s.slack_bytes,
        kv_unused_bytes=s.unused_budget_bytes,
        kv_pools={k: v for k, v in pools.items() if v or k != "draft_swa_kv"},
        kv_tokens={"full": s.full_tokens, "swa": s.swa_tokens, "c4": s.c4_tokens,
                   "c128": s.c128_tokens, "c4_state_slots": s.c4_state_slots,
                   "c128_state_slots": s.c128_state_slots} if s.fits else {},
        bytes_per_token_terms=dict(s.bytes_per_token_terms), page_size=s.page_size)


def _pool_checks(dep: Deployment, profile: Profile, role: RoleDeployment, s: PoolSizing, mfs: float,
                 gpu: HostGpu) -> list[Check]:
    out: list[Check] = []
    if not s.fits:
        hint = (f"raise mem_fraction_static to at least {s.min_mem_fraction_static:.2f}, "
                if s.min_mem_fraction_static else "")
        out.append(check(
            "capacity.kv-pool", "error", "no room for the KV cache",
            f"role {role.name}: SGLang would refuse to start: {s.failure}",
            hint + "use more GPUs per role, or smaller expert storage",
            field="serving.mem_fraction_static", subject=role.name))
        return out
    if s.max_total_num_tokens < dep.context_length:
        out.append(check(
            "capacity.context", "error", "one full-length request does not fit the KV pool",
            f"role {role.name}: context_length {dep.context_length:,} tokens, but each rank's pool "
            f"holds {s.max_total_num_tokens:,} tokens ({s.bytes_per_full_token:,.0f} B per token)",
            f"lower attention.context_length to at most {s.max_total_num_tokens:,}, raise "
            "mem_fraction_static, or give the role more memory (more GPUs, smaller expert storage)",
            field="attention.context_length", subject=role.name,
            pool_tokens=s.max_total_num_tokens, context_length=dep.context_length))
    if role.disaggregation_mode != "prefill":
        w = profile.workload
        need = w.concurrent_requests * w.context_tokens
        have = s.max_total_num_tokens * role.attn_dp
        if need > have:
            fit = have // max(1, w.context_tokens)
            out.append(check(
                "capacity.workload", "warning", "the workload does not fit in the KV cache at once",
                f"role {role.name}: {w.concurrent_requests} requests x {w.context_tokens:,} tokens = "
                f"{need:,} tokens, but the pool holds {have:,}; about {fit} such requests run at "
                "once, the rest queue",
                "lower workload.concurrent_requests or context_tokens, raise mem_fraction_static, "
                "or add GPUs to this role",
                field="workload.concurrent_requests", subject=role.name, need_tokens=need, pool_tokens=have))
        if s.max_running_requests * role.attn_dp < w.concurrent_requests:
            out.append(check(
                "capacity.max-running", "warning", "max_running_requests below the workload",
                f"role {role.name}: the engine runs at most {s.max_running_requests * role.attn_dp} "
                f"requests at once; workload.concurrent_requests is {w.concurrent_requests}",
                f"set serving.max_running_requests to {w.concurrent_requests} or more",
                field="serving.max_running_requests", subject=role.name))
    return out
