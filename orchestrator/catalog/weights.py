"""Weight-byte arithmetic: checkpoint totals and per-rank bytes under SGLang's sharding rules.

Pure functions over the catalog models. Parameter counts come from the architecture's groups
(exact, derived from shapes), bytes/param from the quant formats (exact fractions), and the
per-group sharding rule from SGLang 0.5.23's model code (see ``data/models.yaml``). Any case
the data cannot answer (a module the checkpoint lacks, a conversion of the DSpark module whose
composition is unknown, a layout SGLang cannot shard) raises a typed error instead of guessing.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Protocol

from orchestrator.catalog.errors import UnknownCatalogData, UnsupportedLayout
from orchestrator.catalog.models import (
    Architecture,
    Confidence,
    EngineRules,
    ExpertStorageOption,
    GroupBytes,
    ModelVariant,
    ParamGroup,
    QuantFormat,
    WeightBreakdown,
)
from orchestrator.errors import set_to


class Catalog(Protocol):
    """What this module reads of :class:`orchestrator.catalog.Catalog` (which imports this
    module: a protocol here, not an import back up, keeps the two files out of a cycle)."""

    def architecture(self, arch_id: str) -> Architecture: ...
    def quant(self, format_id: str) -> QuantFormat: ...
    def expert_storage_option(self, storage_id: str) -> ExpertStorageOption: ...

_CONF_ORDER: dict[str, int] = {"confirmed": 0, "derived": 1, "unconfirmed": 2}


def _worst(*levels: Confidence) -> Confidence:
    return max(levels, key=lambda c: _CONF_ORDER[c])


def _modules(variant: ModelVariant, include_mtp: bool, include_dspark: bool) -> tuple[str, ...]:
    mods = ["main"]
    if include_mtp:
        if not variant.has_mtp:
            raise UnknownCatalogData(
                f"model {variant.id!r} has no MTP block in its checkpoint "
                f"(modules: {', '.join(variant.modules)}), so its MTP weights cannot be counted.",
                fix="set include_mtp=False (no EAGLE/MTP speculative decoding) or pick a variant with MTP.",
            )
        mods.append("mtp")
    if include_dspark:
        if not variant.has_dspark:
            raise UnknownCatalogData(
                f"model {variant.id!r} has no DSpark draft module (modules: {', '.join(variant.modules)}).",
                fix="use DSPARK only with a checkpoint that ships it (deepseek-ai/DeepSeek-V4-Flash-0731).",
            )
        mods.append("dspark")
    return tuple(mods)


def _check_storage(catalog: Catalog, variant: ModelVariant, expert_storage: str) -> None:
    option = catalog.expert_storage_option(expert_storage)
    if variant.expert_format not in option.applies_to_expert_formats:
        raise UnknownCatalogData(
            f"expert storage {expert_storage!r} is not available for model {variant.id!r}: its "
            f"experts are {variant.expert_format} and SGLang only converts "
            f"{', '.join(option.applies_to_expert_formats)} this way ({option.source}).",
            fix="use expert_storage 'native' for this checkpoint.",
        )


def _group_format(
    variant: ModelVariant,
    group: ParamGroup,
    storage_format: str | None,
    runtime: dict[str, str],
) -> str:
    if group.format == "expert":
        fmt = variant.expert_format
    elif group.format == "dense":
        fmt = variant.dense_format
    else:
        fmt = group.format
    fmt = variant.format_overrides.get(group.id, fmt)
    if group.kind == "routed_experts" and storage_format is not None:
        fmt = storage_format
    return runtime.get(group.id, fmt)


def _runtime_overrides(engine: EngineRules | None, gpu_arch: str | None) -> dict[str, str]:
    if engine is None or gpu_arch is None:
        return {}
    out: dict[str, str] = {}
    for ov in engine.runtime_weight_overrides:
        if gpu_arch in ov.archs:
            for gid in ov.groups:
                out[gid] = ov.format
    return out


def _group_bytes(catalog: Catalog, fmt: str, params: int) -> int:
    bpp = catalog.quant(fmt).bytes_per_param_exact
    return math.ceil(params * bpp)


def check_layout_static(catalog: Catalog, variant: ModelVariant, expert_storage: str, tp: int,
                        ep: int, attn_dp: int) -> None:
    """The layout rules that need no GPU (``dsv4ctl validate`` reports them): the storage option,
    tp/ep/attn_dp against the model's heads, groups and experts, and the experts' scale blocks.
    Only the shared expert's format can depend on the GPU (runtime overrides), so it waits for
    :func:`weight_bytes_per_rank`."""
    _check_storage(catalog, variant, expert_storage)
    option = catalog.expert_storage_option(expert_storage)
    fmt = option.format if expert_storage != "native" else None
    _check_layout(catalog, variant, tp, ep, attn_dp, fmt or variant.expert_format, None)


def _check_layout(
    catalog: Catalog,
    variant: ModelVariant,
    tp: int,
    ep: int,
    attn_dp: int,
    expert_format: str,
    shared_format: str | None,
) -> None:
    for name, v in (("tp", tp), ("ep", ep), ("attn_dp", attn_dp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UnsupportedLayout(
                f"{name} must be a positive integer, got {v!r}.", change=(set_to(name, 1),),
                then=" (or more)")
    cfg = catalog.architecture(variant.architecture).config
    heads = cfg.num_attention_heads.value
    groups = cfg.o_groups.value
    experts = cfg.n_routed_experts.value
    inter = cfg.moe_intermediate_size.value
    if ep not in (1, tp):
        raise UnsupportedLayout(
            f"ep={ep} with tp={tp}: SGLang 0.5.23 requires ep_size * moe_dp_size == tp_size and the "
            "catalog models moe_dp_size 1 only, so ep must be 1 (TP-sliced experts) or equal to tp.",
            change=(set_to("ep", 1),), then=f", or ep: {tp}",
        )
    if tp % attn_dp:
        raise UnsupportedLayout(
            f"attn_dp={attn_dp} does not divide tp={tp}: attention-DP groups split the TP group.",
            change=(set_to("attn_dp", max(d for d in range(1, tp + 1)
                                          if tp % d == 0 and d <= attn_dp)),),
            then=" (the largest divisor of tp not above it)",
        )
    attn_tp = tp // attn_dp
    if heads % attn_tp or groups % attn_tp:
        raise UnsupportedLayout(
            f"attention TP size {attn_tp} (tp {tp} / attn_dp {attn_dp}) must divide the "
            f"{heads} attention heads and the {groups} output groups (o_groups) of {variant.id}.",
            fix="use an attention TP size of 1, 2, 4 or 8.",
        )
    if experts % ep:
        raise UnsupportedLayout(
            f"ep={ep} does not divide the {experts} routed experts.", fix="use a power-of-two ep up to 256."
        )
    moe_tp = tp // ep
    if inter % moe_tp:
        raise UnsupportedLayout(
            f"MoE TP size {moe_tp} does not divide moe_intermediate_size {inter}.",
            change=(set_to("ep", tp),), then=" (ep == tp)",
        )
    k_block = catalog.quant(expert_format).k_block
    if k_block and (inter // moe_tp) % k_block:
        raise UnsupportedLayout(
            f"TP-slicing experts {moe_tp} ways leaves {inter // moe_tp} intermediate columns per "
            f"rank, not a multiple of the {expert_format} scale block ({k_block}).",
            change=(set_to("ep", tp),), then=" (whole experts per rank) instead of TP-sliced experts",
        )
    if shared_format is None:
        return
    shared_block = catalog.quant(shared_format).k_block
    if inter % tp or (shared_block and (inter // tp) % shared_block):
        raise UnsupportedLayout(
            f"the shared expert (intermediate {inter}, {shared_format}) cannot be TP-sliced {tp} "
            "ways on its scale blocks.",
            fix="use tp <= 16, or replicate the shared expert with SGLANG_SHARED_EXPERT_TP1=1 "
            "(not modelled by the catalog).",
        )


def _divisor(sharding: str, tp: int, attn_dp: int) -> int:
    if sharding in ("expert", "tp", "vocab_head"):
        return tp
    if sharding == "attn_tp":
        return tp // attn_dp
    if sharding == "vocab_embed":
        return 1 if attn_dp > 1 else tp
    return 1  # replicated


def _breakdown(
    catalog: Catalog,
    variant: ModelVariant,
    expert_storage: str,
    tp: int,
    ep: int,
    attn_dp: int,
    include_mtp: bool,
    include_dspark: bool,
    engine: EngineRules | None,
    gpu_arch: str | None,
) -> WeightBreakdown:
    _check_storage(catalog, variant, expert_storage)
    mods = _modules(variant, include_mtp, include_dspark)
    arch = catalog.architecture(variant.architecture)
    option = catalog.expert_storage_option(expert_storage)
    storage_format = option.format if expert_storage != "native" else None
    runtime = _runtime_overrides(engine, gpu_arch)
    expert_fmt = storage_format or variant.expert_format
    shared_fmt = _group_format(variant, arch.group("shared_experts"), None, runtime)
    _check_layout(catalog, variant, tp, ep, attn_dp, expert_fmt, shared_fmt)

    rows: list[GroupBytes] = []
    notes: list[str] = list(variant.caveats)
    for g in arch.param_groups:
        if g.module not in mods:
            continue
        fmt = _group_format(variant, g, storage_format, runtime)
        qf = catalog.quant(fmt)
        div = _divisor(g.sharding, tp, attn_dp)
        total = _group_bytes(catalog, fmt, g.params.value)
        per_rank = math.ceil(Fraction(g.params.value, div) * qf.bytes_per_param_exact)
        conf = _worst(g.params.confidence, qf.bytes_per_param.confidence)
        if conf == "unconfirmed":
            notes.append(f"{g.id}: {g.note or g.params.note or g.params.source}")
        rows.append(
            GroupBytes(
                id=g.id,
                module=g.module,
                kind=g.kind,
                sharding=g.sharding,
                format=fmt,
                params_total=g.params.value,
                bytes_total=total,
                divisor=div,
                bytes_per_rank=per_rank,
                confidence=conf,
            )
        )
    if "dspark" in mods:
        rows.append(_dspark_row(variant, expert_storage, tp))
        notes.append(f"dspark: {variant.dspark_bytes.note if variant.dspark_bytes else ''}")
    total = sum(r.bytes_per_rank for r in rows)
    return WeightBreakdown(
        model=variant.id,
        expert_storage=expert_storage,
        tp=tp,
        ep=ep,
        attn_dp=attn_dp,  # type: ignore[arg-type]
        include_mtp=include_mtp,
        include_dspark=include_dspark,
        gpu_arch=gpu_arch,
        groups=tuple(rows),
        total_bytes=total,
        unconfirmed=tuple(notes),
    )


def _dspark_row(variant: ModelVariant, expert_storage: str, tp: int) -> GroupBytes:
    fact = variant.dspark_bytes
    if fact is None:
        raise UnknownCatalogData(
            f"the size of the DSpark module of {variant.id!r} is not in the catalog.",
            fix="add a sourced dspark_bytes to the variant, or disable DSPARK.",
        )
    if expert_storage != "native":
        raise UnknownCatalogData(
            f"expert storage {expert_storage!r} with the DSpark module of {variant.id!r}: the module's "
            "composition (how much of it is routed experts) was not read, so its converted size "
            "cannot be computed.",
            fix="use expert_storage 'native' with DSPARK, or read the -0731 safetensors index.",
        )
    # The module is dominated by its MoE stages, which shard like routed experts (÷ tp); this
    # split is part of the unconfirmed estimate (see the variant's note).
    return GroupBytes(
        id="dspark_module",
        module="dspark",
        kind="dspark",
        sharding="expert",
        format=variant.expert_format,
        params_total=None,
        bytes_total=fact.value,
        divisor=tp,
        bytes_per_rank=math.ceil(Fraction(fact.value, tp)),
        confidence="unconfirmed",
    )


def weight_bytes_total(
    catalog: Catalog,
    variant: ModelVariant,
    expert_storage: str,
    include_mtp: bool,
    include_dspark: bool,
) -> int:
    """Bytes of all weights of the chosen modules, summed over every rank (one full copy)."""
    b = _breakdown(catalog, variant, expert_storage, 1, 1, 1, include_mtp, include_dspark, None, None)
    return sum(g.bytes_total for g in b.groups)


def weight_bytes_per_rank(
    catalog: Catalog,
    variant: ModelVariant,
    expert_storage: str,
    tp: int,
    ep: int,
    attn_dp: int,
    include_mtp: bool,
    include_dspark: bool,
    engine: EngineRules | None = None,
    gpu_arch: str | None = None,
) -> WeightBreakdown:
    """Bytes each rank of one TP group holds, per group; with ``engine`` and ``gpu_arch`` also
    the engine's load-time dtype changes (e.g. wo_a held as BF16 on sm_120)."""
    return _breakdown(
        catalog, variant, expert_storage, tp, ep, attn_dp, include_mtp, include_dspark, engine, gpu_arch
    )
