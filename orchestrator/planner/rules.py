"""Engine rules: what the pinned SGLang version accepts, decides by itself, and is known to get wrong.

Everything here reads the catalog's entry for the profile's engine *version* (accepted values,
MoE runner dispatch per checkpoint format and GPU architecture, known-bad combinations with their
upstream links) and the pinned flag table; nothing is hard-coded for one engine release. Pure.
"""

from __future__ import annotations

import shlex

from orchestrator.catalog import Catalog, EngineRules, ModelVariant
from orchestrator.catalog.flags import (
    FlagProblem,
    FlagTable,
    UnknownFlagTableError,
    load_flag_table,
)
from orchestrator.deployment import Deployment
from orchestrator.errors import DsvError, closest, did_you_mean, remove, set_to
from orchestrator.planner.capacity import HostGpu
from orchestrator.planner.checks import check
from orchestrator.planner.kvpool import cuda_kv_dtype_refusal
from orchestrator.planner_model import Check
from orchestrator.profile.inventory import Host
from orchestrator.profile.schema import Profile

# Beyond this many tokens, index_topk 512 lost long-context recall on the operator's deployment
# (design.md: "recall failed beyond ~2-4K tokens until index_topk went from 512 to 1024").
LONG_CONTEXT_TOKENS = 4096

_SPEC = {"eagle": "EAGLE", "dspark": "DSPARK"}

# The deployment values checked against the engine's `accepted` table: (knob, the profile field
# that sets it, its label). Each is the rule engine.<knob> (static.rule_ids lists them).
ACCEPTED = (("index_topk", "attention.index_topk", "index_topk"),
            ("kv_cache_dtype", "attention.kv_cache_dtype", "KV cache dtype"))


def _accepted(engine: EngineRules, knob: str, value: object, field: str, label: str) -> list[Check]:
    spec = engine.accepted[knob]
    # a fix names only values that start: the V4 argument check accepts bfloat16, the CUDA pool
    # does not (kvpool.cuda_kv_dtype_refusal)
    starts = [v for v in spec.values
              if knob != "kv_cache_dtype" or cuda_kv_dtype_refusal(str(v)) is None]
    # the value the fix sets: the one meant (spelling, nearest number), else the first that starts
    meant = closest(value, starts)
    change = [set_to(field, meant if meant is not None else starts[0])] if starts else []
    if value in spec.values:
        refusal = cuda_kv_dtype_refusal(str(value)) if knob == "kv_cache_dtype" else None
        if refusal is None:
            return []
        return [check(f"engine.{knob.replace('_', '-')}", "error",
                      f"{label} cannot start on CUDA", f"{field} = {value}: {refusal[0]}",
                      None if change else refusal[1], subject=field, field=field,
                      source="planner/kvpool.py (sglang 0.5.23 deepseek_v4_memory_pool.py)",
                      change=change)]
    allowed = ", ".join(str(v) for v in spec.values)
    then = f" (values that start: {', '.join(str(v) for v in starts)})"
    if knob == "kv_cache_dtype" and value == "bf16":
        then = (" (SGLang 0.5.23 does not normalise 'bf16' on the DeepSeek-V4 path, and its "
                "'bfloat16' has no V4 KV pool on CUDA)")
    return [check(f"engine.{knob.replace('_', '-')}", "error", f"{label} not accepted by the engine",
                  f"{field} = {value}: {engine.engine} {engine.version} accepts only {allowed}"
                  + (f" ({spec.note})" if spec.note else ""),
                  then if change else did_you_mean(value, starts, what="values that start"),
                  subject=field, field=field, source=spec.source, change=change)]


def engine_checks(cat: Catalog, engine: EngineRules, model: ModelVariant, dep: Deployment,
                  profile: Profile) -> list[Check]:
    """What the pinned engine accepts, decided from the profile alone (no GPU, no host): the part of
    the engine rules `dsv4ctl validate` reports as well as `plan`."""
    cfg = cat.config_of(model)
    out: list[Check] = []
    for knob, field, label in ACCEPTED:
        out += _accepted(engine, knob, getattr(dep, knob), field, label)
    max_ctx = cfg.max_position_embeddings.value
    if dep.context_length > max_ctx:
        out.append(check(
            "engine.context-length", "error", "context longer than the model supports",
            f"attention.context_length = {dep.context_length:,} exceeds the model's "
            f"max_position_embeddings {max_ctx:,}", " (the model's longest), or less",
            subject="attention.context_length", field="attention.context_length",
            source=cfg.max_position_embeddings.source,
            change=[set_to("attention.context_length", max_ctx)]))
    out += _speculative(engine, model, dep)
    out += _trust_remote_code(engine, dep)
    out += _legacy_kernel_keys(profile)
    # a field the engine rules already reject is not reported again as a flag of each command line
    reported = {c.field for c in out if c.severity == "error"}
    out += [c for c in _flags(dep, profile) if c.field not in reported]
    return out


def gpu_engine_checks(cat: Catalog, engine: EngineRules, model: ModelVariant, dep: Deployment,
                      gpu: HostGpu, host: Host, static: list[Check]) -> list[Check]:
    """The engine rules that depend on the host's GPU architecture (MoE kernel path, known-bad
    combinations). ``static``: the profile-only checks, so a runner the engine rejects outright is
    reported once (as that flag error), not again as an unknown kernel path."""
    rejected = any(c.id == "engine.flag-invalid-choice" and c.field == "moe.runner_backend"
                   for c in static)
    out = [] if rejected else _moe_path(cat, engine, model, dep, gpu)
    bad = _known_bad(cat, engine, model, dep, gpu, host)
    if rejected or any(c.severity == "error" and c.field == "moe.runner_backend" for c in out):
        # one mistake, one error: a known-bad entry about the runner choice says again what the
        # runner's own error (or the flag error) already says, with a less precise fix
        runner_rules = {f"known-bad.{kb.id}" for kb in engine.known_bad
                        if "moe_runner" in kb.when or "moe_runner_not" in kb.when}
        bad = [c for c in bad if c.id not in runner_rules]
    return out + _kernel_paths(dep, gpu) + bad


def _kernel_paths(dep: Deployment, gpu: HostGpu) -> list[Check]:
    """What the kernel-path decision (orchestrator/kernel_paths.py, made before these checks)
    asks the operator to know: an op kept on the engine's path outside what it supports, a
    bundled choice with no effect on this GPU, a stored measurement that does not apply."""
    out: list[Check] = []
    seen: set[tuple[str, str]] = set()
    for role in dep.roles:
        for p in role.kernels:
            field = f"kernels.{p.op}"
            if p.choice == "engine" and "outside what it supports" in p.why:
                out.append(check(
                    "kernels.engine-path-unsupported", "warning",
                    f"{p.op} kept on the engine's path where it fails",
                    f"{role.name}: {p.why}", " (the bundled kernel serves it), or set attn_dp "
                    "equal to tp on the role so each rank keeps 64 heads",
                    subject=f"{role.name}.{p.op}", field=field, source=p.source,
                    change=[set_to(field, "auto")]))
            if p.choice == "bundled" and p.path == "engine":
                out.append(check(
                    "kernels.bundled-no-effect", "warning", f"kernels.{p.op}: bundled does nothing "
                    f"on {gpu.arch}", f"{role.name}: {p.why}", None,
                    subject=f"{role.name}.{p.op}", field=field, source=p.source,
                    change=[set_to(field, "auto")]))
            if p.measured and "ignored" in p.measured and (role.name, "m") not in seen:
                seen.add((role.name, "m"))
                out.append(check(
                    "kernels.measurement-ignored", "warning",
                    "the stored kernel measurement does not apply", f"{role.name}: {p.measured}",
                    f"run `dsv4ctl qualify kernels --host {shlex.quote(dep.host)}` with this "
                    "profile",
                    subject=role.name, field="kernels",
                    source="dsv4ctl qualify kernels (kernels-qualification.json on the host)"))
    return out


def _legacy_kernel_keys(profile: Profile) -> list[Check]:
    from orchestrator.profile.schema import LEGACY_KERNEL_KEYS

    out = []
    for key, value in profile.kernels.legacy_keys.items():
        mapped = LEGACY_KERNEL_KEYS[(key, value)]
        now = ", ".join(f"kernels.{op}: {c}" for op, c in mapped.items()) or "auto for every op"
        out.append(check(
            "kernels.deprecated-key", "warning", f"kernels.{key} is replaced by per-op choices",
            f"kernels.{key}: {str(value).lower()} is read as {now}. "
            + ("It no longer forces the bundled kernels: auto keeps SGLang's own path unless the "
               "bundled one is needed or measured faster (`dsv4ctl plan --explain` says which)"
               if value else "The engine's own path runs for "
               + ("every op" if key == "enabled" else "the mHC pre GEMM")),
            "" if mapped else " (auto, the default, for every op)",
            subject=f"kernels.{key}", field=f"kernels.{key}",
            source="orchestrator/profile/schema.py LEGACY_KERNEL_KEYS",
            change=[remove(f"kernels.{key}"),
                    *(set_to(f"kernels.{op}", c) for op, c in mapped.items())]))
    return out


def _trust_remote_code(engine: EngineRules, dep: Deployment) -> list[Check]:
    """--trust-remote-code lets the checkpoint directory run Python as the engine: say whether
    this checkpoint needs it, and refuse to start without it when it does."""
    need = engine.trust_remote_code_needed
    tool = f"{engine.engine} {engine.version}"
    if need.value and not dep.trust_remote_code:
        return [check("model.trust-remote-code", "error", "the checkpoint needs remote code",
                      f"{tool} loads DeepSeek-V4 only with --trust-remote-code, and "
                      "model.trust_remote_code is false", " if you trust the checkpoint's Python "
                      "files", subject="model.trust_remote_code",
                      field="model.trust_remote_code", source=need.source,
                      change=[set_to("model.trust_remote_code", True)])]
    if dep.trust_remote_code and not need.value:
        return [check("model.trust-remote-code", "warning", "remote code enabled but not needed",
                      f"model.trust_remote_code is true: the engine runs Python files from "
                      f"{dep.model_path}, which {tool} does not need for DeepSeek-V4 "
                      f"({need.confidence})", " unless this checkpoint ships code it needs",
                      subject="model.trust_remote_code", field="model.trust_remote_code",
                      source=need.source, change=[set_to("model.trust_remote_code", False)])]
    state = "on" if dep.trust_remote_code else "off"
    return [check("model.trust-remote-code", "info", "remote code",
                  f"--trust-remote-code is {state}; {tool} "
                  f"{'needs' if need.value else 'does not need'} it for DeepSeek-V4 "
                  f"({need.confidence})", subject="model.trust_remote_code",
                  field="model.trust_remote_code", source=need.source)]


def _speculative(engine: EngineRules, model: ModelVariant, dep: Deployment) -> list[Check]:
    algo = dep.speculative_algorithm
    if algo == "none":
        return []
    rule = next((r for r in engine.speculative if r.algorithm == _SPEC[algo]), None)
    if rule is None:
        return [check("engine.speculative", "error", "speculative algorithm not supported",
                      f"speculative.algorithm = {algo} is not allowed for DeepSeek-V4 by "
                      f"{engine.engine} {engine.version}", ", or an algorithm the engine allows",
                      subject="speculative.algorithm", field="speculative.algorithm",
                      change=[set_to("speculative.algorithm", "none")])]
    if rule.requires_module and rule.requires_module not in model.modules:
        return [check("engine.speculative", "error", "the checkpoint lacks the draft module",
                      f"speculative.algorithm = {algo} needs the {rule.requires_module} module, which "
                      f"{model.id} does not ship (modules: {', '.join(model.modules)})",
                      " (MTP) with this checkpoint, or use a checkpoint that ships DSpark "
                      "(dsv4-flash-0731-mxfp4)", subject="speculative.algorithm",
                      field="speculative.algorithm", source=rule.source,
                      change=[set_to("speculative.algorithm", "eagle")])]
    return []


def _moe_path(cat: Catalog, engine: EngineRules, model: ModelVariant, dep: Deployment,
              gpu: HostGpu) -> list[Check]:
    fmt = model.expert_format
    requested = dep.moe_runner_backend
    rules = engine.moe_runner_rules(fmt, gpu.arch)
    if dep.expert_storage != "native":
        rule = next((r for r in rules if r.requires_expert_storage == dep.expert_storage), None)
    elif requested == "auto":
        rule = engine.default_moe_runner(fmt, gpu.arch)
    else:
        rule = engine.moe_runner(fmt, gpu.arch, requested)
    label = f"{fmt} experts on {gpu.arch} ({gpu.spec.id})"
    if rule is None:
        what = "auto" if requested == "auto" else requested
        return [check(
            "engine.moe-runner-unknown", "warning", "MoE kernel path not in the catalog",
            f"moe.runner_backend = {what} with {label} and expert_storage {dep.expert_storage}: the "
            f"catalog does not know which kernel {engine.engine} {engine.version} runs, so its speed "
            "and correctness are unverified",
            "pick a runner the catalog lists for this format and GPU (see the plan's other "
            "checks), or verify on the host and add it to the catalog", subject="moe.runner_backend",
            field="moe.runner_backend")]
    resolved = f"auto resolves to {rule.runner}" if requested == "auto" else f"runner {rule.runner}"
    cost = engine.moe_path_cost.get(rule.path_kind)
    cost_text = ""
    if cost is not None:
        v = cost.decode_time_fraction.value
        cost_text = (f"; expected MoE share of decode time ~{v[0]:.0%}-{v[1]:.0%}"
                     if isinstance(v, list) else f"; expected MoE share of decode time ~{v:.0%}")
    note = f" ({rule.note})" if rule.note else ""
    conf = "" if rule.confidence != "unconfirmed" else " [unconfirmed]"
    if rule.path_kind == "unavailable":
        alt = [r.runner for r in rules if r.path_kind == "tensor_core"]
        return [check(
            "engine.moe-runner-unavailable", "error", "MoE runner cannot run on this GPU",
            f"{label}: {resolved} ({rule.method}), which does not run on {gpu.arch}{note}{conf}",
            None if alt else "choose a checkpoint format this GPU runs",
            subject="moe.runner_backend", field="moe.runner_backend", source=rule.source,
            change=[set_to("moe.runner_backend", alt[0])] if alt else [])]
    if rule.path_kind == "dequant_fallback":
        alt = [r.runner for r in rules if r.path_kind == "tensor_core" and r.requires_expert_storage is None]
        return [check(
            "engine.moe-runner-fallback", "warning", "MoE runs on a dequantizing fallback",
            f"{label}: {resolved} ({rule.method}), a CUDA-core dequant path{cost_text}{note}{conf}",
            " (tensor cores)" if alt else
            "use a checkpoint format with a tensor-core path on this GPU",
            subject="moe.runner_backend", field="moe.runner_backend", source=rule.source,
            change=[set_to("moe.runner_backend", alt[0])] if alt else [])]
    return [check(
        "engine.moe-runner", "info", "MoE kernel path",
        f"{label}: {resolved} ({rule.method}), tensor cores{cost_text}{conf}", None,
        subject="moe.runner_backend", field="moe.runner_backend", source=rule.source)]


def _known_bad(cat: Catalog, engine: EngineRules, model: ModelVariant, dep: Deployment, gpu: HostGpu,
               host: Host) -> list[Check]:
    cfg = cat.config_of(model)
    heads = cfg.num_attention_heads.value
    out: list[Check] = []
    seen: set[str] = set()
    for role in dep.roles:
        attn_tp = max(1, role.tp // max(1, role.attn_dp))
        facts: dict[str, object] = {
            "arch": gpu.arch,
            "expert_format": model.expert_format,
            "moe_runner": dep.moe_runner_backend,
            "expert_storage": dep.expert_storage,
            "heads_per_attn_rank": heads // attn_tp,
            # what the role's engine really gets: render sets triton where the role's attention
            # takes the bundled path (orchestrator/kernel_paths.py); otherwise the role's env,
            # else SGLang's default
            "sm120_flashmla_backend": "triton" if any(
                p.op == "attention" and p.path == "bundled" for p in role.kernels) else
            dict(role.env).get("SGLANG_SM120_FLASHMLA_BACKEND", "auto"),
            "dsv4_attn_backend": "auto",
            "index_topk": dep.index_topk,
            "long_context": dep.context_length > LONG_CONTEXT_TOKENS,
            "host_has_rdma": host.rdma,
        }
        if dep.transfer_backend is not None:
            facts["pd_transfer_backend"] = dep.transfer_backend
        for kb in engine.known_bad_matching(facts):
            if kb.id in seen:
                continue
            seen.add(kb.id)
            conf = f" [{kb.confidence}]" if kb.confidence == "unconfirmed" else ""
            note = f" ({kb.note})" if kb.note else ""
            out.append(check(
                f"known-bad.{kb.id}", kb.severity, kb.title,
                f"{kb.title}{conf}; applies to role {role.name}{note}", kb.fix,
                subject=role.name, field=f"topology.{role.name}", source=" ".join(kb.upstream),
                change=[set_to(k, v) for k, v in (kb.change or {}).items()]))
    return out


def _flags(dep: Deployment, profile: Profile) -> list[Check]:
    """Every rendered engine/router command line against the pinned version's flag table."""
    from orchestrator.render.argv import engine_argv, reserved_in_extra_args, router_argv

    out: list[Check] = []
    try:
        table = load_flag_table(dep.engine_name, dep.engine_version)
    except UnknownFlagTableError as exc:
        return [check("engine.flag-table", "error", "no flag table for this engine version",
                      exc.message, exc.fix, subject="engine.version", field="engine.version")]
    lines: list[tuple[str, list[str], FlagTable]] = []
    try:
        lines += [(r.name, engine_argv(dep, r), table) for r in dep.roles]
        if dep.router is not None:
            rtable = load_flag_table("sglang-router", dep.router_version)
            from orchestrator.render import ROUTER_WORKER_WAIT_S

            argv = router_argv(dep, worker_startup_timeout_s=ROUTER_WORKER_WAIT_S)
            lines.append(("router", argv, rtable))
    except UnknownFlagTableError as exc:
        return [check("engine.flag-table", "error", "no flag table for the router version",
                      exc.message, exc.fix, subject="engine.router_version",
                      field="engine.router_version")]
    except DsvError as exc:
        return [check("engine.render", "error", "command line cannot be rendered", exc.message,
                      exc.fix, subject="engine", field="engine")]
    for r in dep.roles:
        for i, word, instead in reserved_in_extra_args(table, r):
            out.append(check("engine.flag-reserved", "error", "extra_args overrides a rendered flag",
                             f"role {r.name}: extra_args[{i}] = '{word}' would override what "
                             f"dsv4ctl renders (argparse keeps the last value)", instead,
                             subject=f"topology.{r.name}.extra_args",
                             field=f"topology.{r.name}.extra_args.{i}"))
    # one problem of a profile-wide field shows in every role's command line: report it once
    grouped: dict[tuple[str, str, str, str, str], tuple[list[str], FlagProblem]] = {}
    for role, argv, tbl in lines:
        for p in tbl.check(argv):
            sev = "error" if p.severity == "error" else "warning"
            grouped.setdefault((p.kind, sev, p.message, p.fix, p.option or ""),
                               ([], p))[0].append(role)
    for (kind, sev, message, fix, option), (roles, problem) in grouped.items():
        field = FLAG_FIELDS.get(option) or f"topology.{roles[0]}"
        who = "role" if len(roles) == 1 else "roles"
        # a rendered flag's value outside its choices is its profile field's: the fix sets the
        # choice the value was meant to be
        meant = (closest(problem.value, problem.choices)
                 if kind == "invalid_choice" and option in FLAG_FIELDS else None)
        out.append(check(f"engine.flag-{kind.replace('_', '-')}", sev, "command line flag problem",
                         f"{who} {', '.join(roles)}: {message}",
                         f" (of {len(problem.choices)} choices)" if meant is not None else fix,
                         subject=roles[0], field=field,
                         change=[set_to(field, meant)] if meant is not None else []))
    return out


def router_flag_checks(dep: Deployment, profile: Profile) -> list[Check]:
    """The router's command line of a fleet (issue 23: regular mode or PD over every host) against
    the pinned router's flag table: the profile's static checks see only the fleet of one."""
    if dep.router is None:
        return []
    return [c for c in _flags(dep.model_copy(update={"roles": ()}), profile)
            if c.subject == "router" or c.id == "engine.flag-table"]


# The profile field behind an engine flag, so a flag problem points at what the operator wrote.
FLAG_FIELDS = {
    "--moe-runner-backend": "moe.runner_backend", "--kv-cache-dtype": "attention.kv_cache_dtype",
    "--context-length": "attention.context_length", "--model-path": "model.path",
    "--served-model-name": "model.served_name", "--speculative-algorithm": "speculative.algorithm",
    "--speculative-num-steps": "speculative.num_steps",
    "--speculative-num-draft-tokens": "speculative.num_draft_tokens",
    "--speculative-dspark-block-size": "speculative.dspark_block_size",
    "--disaggregation-transfer-backend": "topology.transfer_backend",
    "--policy": "topology.router.policy", "--watchdog-timeout": "serving.watchdog_timeout_s",
}
