"""Oracle: the installed SGLang 0.5.23's own DeepSeek-V4 KV-pool sizing code, run on a CPU.

Owns the reference side of ``tests/parsers_real/test_kvpool_vs_sglang.py``. Given a deployment
(model config, the resolved server args, the env vars, and the GPU's free memory at the two
moments sglang measures it), :func:`run_sglang_sizing` returns what sglang 0.5.23 computes at
startup: the KV budget, bytes per full token, the fixed (per-request) bytes, the compress-state
ring sizes, every pool's token count and the running requests per attention-DP worker. The
numbers come from executing sglang's real source, not from a re-derivation.

Why the code is extracted with ``ast`` instead of imported: the modules that hold the sizing
(``srt/model_executor/pool_configurator.py``, ``srt/mem_cache/kv_cache_configurator.py``,
``srt/mem_cache/deepseek_v4_memory_pool.py``) import CUDA kernels, ``tvm_ffi``, flashinfer, ... at
module level, which a CPU CI machine cannot import (``import sglang.kernels.ops.attention.dsv4``
dies on ``tvm_ffi``), while the sizing itself is plain Python. So the oracle locates the installed
package with ``importlib.util.find_spec("sglang")`` (no hard-coded path), checks its version,
parses the files, compiles exactly the named top-level functions / classes / constants and
``KVCacheConfigurator`` methods (unchanged source; tracebacks show the wheel's file and line), and
executes them in fresh per-module namespaces for every scenario. ``kv_layout.py`` (``KVLayout``)
imports only the standard library and is loaded whole.

The real code run, in sglang's startup order: ``get_available_gpu_memory`` (the baseline as
``measure_pre_model_load_memory`` takes it), ``KVCacheConfigurator._resolve_memory_pool_config``
→ ``_profile_available_bytes`` → ``config_from_budget`` (``create_memory_pool_configurator`` →
``DSV4PoolConfigurator.calculate_pool_sizes``, ``_apply_token_constraints``,
``calculate_pool_sizes_from_max_tokens``) → ``resolve_max_num_reqs`` →
``finalize_with_max_running_requests``, with the ring / indexer / layout helpers of
``deepseek_v4_memory_pool.py``, ``KVLayout``, ``max_speculative_num_draft_tokens``, the unified-KV
gates, ``ceil_div``/``ceil_align``, ``is_hip``/``is_npu``.

What is stubbed (everything a CPU process cannot provide, nothing that computes a size):

- the runtime-context getters (``get_exec``, ``get_schedule``, ``get_spec``, ``get_memory``,
  ``get_disagg``, ``get_parallel``, ``get_mm``): attribute bags holding the scenario's resolved
  server args; the ``KVCacheConfigurator`` instance: a bag of its attributes with the real
  methods attached;
- ``envs``: defaults read (with ``ast``) from ``srt/environ.py``'s ``Envs`` class, overridden
  by the scenario; the process environment is ignored (a clean launch);
- torch: ``torch.version.hip`` is None and there is no ``torch.npu`` (so the real ``is_hip`` and
  ``is_npu`` say CUDA); ``torch.cuda.mem_get_info`` returns the scenario's free bytes;
  ``torch.distributed.all_reduce`` is the identity (MIN over ranks that look alike), while
  ``torch.tensor``/``torch.float32`` are the real CPU torch, so the float32 rounding of the
  distributed read is sglang's own;
- ``gc.collect``, ``logging``/``logger``: no-ops (no effect on sizes);
- ``is_deepseek_v4`` → True, ``parse_hisparse_config`` → the scenario's host-to-device ratio,
  ``DSV41_INDEX_PAGE_SIZE`` → 64 (read only for V4.1 ratio-1/2 layers, whose count is 0 for
  V4-Flash, so it multiplies zero), the HIP-only probes ``is_gfx95_supported`` → False and
  ``resolve_hip_flashmla_backend`` → None, and the prefill CUDA-graph fields that
  ``_profile_available_bytes`` reads only to exempt Mamba models (``Backend.FULL``,
  ``cuda_graph_config.prefill``; ``max_mamba_cache_size`` None settles it).

Out of scope here: what the pools then *allocate* (``kvpool.pool_bytes``, the pool constructors
need CUDA tensors) and the ``req_to_token`` table; the unified-KV, trtllm, NPU, V4.1 and
encoder-replay paths, which ``kvpool`` rejects.

Strictness, so that a changed sglang fails loudly instead of silently agreeing: a named
function/class/constant missing from its file, an attribute / env var / module / global that the
sglang code reads and the oracle does not provide, or a version other than 0.5.23 each raise
:class:`SglangShapeError` saying what moved and where.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import functools
import importlib.metadata
import importlib.util
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any, NoReturn

import torch

SGLANG_VERSION = "0.5.23"
_FIX = ("update tests/parsers_real/sglang_pool_oracle.py and, if the sizing changed, "
        "orchestrator/planner/kvpool.py + docs/kvpool-sglang-0.5.23.md")


class SglangShapeError(AssertionError):
    """sglang is missing, has another version, or its sizing code no longer has the shape the
    oracle runs (a function moved, a new attribute/env/module is read). Fails the test."""


# --- Strict attribute bags ------------------------------------------------------------------------


class _Bag:
    """Attribute bag that fails with a :class:`SglangShapeError` on any attribute it lacks.

    ``_absent`` names raise a plain ``AttributeError`` instead: attributes that really do not
    exist on the platform modelled (``torch.npu`` on CUDA), which sglang probes with hasattr.
    """

    def __init__(self, where: str, /, *, _absent: Iterable[str] = (), **attrs: object) -> None:
        self.__dict__.update(attrs)
        self.__dict__["_where"] = where
        self.__dict__["_absent"] = frozenset(_absent)

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__") or name in self.__dict__["_absent"]:
            raise AttributeError(name)
        raise SglangShapeError(
            f"sglang {SGLANG_VERSION} code reads {self.__dict__['_where']}.{name}, which the "
            f"oracle does not provide: the sizing code changed shape; {_FIX}"
        )


class _Env:
    """One ``envs.X`` field: ``get()`` returns the value, ``is_set()`` whether it was given."""

    def __init__(self, value: object, given: bool) -> None:
        self._value, self._given = value, given

    def get(self) -> object:
        return self._value

    def is_set(self) -> bool:
        return self._given


class _Envs:
    """``sglang.srt.environ.envs`` for a clean launch plus the scenario's overrides."""

    def __init__(self, defaults: Mapping[str, object], overrides: Mapping[str, object]) -> None:
        unknown = sorted(set(overrides) - set(defaults))
        if unknown:
            raise SglangShapeError(
                f"env var(s) {unknown} are not declared in sglang/srt/environ.py Envs with a "
                f"literal default any more; {_FIX}"
            )
        self._defaults, self._overrides = dict(defaults), dict(overrides)

    def __getattr__(self, name: str) -> _Env:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._overrides:
            return _Env(self._overrides[name], True)
        if name in self._defaults:
            return _Env(self._defaults[name], False)
        raise SglangShapeError(
            f"sglang code reads envs.{name}, which has no literal default in "
            f"sglang/srt/environ.py Envs; {_FIX}"
        )


def _noop(*_args: object, **_kwargs: object) -> None:
    return None


_QUIET = _Bag("logger", info=_noop, warning=_noop, debug=_noop, error=_noop, warning_once=_noop)


# --- Locating and extracting the installed sources ------------------------------------------------


def sglang_root() -> Path:
    """The installed ``sglang`` package directory, after checking it is 0.5.23."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglangShapeError(
            "sglang is not installed in this interpreter; install the real-parser environment: "
            "pip install --no-deps -r requirements/parsers.txt"
        )
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError as exc:
        raise SglangShapeError(f"sglang at {spec.origin} has no distribution metadata") from exc
    if version != SGLANG_VERSION:
        raise SglangShapeError(
            f"installed sglang is {version}, but orchestrator/planner/kvpool.py models "
            f"{SGLANG_VERSION}; pin sglang=={SGLANG_VERSION} (requirements/parsers.txt) or "
            "re-derive the model for the new version"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _node_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def extract(path: Path, names: Iterable[str], *, in_class: str | None = None) -> CodeType:
    """Compile the named top-level definitions of ``path`` (or methods of class ``in_class``).

    Keeps source order and every definition of a name (the last one wins, as on import).
    Raises :class:`SglangShapeError` naming whatever is not found.
    """
    wanted = set(names)
    rel = str(path)
    if not path.is_file():
        raise SglangShapeError(f"{rel} does not exist in the installed sglang; {_FIX}")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body: list[ast.stmt] = tree.body
    where = rel
    if in_class is not None:
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == in_class]
        if not classes:
            raise SglangShapeError(f"{rel} no longer defines class {in_class}; {_FIX}")
        body, where = classes[-1].body, f"{rel}::{in_class}"
    keep = [node for node in body if _node_name(node) in wanted]
    missing = sorted(wanted - {_node_name(node) for node in keep})
    if missing:
        raise SglangShapeError(
            f"{where} no longer defines {', '.join(missing)} (sglang {SGLANG_VERSION} did); "
            f"the sizing code moved or was renamed; {_FIX}"
        )
    future = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    flags = __future__.annotations.compiler_flag if future else 0
    return compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec", flags=flags,
                   dont_inherit=True)


def _env_defaults(path: Path) -> dict[str, object]:
    """Literal defaults of ``class Envs`` in ``srt/environ.py`` (``X = EnvStr("v4")``)."""
    if not path.is_file():
        raise SglangShapeError(f"{path} does not exist in the installed sglang; {_FIX}")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Envs"]
    if not classes:
        raise SglangShapeError(f"{path} no longer defines class Envs; {_FIX}")
    defaults: dict[str, object] = {}
    for node in classes[-1].body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and node.value.args and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            continue
        try:
            defaults[node.targets[0].id] = ast.literal_eval(node.value.args[0])
        except ValueError:
            continue  # computed default (e.g. _default_hip()): not literal, not read here
    return defaults


@dataclass(frozen=True)
class _Sources:
    """Compiled sglang code, keyed by the module it comes from."""

    root: Path
    kv_layout: ModuleType
    env_defaults: dict[str, object]
    utils: CodeType
    runtime: CodeType
    gate: CodeType
    pool: CodeType
    configurator: CodeType
    kvc_module: CodeType
    kvc_methods: CodeType
    kvc_method_names: tuple[str, ...]


#: Every file the oracle reads, relative to the sglang package directory.
SOURCE_FILES = {
    "kv_layout": "kernels/ops/attention/dsv4/kv_layout.py",
    "environ": "srt/environ.py",
    "utils": "srt/utils/common.py",
    "runtime": "srt/runtime_context.py",
    "gate": "srt/layers/attention/dsv4/unified_kv_gate.py",
    "pool": "srt/mem_cache/deepseek_v4_memory_pool.py",
    "configurator": "srt/model_executor/pool_configurator.py",
    "kvc": "srt/mem_cache/kv_cache_configurator.py",
}

_KVC_METHODS = ("_profile_available_bytes", "config_from_budget", "_apply_token_constraints",
                "resolve_max_num_reqs", "_resolve_memory_pool_config")


@functools.cache
def load_sources() -> _Sources:
    """Find, check and compile the installed sglang code once per process."""
    root = sglang_root()
    f = {key: root / rel for key, rel in SOURCE_FILES.items()}
    layout_path = f["kv_layout"]
    spec = importlib.util.spec_from_file_location("_oracle_sglang_kv_layout", layout_path)
    if spec is None or spec.loader is None or not layout_path.is_file():
        raise SglangShapeError(f"{layout_path} (KVLayout) is missing; {_FIX}")
    kv_layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kv_layout)  # stdlib-only module; not registered in sys.modules
    if not hasattr(kv_layout, "KVLayout"):
        raise SglangShapeError(f"{layout_path} no longer defines KVLayout; {_FIX}")
    return _Sources(
        root=root,
        kv_layout=kv_layout,
        env_defaults=_env_defaults(f["environ"]),
        utils=extract(f["utils"], {
            "is_hip", "is_npu", "ceil_div", "ceil_align", "empty_device_cache",
            "get_available_gpu_memory"}),
        runtime=extract(f["runtime"], {"max_speculative_num_draft_tokens"}),
        gate=extract(f["gate"],
                     {"is_unified_kv_triton", "is_unified_kv_fp8"}),
        pool=extract(f["pool"], {
            "_is_hip", "ONLINE_C128", "get_dsv4_indexer_bytes_per_token",
            "get_compress_state_ring_size", "resolve_compress_state_ring_size",
            "collect_sources_by_ratio", "get_compress_state_write_pad", "uses_draft_swa_ring",
            "get_draft_swa_ring_size", "get_swa_ring_size", "_num_dsv4_physical_kv_pages",
            "resolve_compressed_kv_layout", "select_dsv4_kv_layout", "dsv4_unified_row_bytes"}),
        configurator=extract(f["configurator"], {
            "_is_hip", "_is_npu", "MemoryPoolConfig", "MemoryPoolConfigurator",
            "_get_dsv4_compress_state_dtype_sizes", "check_dsv4_unified_fp8_pd_supported",
            "compute_swa_request_cap", "DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO",
            "_operator_swa_full_tokens_ratio", "_DSV4PoolSizes", "DSV4PoolConfigurator",
            "create_memory_pool_configurator"}),
        kvc_module=extract(f["kvc"],
                           {"mm_runtime_reservation_gb"}),
        kvc_methods=extract(f["kvc"], _KVC_METHODS,
                            in_class="KVCacheConfigurator"),
        kvc_method_names=_KVC_METHODS,
    )


# --- The scenario and the result ------------------------------------------------------------------


@dataclass(frozen=True)
class SglangDeployment:
    """One rank of ``sglang serve`` for a DeepSeek-V4 model, as sglang sees it at startup.

    Server args are the *resolved* values (after the V4 hooks), env vars are the
    ``SGLANG_*`` overrides, and the two free-memory readings are what
    ``torch.cuda.mem_get_info`` reports before the weights load and at KV profiling.
    """

    num_hidden_layers: int
    compress_ratios: tuple[int, ...]
    pre_load_free_bytes: int
    profile_free_bytes: int
    mem_fraction_static: float
    qk_nope_head_dim: int = 448
    qk_rope_head_dim: int = 64
    index_head_dim: int = 128
    window_size: int = 128
    context_len: int = 1_048_576
    kv_cache_dtype: str = "fp8_e4m3"
    page_size: int = 256
    enable_deepseek_v4_fp4_indexer: bool = False
    swa_full_tokens_ratio: float = 0.1
    max_running_requests: int = 256
    attn_dp_size: int = 1
    world_size: int = 1
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int | None = None
    hisparse_host_to_device_ratio: int | None = None
    disaggregation_mode: str = "null"
    disaggregation_decode_extra_slots: int = 0
    max_total_tokens: int | None = None
    env: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class SglangSizing:
    """What sglang 0.5.23 computed. ``failure`` is ``"<Error>: <first sentence>"`` when startup
    raises (then the pool fields are None); the configurator's coefficients are always set."""

    failure: str | None
    available_bytes: int | None
    bytes_per_full_token: float
    bytes_per_swa_token: float
    fixed_bytes: int
    ring_sizes: dict[int, int]
    max_total_num_tokens: int | None = None
    swa_max_total_num_tokens: int | None = None
    c4_max_total_num_tokens: int | None = None
    c128_max_total_num_tokens: int | None = None
    c4_state_pool_size: int | None = None
    c128_state_pool_size: int | None = None
    max_running_requests: int | None = None


# --- Per-scenario execution -----------------------------------------------------------------------


class _Gpu:
    """The free bytes ``torch.cuda.mem_get_info`` reports right now."""

    def __init__(self, free: int) -> None:
        self.free = free


def _all_reduce(_tensor: object, op: object = None, group: object = None) -> None:
    """MIN over ranks that all report the same value: the identity (in place)."""


def _torch_stub(gpu: _Gpu) -> _Bag:
    props = _Bag("torch.cuda.get_device_properties()", is_integrated=False)
    cuda = _Bag(
        "torch.cuda",
        device_count=lambda: 1,
        current_device=lambda: 0,
        get_device_properties=lambda _gpu_id: props,
        mem_get_info=lambda _gpu_id=0: (gpu.free, gpu.free),
        empty_cache=_noop,
    )
    return _Bag(
        "torch",
        _absent={"npu"},  # CUDA: is_npu() probes hasattr(torch, "npu")
        version=_Bag("torch.version", hip=None),
        cuda=cuda,
        tensor=torch.tensor,
        float32=torch.float32,
        int64=torch.int64,
        distributed=_Bag("torch.distributed", all_reduce=_all_reduce,
                         ReduceOp=_Bag("torch.distributed.ReduceOp", MIN="MIN")),
    )


def _strict_import(modules: Mapping[str, object]) -> Callable[..., Any]:
    """``__import__`` for the extracted code: sglang modules come from the oracle, the rest is
    the real import (``math``, ``logging``, ...)."""
    real_import = builtins.__import__

    def _import(name: str, globals_: object = None, locals_: object = None,
                fromlist: tuple[str, ...] | None = (), level: int = 0) -> object:
        if name == "sglang" or name.startswith("sglang."):
            if name in modules and fromlist:
                return modules[name]
            raise SglangShapeError(
                f"sglang code now imports {name} (fromlist {fromlist}) inside the sizing "
                f"path, which the oracle does not provide; {_FIX}"
            )
        return real_import(name, globals_, locals_, fromlist or (), level)

    return _import


def _exec(code: CodeType, ns: dict[str, object]) -> dict[str, object]:
    # __name__ must name a module in sys.modules: @dataclass looks the class's module up there
    # (dataclasses._is_type). This oracle module is; the sglang modules are never imported.
    ns.setdefault("__name__", __name__)
    exec(code, ns)
    return ns


def _module(name: str, ns: Mapping[str, object]) -> _Bag:
    return _Bag(f"module {name}", **{k: v for k, v in ns.items() if not k.startswith("__")})


def _first_sentence(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).split('. ')[0]}"


def run_sglang_sizing(d: SglangDeployment) -> SglangSizing:
    """Run sglang 0.5.23's startup sizing for one rank of ``d``.

    Startup failures sglang raises (``ValueError``/``RuntimeError``) come back in
    ``failure``; a configuration sglang rejects while building the configurator (an
    ``AssertionError`` such as a ring too small for the draft tokens) propagates.
    """
    src = load_sources()
    try:
        return _run(src, d)
    except NameError as exc:  # a global the extracted code needs and the oracle did not define
        raise SglangShapeError(f"sglang code references a name the oracle lacks: {exc}; {_FIX}") \
            from exc
    except AttributeError as exc:  # e.g. a DSV4PoolConfigurator method the oracle calls is gone
        raise SglangShapeError(f"sglang code changed shape: {exc}; {_FIX}") from exc


def _run(src: _Sources, d: SglangDeployment) -> SglangSizing:
    gpu = _Gpu(d.pre_load_free_bytes)
    torch_stub = _torch_stub(gpu)
    envs = _Envs(src.env_defaults, d.env)
    spec = _Bag("get_spec()", speculative_algorithm=d.speculative_algorithm,
                speculative_num_draft_tokens=d.speculative_num_draft_tokens,
                max_speculative_num_draft_tokens=None)  # only adaptive algorithms set it
    exec_args = _Bag(
        "get_exec()",
        kernel=_Bag("get_exec().kernel", dsv4_attn_backend="flashmla",
                    enable_deepseek_v4_fp4_indexer=d.enable_deepseek_v4_fp4_indexer),
        features=_Bag("get_exec().features", enable_encoder_swa_bounded_replay=False),
        # Only evaluated for the prefill role, where max_mamba_cache_size=None ends the test.
        graph=_Bag("get_exec().graph", cuda_graph_config=_Bag(
            "cuda_graph_config", prefill=_Bag("cuda_graph_config.prefill", backend=None,
                                              full_prefill_max_req=None))),
    )
    schedule = _Bag(
        "get_schedule()",
        max_running_requests=d.max_running_requests,
        # V4: the model override declares the ratio before handle_cache_compatibility
        # records it, so it is always "explicit" (docs/kvpool-sglang-0.5.23.md §4).
        _swa_full_tokens_ratio_explicitly_set=True,
        swa_full_tokens_ratio=d.swa_full_tokens_ratio,
        swa_prefix_tails=None,
        page_size=d.page_size,
        mem_fraction_static=d.mem_fraction_static,
        max_total_tokens=d.max_total_tokens,
        prefill_max_requests=None,
        max_mamba_cache_size=None,
    )
    memory = _Bag("get_memory()", enable_hisparse=d.hisparse_host_to_device_ratio is not None,
                  disable_radix_cache=False, enable_unified_memory=False)
    disagg = _Bag("get_disagg()", disaggregation_mode=d.disaggregation_mode,
                  disaggregation_decode_extra_slots=d.disaggregation_decode_extra_slots)
    parallel = _Bag("get_parallel()", launch_world_size=d.world_size, pp_size=1,
                    world_group=_Bag("world_group", cpu_group=None))
    mm = _Bag("get_mm()", mm_feature_transport=None)
    getters: dict[str, object] = {
        "get_exec": lambda: exec_args, "get_schedule": lambda: schedule, "get_spec": lambda: spec,
        "get_memory": lambda: memory, "get_disagg": lambda: disagg,
        "get_parallel": lambda: parallel, "get_mm": lambda: mm,
    }
    modules: dict[str, object] = {}
    bi = dict(vars(builtins), __import__=_strict_import(modules))

    def ns(**extra: object) -> dict[str, object]:
        return {"__builtins__": bi, "logger": _QUIET, "envs": envs, "torch": torch_stub,
                **getters, **extra}

    utils = _exec(src.utils, ns(lru_cache=functools.lru_cache))
    platform = {k: utils[k] for k in ("is_hip", "is_npu", "ceil_div", "ceil_align")}
    runtime = _exec(src.runtime, ns())
    gate = _exec(src.gate, ns(
        functools=functools, is_hip=utils["is_hip"], is_gfx95_supported=lambda: False))
    pool = _exec(src.pool, ns(
        **platform, KVLayout=src.kv_layout.KVLayout, is_gfx95_supported=lambda: False,
        resolve_hip_flashmla_backend=lambda: None,
        DSV41_INDEX_PAGE_SIZE=64))  # only read for ratio-1/2 layers (0 of them in V4-Flash)
    pool_exports = {k: pool[k] for k in (
        "collect_sources_by_ratio", "get_compress_state_write_pad", "get_draft_swa_ring_size",
        "get_dsv4_indexer_bytes_per_token", "get_swa_ring_size",
        "resolve_compress_state_ring_size", "uses_draft_swa_ring")}
    conf = _exec(src.configurator, ns(
        **platform, **pool_exports, dataclass=dataclass,
        max_speculative_num_draft_tokens=runtime["max_speculative_num_draft_tokens"],
        is_deepseek_v4=lambda _hf_config: True))
    kvc_ns = _exec(src.kvc_module, ns(
        gc=_Bag("gc", collect=_noop), logging=_QUIET, math=math,
        Backend=_Bag("Backend", FULL="full"),
        get_available_gpu_memory=utils["get_available_gpu_memory"]))
    _exec(src.kvc_methods, kvc_ns)
    hisparse = _Bag("SparseConfig", host_to_device_ratio=d.hisparse_host_to_device_ratio)
    modules.update({
        "sglang.srt.model_executor.pool_configurator": _module("pool_configurator", conf),
        "sglang.srt.mem_cache.deepseek_v4_memory_pool": _module("deepseek_v4_memory_pool", pool),
        "sglang.srt.layers.attention.dsv4.unified_kv_gate": _module("unified_kv_gate", gate),
        "sglang.srt.mem_cache.sparsity": _Bag("module sparsity",
                                              parse_hisparse_config=lambda: hisparse),
    })

    algo = d.speculative_algorithm
    kvc_cls = type("KVCacheConfigurator", (_Bag,),
                   {name: kvc_ns[name] for name in src.kvc_method_names})
    kvc = kvc_cls(
        "KVCacheConfigurator",
        kv_cache_dtype_str=d.kv_cache_dtype,
        model_config=_Bag(
            "model_config", qk_nope_head_dim=d.qk_nope_head_dim,
            qk_rope_head_dim=d.qk_rope_head_dim, index_head_dim=d.index_head_dim,
            context_len=d.context_len, compress_ratios=list(d.compress_ratios),
            window_size=d.window_size, is_multimodal=False,
            hf_config=_Bag("hf_config", kv_source_layer_ids=[])),
        layer_info=_Bag("layer_info", start_layer=0, end_layer=d.num_hidden_layers),
        pp_size=1, sliding_window_size=d.window_size, page_size=d.page_size,
        attn_dp_size=d.attn_dp_size, is_draft_worker=False, is_hybrid_swa=True,
        device="cuda", gpu_id=0, mambaish_config=None, post_capture_kv_active=False,
        spec_algorithm=_Bag("spec_algorithm", is_none=lambda: algo is None,
                            is_eagle=lambda: algo == "EAGLE", is_dspark=lambda: algo == "DSPARK"),
    )

    # measure_pre_model_load_memory (distributed/bootstrap.py L207-212): the baseline.
    pre = utils["get_available_gpu_memory"]("cuda", 0, distributed=d.world_size > 1,
                                            cpu_group=None)
    configurator = conf["create_memory_pool_configurator"](kvc)
    gpu.free = d.profile_free_bytes  # weights (and draft weights) are loaded now
    requested = configurator._resolve_max_running_requests_per_worker(0)
    # The five fixed terms calculate_pool_sizes subtracts, each sglang's own method.
    fixed = (configurator._get_c128_state_fixed_bytes(requested)
             + configurator._get_c2_state_fixed_bytes(requested)
             + configurator._get_swa_fixed_bytes()
             + configurator._fixed_swa_bytes(requested)
             + configurator._fixed_c4_state_bytes(requested))
    common = dict(bytes_per_full_token=configurator.bytes_per_full_token,
                  bytes_per_swa_token=configurator.bytes_per_swa_token,
                  fixed_bytes=fixed, ring_sizes=dict(configurator.ring_sizes))
    try:
        available = kvc._profile_available_bytes(pre)
        config = kvc._resolve_memory_pool_config(pre)
    except (ValueError, RuntimeError) as exc:
        return SglangSizing(failure=_first_sentence(exc), available_bytes=None, **common)
    return SglangSizing(
        failure=None,
        available_bytes=available,
        max_total_num_tokens=config.max_total_num_tokens,
        swa_max_total_num_tokens=config.swa_max_total_num_tokens,
        c4_max_total_num_tokens=config.c4_max_total_num_tokens,
        c128_max_total_num_tokens=config.c128_max_total_num_tokens,
        c4_state_pool_size=config.c4_state_pool_size,
        c128_state_pool_size=config.c128_state_pool_size,
        max_running_requests=config.max_running_requests,
        **common,
    )


def kv_layout_page_bytes(page_tokens: int) -> int:
    """``KVLayout.V4.page_bytes(page_tokens)`` of the installed sglang."""
    return int(load_sources().kv_layout.KVLayout.V4.page_bytes(page_tokens))
