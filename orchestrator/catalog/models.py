"""Pydantic models of the catalog data (GPUs, quant formats, model variants, engine rules).

Owns the *shape* of ``orchestrator/catalog/data/*.yaml``: every model forbids unknown keys so a
typo in the data fails loudly at load time, and every number is wrapped in a :class:`Fact` that
carries its ``source`` and ``confidence`` (the planner quotes them in checks). Only pydantic and
the standard library are imported here: this module is on the ``dsv4ctl plan`` path.

Past 400 lines on purpose: it is the schema of the catalog's data files, one model per section with
each field's unit, range and source rule beside it, read as one document beside the YAML it checks.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

T = TypeVar("T")

Confidence = Literal["confirmed", "derived", "unconfirmed"]
Arch = Literal["sm_90", "sm_100", "sm_120"]
Module = Literal["main", "mtp", "dspark"]
Sharding = Literal["expert", "attn_tp", "tp", "replicated", "vocab_embed", "vocab_head"]
GroupKind = Literal[
    "routed_experts",
    "attention",
    "compressor",
    "indexer",
    "shared_experts",
    "router",
    "embedding",
    "lm_head",
    "mtp_proj",
    "small",
    "dspark",
]
PathKind = Literal["tensor_core", "dequant_fallback", "unavailable"]
ExpertStorage = Literal["native", "fp8", "bf16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sourced(_Strict):
    """A catalog entry that carries where its values come from and how sure we are of them."""

    source: str = Field(min_length=1)
    confidence: Confidence


class Fact(_Strict, Generic[T]):
    """One sourced value: what it is, where it comes from and how sure we are."""

    value: T
    source: str = Field(min_length=1)
    confidence: Confidence
    note: str | None = None

    @property
    def unconfirmed(self) -> bool:
        return self.confidence == "unconfirmed"


# --------------------------------------------------------------------------- GPUs


class Gpu(_Strict):
    id: str
    display_name: str
    nvidia_smi_names: list[Fact[str]]
    arch: Arch
    compute_capability: Fact[str]
    memory_mib: Fact[int]
    memory_bandwidth_gbps: Fact[int]
    sm_count: Fact[int]
    smem_per_block_optin_bytes: Fact[int]
    smem_per_sm_bytes: Fact[int] | None = None
    power_limit_w: Fact[int]
    l2_cache_mb: Fact[int] | None = None
    interconnect: Literal["pcie", "nvlink"]
    pcie_gen: Fact[int] | None = None
    nvlink_gbps: Fact[int] | None = None
    nvlink: bool
    fp4_tensor_cores: bool
    notes: list[str] = Field(default_factory=list)

    @property
    def memory_bytes(self) -> int:
        """Total memory as nvidia-smi reports it (MiB x 2**20)."""
        return self.memory_mib.value * 1024 * 1024


# --------------------------------------------------------------------------- quant formats


class QuantFormat(_Strict):
    id: str
    display_name: str
    element: str
    block_size: Fact[int] | None
    block_axis: str | None
    scale_dtype: str | None
    second_level_scale: str | None
    bits_per_param: Fact[float]
    bytes_per_param: Fact[float]
    notes: list[str] = Field(default_factory=list)

    @property
    def bytes_per_param_exact(self) -> Fraction:
        """Exact bytes/param (every value in the data is dyadic, so the float is exact)."""
        return Fraction(self.bytes_per_param.value)

    @property
    def k_block(self) -> int | None:
        """Values per scale along the reduction dim (K), for TP-slicing alignment checks."""
        if self.block_size is None:
            return None
        if self.block_axis == "KxN":  # square 128x128 tiles: 128 along K
            return round(self.block_size.value**0.5)
        return self.block_size.value


class ExpertStorageOption(_Strict):
    id: ExpertStorage
    description: str
    format: str | None
    applies_to_expert_formats: list[str]
    env: dict[str, str]
    source: str = Field(min_length=1)
    notes: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- models


class ArchConfig(_Strict):
    num_hidden_layers: Fact[int]
    hidden_size: Fact[int]
    num_attention_heads: Fact[int]
    num_key_value_heads: Fact[int]
    head_dim: Fact[int]
    qk_nope_head_dim: Fact[int]
    qk_rope_head_dim: Fact[int]
    q_lora_rank: Fact[int]
    o_groups: Fact[int]
    o_lora_rank: Fact[int]
    n_routed_experts: Fact[int]
    num_experts_per_tok: Fact[int]
    n_shared_experts: Fact[int]
    moe_intermediate_size: Fact[int]
    first_k_dense_replace: Fact[int]
    num_hash_layers: Fact[int]
    vocab_size: Fact[int]
    max_position_embeddings: Fact[int]
    sliding_window: Fact[int]
    index_n_heads: Fact[int]
    index_head_dim: Fact[int]
    index_topk: Fact[int]
    hc_mult: Fact[int]
    num_nextn_predict_layers: Fact[int]
    compress_ratios: Fact[list[int]]
    mtp_compress_ratio: Fact[int]

    def layer_ratio_counts(self) -> dict[int, int]:
        """How many of the ``num_hidden_layers`` layers have each compress ratio."""
        ratios = self.compress_ratios.value[: self.num_hidden_layers.value]
        counts: dict[int, int] = {}
        for r in ratios:
            counts[r] = counts.get(r, 0) + 1
        return dict(sorted(counts.items()))


class ParamGroup(_Strict):
    id: str
    module: Module
    kind: GroupKind
    format: str
    sharding: Sharding
    params: Fact[int]
    note: str | None = None


class Architecture(_Strict):
    id: str
    hf_architecture: str
    model_type: str
    config: ArchConfig
    param_groups: list[ParamGroup]
    mtp_shares_embed_and_head: Fact[bool]

    def group(self, group_id: str) -> ParamGroup:
        for g in self.param_groups:
            if g.id == group_id:
                return g
        raise KeyError(group_id)

    def params(self, modules: tuple[Module, ...] = ("main",)) -> int:
        """Exact parameter count of the given modules (DSpark has no count: see the variant)."""
        return sum(g.params.value for g in self.param_groups if g.module in modules)


class DSparkInfo(_Strict):
    id: str
    stages: Fact[int]
    block_size: Fact[int]
    markov_rank: Fact[int]
    compress_ratios_extra: Fact[list[int]]


class ModelVariant(_Strict):
    id: str
    display_name: str
    hf_repo: str
    revision: str
    released: str | None = None
    architecture: str
    expert_format: str
    dense_format: str
    format_overrides: dict[str, str]
    modules: list[Module]
    sglang_quantization: str
    checkpoint_bytes: Fact[int]
    shard_count: Fact[int] | None
    dspark_bytes: Fact[int] | None = None
    caveats: list[str] = Field(default_factory=list)

    @field_validator("modules")
    @classmethod
    def _main_first(cls, v: list[str]) -> list[str]:
        if "main" not in v:
            raise ValueError("a variant must contain the 'main' module")
        return v

    @property
    def has_mtp(self) -> bool:
        return "mtp" in self.modules

    @property
    def has_dspark(self) -> bool:
        return "dspark" in self.modules


# --------------------------------------------------------------------------- engine rules


class AcceptedValues(_Sourced):
    values: list[int | str]
    note: str | None = None


class EnvSet(_Sourced):
    values: dict[str, str]


class RuntimeWeightOverride(_Sourced):
    id: str
    groups: list[str]
    archs: list[Arch]
    format: str
    note: str | None = None


class MoeRunnerRule(_Sourced):
    expert_format: str
    arch: Arch
    runner: str
    requires_expert_storage: ExpertStorage | None = None
    is_default: bool
    path_kind: PathKind
    method: str
    note: str | None = None


class MoePathCost(_Strict):
    decode_time_fraction: Fact[float | list[float]]
    note: str | None = None


class KnownBad(_Strict):
    """A combination the engine is known to get wrong. ``change``: the profile fields its fix
    sets (dotted path -> value); then the fix's text is rendered from it and ``fix`` is only
    what follows (the planner's check: :func:`orchestrator.errors.fix_text`), so text and edit
    cannot disagree.
    Without ``change`` (a fix that is no one profile edit), ``fix`` is the whole text."""

    id: str
    title: str
    severity: Literal["error", "warning", "info"]
    when: dict[str, list[str | int | bool]]
    upstream: list[str] = Field(min_length=1)
    source: str | None = None
    confidence: Confidence
    fix: str
    change: dict[str, str | int | bool] | None = None
    note: str | None = None

    @model_validator(mode="after")
    def _fix_follows_its_change(self) -> KnownBad:
        if self.change and self.fix.lstrip().startswith(("set ", "remove ")):
            raise ValueError(f"known_bad {self.id}: with change, fix is only what follows the "
                             f"rendered change (not {self.fix!r})")
        return self


    @field_validator("upstream")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not url.startswith("https://"):
                raise ValueError(f"upstream link {url!r} is not an https URL")
        return v

    def matches(self, facts: dict[str, object]) -> bool:
        """True when every condition in ``when`` is met by ``facts``.

        A key ``<name>_not`` means "facts[name] is not one of these". A condition whose fact is
        absent does not match: the planner must supply every fact a rule asks about.
        """
        for key, allowed in self.when.items():
            negate = key.endswith("_not")
            name = key[: -len("_not")] if negate else key
            if name not in facts:
                return False
            hit = facts[name] in allowed
            if hit == negate:
                return False
        return True


KernelOp = Literal["attention", "indexer", "mhc_pre"]


class KernelOpPaths(_Sourced):
    """One hooked op on the GPUs where the hook's entry points are reached: what SGLang runs
    there by default, what the bundled kernel replaces, and the env that routes SGLang to it."""

    engine: str  # the engine's own path, as plan names it
    engine_contender: str  # its name in a `qualify kernels` fact
    engine_tensor_cores: bool  # False: the engine has no tensor-core path for this op there
    bundled: str
    bundled_env: dict[str, str]  # besides the hook's own switches
    note: str | None = None


class KernelPathLimit(_Strict):
    """Where the engine's own path for an op cannot serve a role (it aborts or refuses)."""

    id: str
    op: KernelOp
    title: str
    when: dict[str, list[str | int | bool]]
    upstream: list[str] = Field(min_length=1)
    source: str = Field(min_length=1)
    confidence: Confidence
    note: str | None = None

    def matches(self, facts: dict[str, object]) -> bool:
        """Every condition met (``<name>_not``: not one of these; ``<name>_gt``: above the one
        value); a condition whose fact is absent does not match."""
        for key, allowed in self.when.items():
            if key.endswith("_gt"):
                v = facts.get(key[:-3])
                if not isinstance(v, int) or not v > int(allowed[0]):
                    return False
                continue
            negate = key.endswith("_not")
            name = key[: -len("_not")] if negate else key
            if name not in facts or (facts[name] in allowed) == negate:
                return False
        return True


class KernelPaths(_Sourced):
    """Which path each hooked op takes (orchestrator/kernel_paths.py decides from this)."""

    archs: list[Arch]  # where SGLang reaches the entry points the hook replaces
    decode_max_rows: Fact[int]  # above this many query rows a call takes the prefill kernel
    ops: dict[KernelOp, KernelOpPaths]
    limits: list[KernelPathLimit]


class PdTransferBackend(_Sourced):
    id: str
    needs: list[str]
    env: dict[str, str]
    pip: list[str]
    note: str | None = None


class SpeculativeRule(_Sourced):
    algorithm: str
    requires_module: Module | None
    constraints: dict[str, int]
    flags: list[str]
    note: str | None = None


class FlagTable(_Sourced):
    knobs: dict[str, str]
    removed_or_deprecated: dict[str, str]

    @field_validator("knobs")
    @classmethod
    def _full_names(cls, v: dict[str, str]) -> dict[str, str]:
        for knob, flag in v.items():
            if not flag.startswith("--"):
                raise ValueError(f"flag for {knob!r} must be a full '--name', got {flag!r}")
        return v


class Parsers(_Sourced):
    reasoning: str
    tool_call: str
    chat_template_needed: bool


class EngineEndpoints(_Sourced):
    health: list[str]
    ready: str
    info: list[str]
    metrics: str
    metrics_requires_flag: str


class ForeignCodeFlag(_Strict):
    """An engine flag that runs code from outside the engine environment, or sends or writes
    request data somewhere else (issue 31), with the engine's own words as the source."""

    flag: Annotated[str, Field(pattern=r"^--[a-z0-9-]+$")]
    kind: Literal["runs-foreign-code", "sends-data-off-host", "writes-request-data"]
    source: str = Field(min_length=1)


class EngineRules(_Strict):
    kind: Literal["engine"]
    engine: str
    version: str
    source: str = Field(min_length=1)
    accepted: dict[str, AcceptedValues]
    forced_for_v4: dict[str, Fact[int | float | str]]
    env_set_on_sm120: EnvSet
    runtime_weight_overrides: list[RuntimeWeightOverride]
    moe_runners: list[MoeRunnerRule]
    moe_path_cost: dict[PathKind, MoePathCost]
    known_bad: list[KnownBad]
    kernel_paths: KernelPaths
    pd_transfer_backends: list[PdTransferBackend]
    speculative: list[SpeculativeRule]
    flags: FlagTable
    parsers: Parsers
    ports: dict[str, Fact[int]]
    defaults: dict[str, Fact[int | float | str]]
    endpoints: EngineEndpoints
    # Whether a DeepSeek-V4 checkpoint needs --trust-remote-code to load under this engine version
    # (issue 19: the flag was always on, letting a checkpoint directory run code as the engine).
    trust_remote_code_needed: Fact[bool]
    foreign_code_flags: list[ForeignCodeFlag] = Field(default_factory=list)

    def accepts(self, knob: str, value: object) -> bool:
        """Whether ``value`` is accepted for ``knob`` (raises KeyError for an unknown knob)."""
        return value in self.accepted[knob].values

    def moe_runner_rules(self, expert_format: str, arch: str) -> list[MoeRunnerRule]:
        return [r for r in self.moe_runners if r.expert_format == expert_format and r.arch == arch]

    def default_moe_runner(self, expert_format: str, arch: str) -> MoeRunnerRule | None:
        """What ``--moe-runner-backend auto`` resolves to (None when the catalog does not know)."""
        for r in self.moe_runner_rules(expert_format, arch):
            if r.is_default and r.requires_expert_storage is None:
                return r
        return None

    def moe_runner(self, expert_format: str, arch: str, runner: str) -> MoeRunnerRule | None:
        for r in self.moe_runner_rules(expert_format, arch):
            if r.runner == runner:
                return r
        return None

    def known_bad_matching(self, facts: dict[str, object]) -> list[KnownBad]:
        return [kb for kb in self.known_bad if kb.matches(facts)]

    def pd_backend(self, backend_id: str) -> PdTransferBackend | None:
        for b in self.pd_transfer_backends:
            if b.id == backend_id:
                return b
        return None


class RouterPolicies(_Sourced):
    values: list[str]
    prefill_only: list[str]
    default: str


class RouterEndpoints(_Sourced):
    liveness: str
    readiness: str
    health: list[str]
    metrics: str


class RouterPd(_Sourced):
    flags: list[str]
    prefill_bootstrap_port_required: bool
    note: str


class RouterParsers(_Sourced):
    note: str


class RouterRules(_Strict):
    kind: Literal["router"]
    engine: str
    version: str
    source: str = Field(min_length=1)
    launch: str
    ports: dict[str, Fact[int]]
    defaults: dict[str, Fact[int | float | str]]
    policies: RouterPolicies
    endpoints: RouterEndpoints
    pd: RouterPd
    parsers: RouterParsers
    metric_prefix: str


# --------------------------------------------------------------------------- weight results


class GroupBytes(_Strict):
    """One parameter group's share on one rank."""

    id: str
    module: Module
    kind: GroupKind
    sharding: Sharding
    format: str
    params_total: int | None
    bytes_total: int
    divisor: int
    bytes_per_rank: int
    confidence: Confidence


class WeightBreakdown(_Strict):
    """Weight bytes of one rank, per group and in total, for one model and parallel layout."""

    model: str
    expert_storage: ExpertStorage
    tp: int
    ep: int
    attn_dp: int
    include_mtp: bool
    include_dspark: bool
    gpu_arch: str | None
    groups: tuple[GroupBytes, ...]
    total_bytes: int
    unconfirmed: tuple[str, ...]

    @property
    def total_gib(self) -> float:
        return self.total_bytes / 2**30

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.kind] = out.get(g.kind, 0) + g.bytes_per_rank
        return out
