"""Which path each hooked op runs, per role: SGLang's own or the bundled kernel. One owner.

The bundled kernels (``kernels/dsv4_kernels``) can replace three SGLang 0.5.23 entry points on
sm_120: sparse-MLA attention, the indexer's paged MQA logits and the mHC pre GEMM. For each role
and op, :func:`decide` turns the profile's choice (``kernels.<op>``: auto, engine or bundled), the
catalog's ``kernel_paths`` (what the engine runs there, its limits with their sources), the GPU
and the host's stored ``dsv4ctl qualify kernels`` measurement into one :class:`OpPath`. ``auto``
keeps the engine's path unless

1. the role puts the op outside what that path supports (a catalog limit, e.g. FlashInfer's
   8-heads-per-rank prefill abort);
2. a measurement of this host, engine version, GPU and role shape says the bundled kernel is
   faster at every measured shape;
3. the engine has no tensor-core path for the op on that GPU (the FP32 mHC boundary on sm_120).

Render writes the env from the result (``render.engine_env``), the headroom model and the
known-bad rules read that env, and plan/explain/diff/history show the same values: nobody
re-derives a path. Pure: no host, no clock; the measurement comes in as a fact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from orchestrator.deployment import Deployment, KernelPath, OpPath, RoleDeployment
from orchestrator.facts import KernelQualification, KernelTiming

if TYPE_CHECKING:
    from orchestrator.catalog import EngineRules

OPS = ("attention", "indexer", "mhc_pre")
Path = KernelPath  # what runs an op: the engine's own kernel or the bundled one
__all__ = ["OpPath"]  # owned by orchestrator.deployment (a Deployment carries it)
BUNDLED = "bundled"  # the bundled kernel's name in a qualify fact


def role_shape(dep: Deployment, role: RoleDeployment, heads_total: int) -> dict[str, int]:
    """The shapes a role runs the hooked ops at: what a qualify measurement must match."""
    attn_tp = max(1, role.tp // max(1, role.attn_dp))
    return {
        "heads_per_attn_rank": heads_total // attn_tp,
        "attn_tp": attn_tp,
        "index_topk": dep.index_topk,
        "cuda_graph_max_bs": int(role.cuda_graph_max_bs or 0),
        "chunked_prefill_size": int(role.chunked_prefill_size or 0),
        "context_tokens": dep.context_length,
        "prefill": 0 if role.disaggregation_mode == "decode" else 1,
    }


def rows_per_call(dep: Deployment, role: RoleDeployment) -> int | None:
    """The most query rows one attention call of this role may get (None: unbounded)."""
    drafts = 1
    if dep.speculative_algorithm == "eagle":
        drafts = dep.speculative_num_draft_tokens or 1
    elif dep.speculative_algorithm == "dspark":
        drafts = (dep.speculative_dspark_block_size or 0) + 1
    if role.disaggregation_mode == "decode":
        reqs = role.max_running_requests
        return None if reqs is None else (reqs // max(1, role.attn_dp) or 1) * drafts
    chunk = role.chunked_prefill_size
    return None if chunk is None or chunk <= 0 else chunk


def _fmt_us(t: KernelTiming) -> str:
    return f"{t.contender} {t.us:.1f} us"


def _compare(op: str, engine_name: str, m: KernelQualification) -> tuple[Path | None, str]:
    """(the faster path, the sentence citing it) from a matching measurement, or (None, why it
    cannot decide)."""
    rows = [t for t in m.timings if t.op == op]
    shapes = sorted({t.shape for t in rows}, key=lambda s: [t.shape for t in rows].index(s))
    if not shapes:
        return None, f"the measurement of {m.host} ({m.measured_at[:10]}) has no {op} timings"
    wins: list[tuple[str, KernelTiming, KernelTiming]] = []
    for shape in shapes:
        eng = next((t for t in rows if t.shape == shape and t.contender == engine_name), None)
        ours = next((t for t in rows if t.shape == shape and t.contender == BUNDLED), None)
        for who, t in ((engine_name, eng), (BUNDLED, ours)):
            if t is None or t.status != "ok" or t.us is None:
                state = "not measured" if t is None else t.status
                detail = f": {t.detail}" if t is not None and t.detail else ""
                return None, (f"measured on {m.host} {m.measured_at[:10]}: {who} {state} at "
                              f"{shape}{detail}, so the measurement cannot decide")
        assert eng is not None and ours is not None
        wins.append((shape, eng, ours))
    faster = all(o.us < e.us for _, e, o in wins)  # type: ignore[operator]
    shape, eng, ours = wins[-1]  # the largest shape the runner measured last
    others = "" if len(wins) == 1 else (
        f"; bundled faster at {sum(o.us < e.us for _, e, o in wins)} of "  # type: ignore[operator]
        f"{len(wins)} shapes")
    path: Path = BUNDLED if faster else "engine"
    return path, (f"measured on {m.host} {m.measured_at[:10]}: {_fmt_us(eng)}, "
                  f"{_fmt_us(ours)} at {shape}{others}, so {path}")


def measurement_for(measurements: Iterable[KernelQualification], dep: Deployment,
                    role: RoleDeployment, gpu_names: Sequence[str], heads_total: int
                    ) -> tuple[KernelQualification | None, str | None]:
    """The host's newest measurement for this role if it applies, else (None, why it is ignored;
    None when there is none)."""
    found = sorted((m for m in measurements if m.role == role.name),
                   key=lambda m: m.measured_at)
    if not found:
        return None, None
    m = found[-1]
    want = role_shape(dep, role, heads_total)
    where = f"the kernel measurement of {m.host} ({m.measured_at[:10]})"
    if m.engine_version != dep.engine_version:
        return None, (f"{where} is for sglang {m.engine_version}, this profile runs "
                      f"{dep.engine_version}: ignored; re-run `dsv4ctl qualify kernels`")
    if gpu_names and m.gpu not in gpu_names:
        return None, (f"{where} was taken on {m.gpu}, this role runs on {', '.join(gpu_names)}: "
                      "ignored; re-run `dsv4ctl qualify kernels`")
    if m.shape != want:
        diff = ", ".join(f"{k} {m.shape.get(k)} -> {v}" for k, v in want.items()
                         if m.shape.get(k) != v)
        return None, (f"{where} is for another shape of this role ({diff}): ignored; re-run "
                      "`dsv4ctl qualify kernels`")
    return m, None


def decide_role(engine: EngineRules, dep: Deployment, role: RoleDeployment, arch: str | None,
                heads_total: int, choices: dict[str, str],
                measurement: KernelQualification | None = None, ignored: str | None = None
                ) -> tuple[OpPath, ...]:
    """The path of each op for one role (see the module docstring for the rule)."""
    rules = engine.kernel_paths
    tool = f"{engine.engine} {engine.version}"
    shape = role_shape(dep, role, heads_total)
    facts: dict[str, object] = {**shape, "arch": arch or "unknown",
                                "kv_cache_dtype": dep.kv_cache_dtype,
                                "fp4_indexer": dep.fp4_indexer}
    rows = rows_per_call(dep, role)
    facts["rows_per_call"] = rows if rows is not None else 1 << 30
    out = []
    for op in OPS:
        spec = rules.ops[op]
        choice = choices.get(op, "auto")
        env = tuple(sorted(spec.bundled_env.items()))

        # a role's own env may steer SGLang itself (e.g. SGLANG_SM120_FLASHMLA_BACKEND=torch);
        # on the engine's path that is what runs, and the plan says so
        own = [f"{k}={v}" for k, v in role.env if k in spec.bundled_env]
        engine_runs = (f"SGLang as the role's env sets it ({', '.join(own)})" if own
                       else spec.engine)

        def made(path: Path, why: str, source: str, measured: str | None = None,
                 spec=spec, env=env, op=op, choice=choice, engine_runs=engine_runs) -> OpPath:
            return OpPath(op=op, choice=choice, path=path,
                          runs=spec.bundled if path == BUNDLED else engine_runs,
                          why=why, source=source, env=env if path == BUNDLED else (),
                          measured=measured)

        if arch not in rules.archs:
            gpu = arch or "an unknown GPU"
            why = (f"{tool} reaches the entry points the bundled kernels replace only on "
                   f"{', '.join(rules.archs)}; on {gpu} the engine's own path runs")
            if choice == BUNDLED:
                why = f"kernels.{op}: bundled has no effect here: " + why
            out.append(made("engine", why, rules.source).model_copy(
                update={"runs": f"{tool}'s own path on {gpu}"}))
            continue
        limit = next((lim for lim in rules.limits if lim.op == op and lim.matches(facts)), None)
        if choice == "engine":
            why = "kernels." + op + ": engine (the profile's choice)"
            if limit is not None:
                why += f"; outside what it supports: {limit.title} [{limit.confidence}]"
            out.append(made("engine", why, limit.source if limit else spec.source, ignored))
            continue
        if choice == BUNDLED:
            out.append(made(BUNDLED, f"kernels.{op}: bundled (the profile's choice)",
                            spec.source, ignored))
            continue
        if limit is not None:
            out.append(made(BUNDLED, f"the engine's path cannot serve this role: {limit.title} "
                            f"[{limit.confidence}; {limit.upstream[0]}]",
                            f"{limit.source}; {limit.upstream[0]}", ignored))
            continue
        measured, sentence = (None, ignored)
        if measurement is not None:
            measured, sentence = _compare(op, spec.engine_contender, measurement)
        if measured is not None:
            out.append(made(measured, sentence or "", "dsv4ctl qualify kernels (stored on the "
                            "host: kernels-qualification.json)", sentence))
            continue
        if not spec.engine_tensor_cores:
            out.append(made(BUNDLED, f"the engine has no tensor-core path for it on {arch}",
                            spec.source, sentence))
            continue
        out.append(made("engine", f"default: {tool}'s own path", spec.source, sentence))
    return tuple(out)


def decide(engine: EngineRules, dep: Deployment, arch: str | None, heads_total: int,
           choices: dict[str, str], measurements: Iterable[KernelQualification] = (),
           gpu_names: Sequence[str] = ()) -> Deployment:
    """``dep`` with every role's op paths decided (what render and plan read)."""
    measurements = list(measurements)
    roles = []
    for role in dep.roles:
        m, ignored = measurement_for(measurements, dep, role, gpu_names, heads_total)
        paths = decide_role(engine, dep, role, arch, heads_total, choices, m, ignored)
        roles.append(role.model_copy(update={"kernels": paths}))
    return dep.model_copy(update={"roles": tuple(roles)})


def with_planned_paths(engine: EngineRules, dep: Deployment, planned: Deployment) -> Deployment:
    """``dep`` with the kernel paths of a saved plan's deployment, where each is a path this
    catalog renders (the op known, the env exactly the catalog's for a bundled op); a role whose
    planned paths are not keeps its own, so the comparison that follows calls the plan stale."""
    theirs = {r.name: r.kernels for r in planned.roles}
    roles = []
    for role in dep.roles:
        paths = theirs.get(role.name, ())
        ok = [p.op for p in paths] == list(OPS) and all(
            p.env == (tuple(sorted(engine.kernel_paths.ops[p.op].bundled_env.items()))
                      if p.path == BUNDLED else ()) for p in paths)
        roles.append(role.model_copy(update={"kernels": paths}) if ok else role)
    return dep.model_copy(update={"roles": tuple(roles)})


def bundled_ops(role: RoleDeployment) -> list[str]:
    return [p.op for p in role.kernels if p.path == BUNDLED]


def served_by(role: RoleDeployment) -> dict[str, str]:
    """``{op: engine|bundled}``: what a release record keeps of the decision (``history``)."""
    return {p.op: p.path for p in role.kernels}
