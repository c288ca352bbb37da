"""Knowledge catalog of dsv4ctl: GPUs, quant formats, model variants and per-engine-version rules.

The catalog is data (YAML under ``orchestrator/catalog/data/``, shipped as package data) with a
source and a confidence on every number, validated into pydantic models at load time. It sits on
the ``dsv4ctl plan`` path, so it imports only the standard library, pydantic and PyYAML.

Public API::

    cat = load_catalog()                       # cached; raises CatalogDataError on bad data
    cat.gpu("rtx-pro-6000-se") / cat.gpu("NVIDIA H200")
    cat.model("dsv4-flash-mxfp4")              # a ModelVariant
    cat.engine("sglang", "0.5.23")             # EngineRules; cat.router("sglang-router", "0.3.2")
    cat.weight_bytes_total(model, expert_storage, include_mtp, include_dspark) -> int
    cat.weight_bytes_per_rank(model, expert_storage, tp, ep, attn_dp, include_mtp, include_dspark)
        -> WeightBreakdown
    cat.checkpoint_bytes(model) -> int

Unknown ids raise :class:`UnknownCatalogEntry` (a ``KeyError`` listing the known ids); cases the
data cannot answer raise :class:`UnknownCatalogData`; impossible layouts raise
:class:`UnsupportedLayout`.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.catalog import weights as _weights
from orchestrator.catalog.errors import (
    CatalogDataError,
    CatalogError,
    UnknownCatalogData,
    UnknownCatalogEntry,
    UnsupportedLayout,
)
from orchestrator.catalog.models import (
    ArchConfig,
    Architecture,
    DSparkInfo,
    EngineRules,
    ExpertStorageOption,
    Fact,
    Gpu,
    GroupBytes,
    ModelVariant,
    QuantFormat,
    RouterRules,
    WeightBreakdown,
)

__all__ = [
    "ArchConfig",
    "Architecture",
    "Catalog",
    "CatalogDataError",
    "CatalogError",
    "DSparkInfo",
    "EngineRules",
    "ExpertStorageOption",
    "Fact",
    "Gpu",
    "GroupBytes",
    "ModelVariant",
    "QuantFormat",
    "RouterRules",
    "UnknownCatalogData",
    "UnknownCatalogEntry",
    "UnsupportedLayout",
    "WeightBreakdown",
    "load_catalog",
]

_SPACES = re.compile(r"\s+")


def _norm(name: str) -> str:
    return _SPACES.sub(" ", name.strip()).casefold()


class Catalog(BaseModel):
    """Everything the catalog knows, with lookups by id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: tuple[Gpu, ...]
    formats: tuple[QuantFormat, ...]
    expert_storage: tuple[ExpertStorageOption, ...]
    architectures: tuple[Architecture, ...]
    dspark: DSparkInfo
    variants: tuple[ModelVariant, ...]
    engines: tuple[EngineRules, ...]
    routers: tuple[RouterRules, ...]

    # -- lookups -----------------------------------------------------------------------------

    def gpu(self, id_or_name: str) -> Gpu:
        """A GPU by catalog id or by an nvidia-smi ``name`` string (case/space-insensitive)."""
        key = _norm(id_or_name)
        for g in self.gpus:
            if key == _norm(g.id) or any(key == _norm(n.value) for n in g.nvidia_smi_names):
                return g
        known = [g.id for g in self.gpus] + [n.value for g in self.gpus for n in g.nvidia_smi_names]
        raise UnknownCatalogEntry("GPU", id_or_name, known)

    def model(self, variant_id: str) -> ModelVariant:
        for v in self.variants:
            if v.id == variant_id:
                return v
        raise UnknownCatalogEntry("model variant", variant_id, [v.id for v in self.variants])

    def architecture(self, arch_id: str) -> Architecture:
        for a in self.architectures:
            if a.id == arch_id:
                return a
        raise UnknownCatalogEntry("architecture", arch_id, [a.id for a in self.architectures])

    def config_of(self, model: ModelVariant | str) -> ArchConfig:
        """The architecture config (layers, heads, index_topk, max positions, ...) of a variant."""
        return self.architecture(self._variant(model).architecture).config

    def quant(self, format_id: str) -> QuantFormat:
        for f in self.formats:
            if f.id == format_id:
                return f
        raise UnknownCatalogEntry("quant format", format_id, [f.id for f in self.formats])

    def expert_storage_option(self, storage_id: str) -> ExpertStorageOption:
        for o in self.expert_storage:
            if o.id == storage_id:
                return o
        raise UnknownCatalogEntry("expert storage", storage_id, [o.id for o in self.expert_storage])

    def engine(self, name: str, version: str) -> EngineRules:
        for e in self.engines:
            if e.engine == name and e.version == version:
                return e
        raise UnknownCatalogEntry(
            "engine version", f"{name}=={version}", [f"{e.engine}=={e.version}" for e in self.engines]
        )

    def router(self, name: str, version: str) -> RouterRules:
        for r in self.routers:
            if r.engine == name and r.version == version:
                return r
        raise UnknownCatalogEntry(
            "router version", f"{name}=={version}", [f"{r.engine}=={r.version}" for r in self.routers]
        )

    def describe(self, what: str) -> list[str]:
        """Deterministic one-line-per-entry listing for ``dsv4ctl catalog models|gpus|engines``."""
        if what == "models":
            lines = []
            for v in self.variants:
                ck = v.checkpoint_bytes
                lines.append(
                    f"{v.id:<24} {v.hf_repo:<46} experts {v.expert_format:<12} "
                    f"rest {v.dense_format:<12} checkpoint {ck.value / 1e9:6.1f} GB ({ck.confidence})"
                    f"  modules {'+'.join(v.modules)}"
                )
            return lines
        if what == "gpus":
            return [
                f"{g.id:<18} {g.arch:<7} {g.memory_mib.value:>7} MiB {g.memory_bandwidth_gbps.value:>5} GB/s"
                f"  {'NVLink' if g.nvlink else 'PCIe, no NVLink'}  nvidia-smi: "
                + ", ".join(f"{n.value!r} ({n.confidence})" for n in g.nvidia_smi_names)
                for g in self.gpus
            ]
        if what == "engines":
            return [f"{e.engine}=={e.version} (engine)" for e in self.engines] + [
                f"{r.engine}=={r.version} (router)" for r in self.routers
            ]
        raise UnknownCatalogEntry("catalog section", what, ["engines", "gpus", "models"])

    # -- weights (methods so a caller holding a Catalog need not use the cached global) -------

    def _variant(self, model: ModelVariant | str) -> ModelVariant:
        return self.model(model) if isinstance(model, str) else model

    def weight_bytes_total(
        self,
        model: ModelVariant | str,
        expert_storage: str = "native",
        include_mtp: bool = False,
        include_dspark: bool = False,
    ) -> int:
        return _weights.weight_bytes_total(
            self, self._variant(model), expert_storage, include_mtp, include_dspark
        )

    def weight_bytes_per_rank(
        self,
        model: ModelVariant | str,
        expert_storage: str = "native",
        tp: int = 1,
        ep: int = 1,
        attn_dp: int = 1,
        include_mtp: bool = False,
        include_dspark: bool = False,
        *,
        engine: EngineRules | None = None,
        gpu_arch: str | None = None,
    ) -> WeightBreakdown:
        return _weights.weight_bytes_per_rank(
            self,
            self._variant(model),
            expert_storage,
            tp,
            ep,
            attn_dp,
            include_mtp,
            include_dspark,
            engine,
            gpu_arch,
        )

    def check_layout(self, model: ModelVariant | str, expert_storage: str, tp: int, ep: int,
                     attn_dp: int) -> None:
        """Raise UnsupportedLayout / UnknownCatalogData for a layout no GPU could shard."""
        _weights.check_layout_static(self, self._variant(model), expert_storage, tp, ep, attn_dp)

    def checkpoint_bytes(self, model: ModelVariant | str) -> int:
        return self._variant(model).checkpoint_bytes.value


# ------------------------------------------------------------------------------- loading

_DATA = "data"


def _read_yaml(rel: str) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    path = resources.files(__name__).joinpath(_DATA, *rel.split("/"))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CatalogDataError(
            f"catalog data file {rel!r} is missing from the installed package.",
            fix="reinstall dsv4ctl (the YAML files under orchestrator/catalog/data are package data).",
        ) from exc
    try:
        return yaml.load(text, Loader=loader)  # a SafeLoader variant: no arbitrary objects
    except yaml.YAMLError as exc:
        raise CatalogDataError(f"catalog data file {rel!r} is not valid YAML: {exc}") from exc


def _validate(model: type[BaseModel], data: Any, rel: str, where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in (where, *first["loc"]) if p != "")
        raise CatalogDataError(
            f"catalog data file {rel!r} at {loc}: {first['msg']} ({exc.error_count()} problem(s) in total)."
        ) from exc


def _engine_files() -> list[str]:
    folder = resources.files(__name__).joinpath(_DATA, "engines")
    return sorted(f"engines/{p.name}" for p in folder.iterdir() if p.name.endswith(".yaml"))


def _cross_check(cat: Catalog) -> None:
    """References between files must resolve: a broken one is a data bug, caught at load."""
    fmt_ids = {f.id for f in cat.formats}
    for a in cat.architectures:
        gids = [g.id for g in a.param_groups]
        if len(gids) != len(set(gids)):
            raise CatalogDataError(f"architecture {a.id!r} has duplicate group ids.")
        for g in a.param_groups:
            if g.format not in ("expert", "dense") and g.format not in fmt_ids:
                raise CatalogDataError(f"group {a.id}.{g.id} has unknown format {g.format!r}.")
    for v in cat.variants:
        arch = cat.architecture(v.architecture)
        gids = {g.id for g in arch.param_groups}
        for f in (v.expert_format, v.dense_format, *v.format_overrides.values()):
            if f not in fmt_ids:
                raise CatalogDataError(f"variant {v.id!r} uses unknown format {f!r}.")
        for gid in v.format_overrides:
            if gid not in gids:
                raise CatalogDataError(f"variant {v.id!r} overrides unknown group {gid!r}.")
        if v.has_dspark and v.dspark_bytes is None:
            raise CatalogDataError(f"variant {v.id!r} ships DSpark but has no dspark_bytes fact.")
    all_groups = {g.id for a in cat.architectures for g in a.param_groups}
    for e in cat.engines:
        for ov in e.runtime_weight_overrides:
            if ov.format not in fmt_ids or not set(ov.groups) <= all_groups:
                raise CatalogDataError(
                    f"engine {e.engine}=={e.version} override {ov.id!r} names an unknown format or group."
                )
        for r in e.moe_runners:
            if r.expert_format not in fmt_ids:
                raise CatalogDataError(
                    f"engine {e.engine}=={e.version} MoE rule names unknown format {r.expert_format!r}."
                )
    for o in cat.expert_storage:
        if o.format is not None and o.format not in fmt_ids:
            raise CatalogDataError(f"expert storage {o.id!r} names unknown format {o.format!r}.")


@functools.lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """Load and validate every catalog file once per process."""
    gpus = _read_yaml("gpus.yaml")
    quant = _read_yaml("quant.yaml")
    models = _read_yaml("models.yaml")
    engines: list[Any] = []
    routers: list[Any] = []
    for rel in _engine_files():
        raw = _read_yaml(rel)
        kind = raw.get("kind") if isinstance(raw, dict) else None
        if kind == "engine":
            engines.append(_validate(EngineRules, raw, rel, ""))
        elif kind == "router":
            routers.append(_validate(RouterRules, raw, rel, ""))
        else:
            raise CatalogDataError(f"catalog data file {rel!r} must set kind: engine|router.")
    try:
        raw_cat = {
            "gpus": gpus["gpus"],
            "formats": quant["formats"],
            "expert_storage": quant["expert_storage"],
            "architectures": models["architectures"],
            "dspark": models["dspark"],
            "variants": models["variants"],
        }
    except (KeyError, TypeError) as exc:
        raise CatalogDataError(f"catalog data is missing a top-level section: {exc}") from exc
    cat = _validate(Catalog, {**raw_cat, "engines": [], "routers": []}, "gpus/quant/models.yaml", "")
    cat = cat.model_copy(update={"engines": tuple(engines), "routers": tuple(routers)})
    _cross_check(cat)
    return cat
