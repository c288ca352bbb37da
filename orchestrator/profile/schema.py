"""The profile schema: one YAML document that says what should run on a host.

This module owns the *shape* of a profile (types, ranges, required fields, defaults). Whether a valid
profile also makes sense for the chosen engine version, model and GPUs (``index_topk`` values the engine
accepts, GPUs used twice, TP dividing the heads, memory) is the planner's job: those answers depend on the
catalog and the host, and they come back as checks with stable ids that a profile can acknowledge.

About 400 lines: one class per profile section, each field with its range and description (the
JSON Schema for editors, :mod:`.jsonschema`, is generated from them), so it grows with the
profile.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from orchestrator.profile.inventory import Host
from orchestrator.profile.types import (
    AbsPath,
    EnvName,
    Port,
    SafePath,
    ServedName,
    Slug,
    Text,
    Tokens,
)

API_VERSION = "dsv4ctl/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Engine(_Strict):
    name: Literal["sglang"] = Field(default="sglang", description="Serving engine.")
    version: str = Field(
        default="0.5.23",
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+([a-z0-9.+-]*)$",
        description="Pinned engine version; the catalog holds its flags, defaults and constraints.",
    )
    env: SafePath = Field(
        default="/opt/sglang",
        description="Engine environment (virtualenv prefix) on the host: <env>/bin/sglang must exist.",
    )
    router_version: str = Field(
        default="0.3.2",
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        description="Pinned sglang-router version (PD topologies).",
    )


class Model(_Strict):
    variant: str = Field(
        min_length=1,
        max_length=100,
        description="Catalog model variant id, e.g. dsv4-flash-nvfp4 (see `dsv4ctl catalog`).",
    )
    path: AbsPath = Field(description="Checkpoint directory on the host.")
    served_name: ServedName = Field(
        default="deepseek-v4-flash", description="Name clients use (/v1/models)."
    )
    revision: Annotated[str, Field(pattern=r"^[A-Za-z0-9._/-]{1,100}$")] | None = Field(
        default=None, description="Hugging Face revision (branch, tag or commit) to download."
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Pass --trust-remote-code: let the engine run Python code shipped in the "
        "checkpoint directory. Off by default; `dsv4ctl plan` says whether the checkpoint needs it.",
    )
    expert_storage: Literal["native", "fp8", "bf16"] = Field(
        default="native",
        description=(
            "How routed experts sit in GPU memory: native (checkpoint fp4), fp8 (dequantized at load), "
            "bf16."
        ),
    )


class Moe(_Strict):
    runner_backend: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,64}$")] = Field(
        default="auto",
        description="SGLang --moe-runner-backend; 'auto' lets the engine choose (the plan shows what).",
    )


class Attention(_Strict):
    index_topk: int | None = Field(
        default=None,
        ge=1,
        le=1 << 20,
        description="DSA indexer top-k; SGLang 0.5.23 accepts 512 or 1024. Default: the model's.",
    )
    kv_cache_dtype: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,32}$")] = Field(
        default="fp8_e4m3", description="KV cache dtype. SGLang 0.5.23 starts DeepSeek-V4 on CUDA "
        "with fp8_e4m3 only: its argument check also passes bfloat16, which has no V4 KV pool on "
        "CUDA."
    )
    context_length: Tokens | None = Field(
        default=None,
        ge=1,
        le=1 << 24,
        description="Maximum tokens per request (65536, 64K, 1M); default: the model's maximum.",
    )
    fp4_indexer: bool = Field(
        default=False, description="--enable-deepseek-v4-fp4-indexer (experimental)."
    )


class ServingKnobs(_Strict):
    """Per-role overrides of the serving section; unset fields inherit."""

    mem_fraction_static: float | None = Field(
        default=None, gt=0.0, lt=1.0,
        description="SGLang --mem-fraction-static for this role: weights + KV pool as a fraction "
        "of GPU memory. Unset: serving.mem_fraction_static.")
    max_running_requests: int | None = Field(
        default=None, ge=1, le=65536,
        description="SGLang --max-running-requests: requests a rank runs at once. Unset: the "
        "engine's V4 default (256).")
    chunked_prefill_size: Tokens | None = Field(
        default=None, ge=-1, le=1 << 20,
        description="SGLang --chunked-prefill-size: tokens of a prompt prefilled per step (8192, "
        "8K); -1 disables chunking. Unset: the engine's default for the GPU.")
    cuda_graph_max_bs: int | None = Field(
        default=None, ge=1, le=4096,
        description="SGLang --cuda-graph-max-bs: the largest decode batch captured as a CUDA "
        "graph; graphs cost GPU memory outside the static pool. Unset: the engine's default.")

    @model_validator(mode="after")
    def _chunk(self) -> ServingKnobs:
        if self.chunked_prefill_size == 0:
            raise ValueError("chunked_prefill_size must be -1 (disabled) or positive, not 0")
        return self


class SamplingDefaults(_Strict):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0,
                               description="Sampling temperature when a request sets none.")
    top_p: float = Field(default=0.95, gt=0.0, le=1.0,
                         description="Nucleus sampling top_p when a request sets none.")


class Serving(ServingKnobs):
    mem_fraction_static: float | None = Field(
        default=0.85,
        gt=0.0,
        lt=1.0,
        description="SGLang --mem-fraction-static: weights + KV pool as a fraction of GPU memory.",
    )
    sampling_defaults: SamplingDefaults = Field(
        default_factory=SamplingDefaults,
        description="Applied when a request omits them (model card: temperature 1.0, top_p 0.95).",
    )
    enable_cache_report: bool = Field(
        default=True, description="SGLang --enable-cache-report: report cached prompt tokens in "
        "each response's usage.")
    watchdog_timeout_s: int = Field(
        default=1800, ge=30, le=86400,
        description="SGLang --watchdog-timeout: seconds a forward step may hang before the engine "
        "kills itself.")


class Role(ServingKnobs):
    gpus: list[Annotated[int, Field(ge=0, le=63)]] = Field(
        min_length=1, max_length=64, description="GPU indices (nvidia-smi order) this role uses."
    )
    tp: int = Field(ge=1, le=64, description="Tensor-parallel size; equals the number of GPUs.")
    ep: int = Field(default=1, ge=1, le=64, description="Expert-parallel size (1 or tp).")
    attn_dp: int = Field(
        default=1, ge=1, le=64, description="Attention data-parallel groups inside the TP group."
    )
    port: Port | None = Field(default=None, description="HTTP port; default depends on the role.")
    nccl_port: Port | None = Field(
        default=None, description="SGLang --nccl-port for the role's TP group. Unset: chosen by "
        "dsv4ctl from the role's port.")
    engine_info_bootstrap_port: Port | None = Field(
        default=None, description="SGLang --engine-info-bootstrap-port. Unset: chosen by "
        "dsv4ctl from the role's port.")
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        description="Extra engine flags, checked against the pinned engine's flag table.",
    )
    env: dict[EnvName, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, description="Extra environment variables for this role's engine."
    )
    hosts: list[Slug] | None = Field(
        default=None, min_length=1, max_length=1024,
        description="Fleets: the fleet hosts that run this role. Unset: every host. "
        "Prefill on some hosts and decode on others is cross-host PD: the KV cache crosses the "
        "network (the plan estimates its transfer time from the hosts' link_gbps).",
    )


class PrefillRole(Role):
    bootstrap_port: Port | None = Field(
        default=None, description="--disaggregation-bootstrap-port served by the prefill engine."
    )


class Router(_Strict):
    host: Annotated[str, Field(pattern=r"^[0-9a-fA-F.:]+$")] = Field(
        default="127.0.0.1",
        description="Address the router listens on (clients connect here). Default: loopback, "
        "reachable only from the router's own host. To serve clients elsewhere, set the host's "
        "address on the clients' network, or 0.0.0.0 / :: (every interface, which plan refuses "
        "unless the profile acknowledges exposure.all-interfaces); beyond loopback, set an API "
        "key too (secrets.DSV4_SECRET_API_KEY or DSV4_SECRET_ROUTER_API_KEY).",
    )
    port: Port = Field(default=8000, description="Client-facing port.")
    prometheus_port: Port = Field(default=29000, description="Router metrics port.")
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two"] = Field(
        default="cache_aware", description="sglang-router --policy: how requests pick a worker.")
    runs_on: Slug | None = Field(
        default=None,
        description="Fleets: the inventory host that runs the router, one of the "
        "fleet's hosts or a host of its own (it needs no GPU). Unset: the fleet's first host.",
    )


class ColocatedTopology(_Strict):
    mode: Literal["colocated"] = Field(description="One engine on the role's GPUs.")
    engine: Role = Field(description="The engine's GPUs, parallelism and serving knobs.")
    router: Router | None = Field(
        default=None,
        description="Fleets: the router in front of every host's engine (regular "
        "mode). Unset: a fleet of one has none (clients reach the engine), a larger fleet the "
        "default router on its first host.",
    )


class PDTopology(_Strict):
    mode: Literal["pd"] = Field(description="Prefill/decode disaggregation behind the router.")
    prefill: PrefillRole = Field(description="The prefill engine's GPUs, parallelism and knobs.")
    decode: Role = Field(description="The decode engine's GPUs, parallelism and knobs.")
    transfer_backend: Literal["mooncake", "mooncake_tcp", "nixl"] = Field(
        default="mooncake_tcp",
        description="KV transfer between prefill and decode; mooncake needs RDMA NICs.",
    )
    router: Router = Field(default_factory=Router,
                           description="The sglang-router clients connect to.")


Topology = Annotated[ColocatedTopology | PDTopology, Field(discriminator="mode")]


class Speculative(_Strict):
    algorithm: Literal["none", "eagle", "dspark"] = Field(
        default="none", description="DeepSeek-V4 allows EAGLE (MTP, top-k 1) or DSpark (-0731)."
    )
    num_steps: int | None = Field(
        default=None, ge=1, le=16,
        description="SGLang --speculative-num-steps. Unset: the engine's default.")
    num_draft_tokens: Tokens | None = Field(
        default=None, ge=1, le=64,
        description="SGLang --speculative-num-draft-tokens (EAGLE). Unset: the engine's default.")
    dspark_block_size: int | None = Field(
        default=None, ge=1, le=16,
        description="SGLang --speculative-dspark-block-size (DSpark). Unset: the engine's default.")


class Workload(_Strict):
    """What the KV pool must hold at once; the planner checks it against the pool size."""

    concurrent_requests: int = Field(
        default=64, ge=1, le=65536, description="Requests in flight at the same time."
    )
    context_tokens: Tokens = Field(
        default=32768, ge=1, le=1 << 24,
        description="Tokens per request (prompt + output); 32768, 32K, 1M."
    )
    longest_request_tokens: Tokens | None = Field(
        default=None, ge=1, le=1 << 24,
        description="The longest single request (prompt + output; 131072, 128K, 1M) the "
        "deployment must serve; "
        "the headroom check sizes the prefill workspace for it. Unset: context_tokens.",
    )


KernelChoice = Literal["auto", "engine", "bundled"]
#: the ops whose SGLang 0.5.23 entry point the bundled kernels can replace, in plan order
KERNEL_OPS = ("attention", "indexer", "mhc_pre")
# kernels.enabled / kernels.bf16_gemms (before per-op choices): what each old value means now.
# `enabled: true` meant "always the bundled kernels", which made sm_120 hosts slower than SGLang
# alone; it now means what leaving it out means (auto: the engine's path unless the bundled one
# is needed or measured faster). The plan says so (check kernels.deprecated-key).
LEGACY_KERNEL_KEYS = {
    ("enabled", False): {"attention": "engine", "indexer": "engine", "mhc_pre": "engine"},
    ("enabled", True): {},
    ("bf16_gemms", False): {"mhc_pre": "engine"},
    ("bf16_gemms", True): {},
}


def _choice(op: str, what: str) -> KernelChoice:
    return Field(default="auto", description=(
        f"Which {what} runs: auto (SGLang's own path unless the profile puts it outside what that "
        "path supports, a stored `dsv4ctl qualify kernels` measurement says the bundled kernel is "
        "faster, or the engine has no tensor-core path on the GPU), engine (always SGLang's), or "
        "bundled (always dsv4ctl's kernel). `dsv4ctl plan --explain` says what auto picked and why."))


class Kernels(_Strict):
    attention: KernelChoice = _choice("attention", "sparse-MLA attention (sm_120: FlashInfer's "
                                      "sparse MLA in SGLang 0.5.23, or the bundled Triton decode)")
    indexer: KernelChoice = _choice("indexer", "indexer paged MQA logits (sm_120: SGLang's "
                                    "TileLang kernel, or the bundled Triton indexer)")
    mhc_pre: KernelChoice = _choice("mhc_pre", "mHC pre GEMM at the sublayer boundaries (sm_120: "
                                    "SGLang's FP32 boundary, or the bundled bf16 tensor-core one)")
    selftest: bool = Field(default=True, description="Run the self-test of the bundled kernels "
                           "this release uses before switching to it.")
    _legacy: dict[str, bool] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _migrate(cls, data: Any, handler: Any) -> Kernels:
        """Map the keys of the single switch (kernels.enabled, kernels.bf16_gemms) onto per-op
        choices (LEGACY_KERNEL_KEYS); an old key and a new one for the same op conflict."""
        legacy: dict[str, bool] = {}
        if isinstance(data, dict) and {"enabled", "bf16_gemms"} & data.keys():
            data = dict(data)
            for key in ("enabled", "bf16_gemms"):
                if key not in data:
                    continue
                value = data.pop(key)
                if not isinstance(value, bool):
                    raise ValueError(f"kernels.{key} = {value!r}: must be true or false (it is "
                                     "replaced by kernels.attention/indexer/mhc_pre: auto, "
                                     "engine or bundled)")
                legacy[key] = value
                for op, choice in LEGACY_KERNEL_KEYS[(key, value)].items():
                    # auto leaves the choice to dsv4ctl, so the old key's explicit answer stands
                    if data.get(op, "auto") not in ("auto", choice):
                        raise ValueError(
                            f"kernels.{key}: {str(value).lower()} means kernels.{op}: {choice}, "
                            f"and kernels.{op} is {data[op]!r}; remove kernels.{key} (replaced "
                            "by the per-op choices)")
                    data[op] = choice
        model = handler(data)
        model._legacy = legacy
        return model

    @property
    def legacy_keys(self) -> dict[str, bool]:
        """The old keys this section was written with (for the plan's deprecation check)."""
        return dict(self._legacy)


class AlertThresholds(_Strict):
    kv_usage_high: float = Field(default=0.90, gt=0.0, le=1.0,
                                 description="Alert when the KV pool is fuller than this fraction.")
    swa_usage_high: float = Field(
        default=0.95, gt=0.0, le=1.0,
        description="Alert when the sliding-window pool is fuller than this fraction.")
    queue_high: int = Field(default=32, ge=1,
                            description="Alert when more requests than this wait in the queue.")
    ttft_p95_s: float = Field(default=10.0, gt=0.0,
                              description="Alert when the p95 time to first token exceeds this.")
    itl_p95_s: float = Field(default=0.25, gt=0.0,
                             description="Alert when the p95 inter-token latency exceeds this.")
    spec_accept_length_min: float = Field(
        default=1.5, gt=0.0,
        description="Alert when speculative decoding accepts fewer tokens a step than this.")
    for_minutes: int = Field(default=5, ge=1, le=1440,
                             description="How long a condition must hold before it alerts.")
    gpu_memory_over_plan: float = Field(
        default=0.05, ge=0.0, le=1.0,
        description="DSV4GPUMemoryAbovePlan fires when a GPU's framebuffer in use exceeds the "
        "plan's prediction for it by more than this share (0.05: 5%).")


class Monitoring(_Strict):
    enabled: bool = Field(default=True, description="Render the Prometheus scrape config, alert "
                          "rules and Grafana dashboard with the release.")
    scrape_interval_s: int = Field(default=15, ge=1, le=3600,
                                   description="Prometheus scrape interval, in seconds.")
    alerts: AlertThresholds = Field(default_factory=AlertThresholds,
                                    description="Thresholds of the rendered alert rules.")
    textfile_dir: SafePath | None = Field(
        default=None,
        description="node-exporter textfile collector dir for dsv4ctl's own metrics (optional).",
    )
    gpu_exporter: Literal["dcgm", "none"] = Field(
        default="dcgm",
        description="GPU metrics exporter scraped beside the engines on every engine host: "
        "'dcgm' (NVIDIA dcgm-exporter, its default listener :9400 and default counters; it is "
        "not installed by dsv4ctl) or 'none' (no GPU job, no GPU rows or alerts).",
    )
    gpu_exporter_port: Port = Field(
        default=9400,
        description="Port of the GPU exporter on each engine host (dcgm-exporter's default "
        "listener is :9400, NVIDIA dcgm-exporter command reference).",
    )
    prometheus_url: Annotated[str, Field(pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/-]*)?$",
                                         max_length=300)] | None = Field(
        default=None,
        description="HTTP API base of the Prometheus that scrapes this deployment (for example "
        "http://prom.internal:9090), read by rollout.analysis between waves. Unset: no canary "
        "analysis (the plan says so).",
    )


class Qualify(_Strict):
    min_recall_tokens: Tokens | None = Field(
        default=None, ge=1,
        description="After health, a needle-in-a-haystack recall probe must pass at this context "
        "length (32K, 1M). Unset: no recall probe.")
    min_output_tok_s: float | None = Field(
        default=None, gt=0,
        description="After health, a load probe must reach this output throughput (tokens/s). "
        "Unset: no throughput floor.")
    load_concurrency: int = Field(default=16, ge=1, le=4096,
                                  description="Concurrent requests of the load probe.")
    load_duration_s: float = Field(default=30.0, gt=0, le=3600,
                                   description="How long the load probe runs, in seconds.")
    on_fail: Literal["rollback", "keep"] = Field(
        default="rollback", description="A failed qualification rolls back, or keeps the release "
        "and reports it.")


class Health(_Strict):
    startup_timeout_s: int = Field(
        default=1800, ge=10, le=86400, description="How long an engine may take to become ready."
    )
    poll_interval_s: float = Field(default=5.0, gt=0, le=300,
                                   description="Seconds between health polls while starting.")
    stability_window_s: float | None = Field(
        default=None, ge=0, le=3600,
        description="After every check passes, keep watching this long; a crash, restart or "
        "failing check in the window fails the apply (and rolls back). Default: the router's "
        "health-check interval x its failure threshold (sglang-router 0.3.2: 60 s x 3 = 180 s, "
        "research/sglang.md §3), the time the router itself needs to drop a dead worker.",
    )
    smoke_prompt: Text = Field(default="Reply with the single word: ready",
                               description="The chat prompt of the smoke test after health.")
    smoke_max_tokens: Tokens = Field(default=16, ge=1, le=4096,
                                     description="max_tokens of the smoke test's request.")
    qualify: Qualify | None = Field(
        default=None, description="Optional probes after health (recall, throughput). Unset: "
        "none.")


class RolloutStrategy(_Strict):
    """How a fleet moves to a new release (orchestrator/apply/rollout.py): the canary
    hosts first, then waves; each host drained through the router, applied, put back."""

    canary: int = Field(default=1, ge=0, le=1000, description=(
        "Hosts applied alone first; if one fails the rollout stops there. 0: no canary wave."))
    max_unavailable: int = Field(default=1, ge=1, le=10000, description=(
        "Most hosts out of the router at once (the size of every wave after the canary)."))
    max_failures: int = Field(default=0, ge=0, le=10000, description=(
        "Failed hosts (each rolled back to its previous release) tolerated before the rollout "
        "stops; 0: the first failure stops it."))
    pause_s: float = Field(default=0.0, ge=0, le=86400, description=(
        "Seconds to wait between waves (time to watch the dashboards)."))
    drain_timeout_s: float = Field(default=120.0, ge=0, le=86400, description=(
        "How long a host's engines may take to finish their running requests after it left the "
        "router; then it is applied anyway."))


class AnalysisCheck(_Strict):
    """One comparison of the wave just moved (the canary first) against the hosts not yet moved
    (the baseline), from the engines' own metrics in the fleet's Prometheus."""

    metric: Literal["ttft_p95", "itl_p95", "e2e_p95", "abort_ratio"] = Field(description=(
        "ttft_p95 / itl_p95 / e2e_p95: 95th percentile time to first token, inter-token and "
        "end-to-end latency (SGLang's histograms); abort_ratio: aborted / all requests."))
    window_s: int = Field(default=60, ge=10, le=3600, description=(
        "Range the metric is computed over, ending when the analysis runs."))
    max_increase: float | None = Field(default=None, ge=0.0, le=100.0, description=(
        "Fail when the wave's value exceeds the baseline's by more than this share "
        "(0.5: more than 50% worse)."))
    max: float | None = Field(default=None, ge=0.0, description=(
        "Fail when the wave's value exceeds this (seconds, or a share for abort_ratio)."))

    @model_validator(mode="after")
    def _a_threshold(self) -> AnalysisCheck:
        if self.max_increase is None and self.max is None:
            raise ValueError("give max_increase (against the baseline), max (absolute), or both")
        return self


class Analysis(_Strict):
    """Canary analysis between waves (read from ``monitoring.prometheus_url``)."""

    checks: list[AnalysisCheck] = Field(default_factory=list, max_length=20, description=(
        "Comparisons each wave must pass before the rollout goes on (at most 20); none: no "
        "analysis, the waves gate on health and the smoke prompt only."))
    wait_s: float | None = Field(default=None, ge=0, le=86400, description=(
        "Seconds the moved wave serves before the comparison (default: the longest window_s), "
        "so the window holds the new release's requests only."))
    min_requests: int = Field(default=10, ge=1, le=1_000_000, description=(
        "Requests the wave must have served in the window; fewer is a failed analysis (no "
        "evidence is not a pass)."))


class Rollout(_Strict):
    keep_releases: int = Field(default=5, ge=2, le=100,
                               description="Releases kept on the host; older ones are pruned.")
    rollback_on_failure: bool = Field(
        default=True, description="A failed apply restores the previous release.")
    rollback_timeout_s: int = Field(
        default=1800, ge=10, le=86400,
        description="How long the restored release may take to become healthy again.")
    strategy: RolloutStrategy = Field(default_factory=RolloutStrategy,
                                      description="How a fleet moves: canary, waves, drains.")
    analysis: Analysis = Field(default_factory=Analysis, description=(
        "Canary analysis between the waves of a fleet rollout (needs monitoring.prometheus_url)."))


class SecretRef(_Strict):
    """Where the controller reads a secret at apply time. The value is never stored in a profile."""

    env: EnvName | None = Field(default=None, description="Read from this controller env var.")
    file: AbsPath | None = Field(
        default=None,
        description="Read from this regular file on the controller; never under /proc, /dev or "
        "/sys (checked again after resolving symbolic links, at apply time).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' or 'file'")
        if self.file is not None and forbidden_secret_dir(self.file):
            raise ValueError(
                f"file {self.file!r} is under {forbidden_secret_dir(self.file)}, which is not a "
                "secret store (/proc/self/environ would ship the controller's whole environment); "
                "put the secret in a regular file, or use env:")
        return self


# Pseudo filesystems: their "files" are the controller's memory, environment and devices.
FORBIDDEN_SECRET_DIRS = ("/proc", "/dev", "/sys")


def forbidden_secret_dir(path: str) -> str | None:
    """The pseudo filesystem ``path`` lies under, if any (lexically; callers resolve links)."""
    import posixpath

    norm = "/" + posixpath.normpath(path).lstrip("/")  # "//proc" is /proc too
    return next((d for d in FORBIDDEN_SECRET_DIRS if norm == d or norm.startswith(d + "/")), None)


class Acknowledgement(_Strict):
    id: Annotated[str, Field(pattern=r"^[a-z0-9-]+(\.[a-z0-9-]+)+$")] = Field(
        description="Check id to accept, e.g. recall.index-topk-512."
    )
    reason: Text = Field(min_length=3, description="Why this warning is acceptable here.")


class Profile(_Strict):
    api_version: Literal["dsv4ctl/v1"] = Field(default=API_VERSION, alias="apiVersion",
                                               description="Profile format version.")
    name: Slug = Field(description="Deployment name; prefixes unit names (dsv4-<name>-<role>).")
    description: Text | None = Field(default=None, description="Free text for humans.")
    host: Slug | Host | None = Field(
        default=None,
        description="Inventory host name, or an inline host definition (a fleet of one).")
    hosts: Slug | Annotated[list[Slug], Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="Fleets: an inventory group name, or a list of inventory host "
        "names, that all run this profile behind one router. Give host or hosts, not both.",
    )
    engine: Engine = Field(default_factory=Engine, description="The serving engine and its env.")
    model: Model = Field(description="The checkpoint and how it is served.")
    moe: Moe = Field(default_factory=Moe, description="The MoE kernel choice.")
    attention: Attention = Field(default_factory=Attention,
                                 description="Sparse attention, KV cache and context length.")
    topology: Topology = Field(description="Colocated (one engine) or PD (prefill + decode "
                               "behind a router), with each role's GPUs.")
    serving: Serving = Field(default_factory=Serving,
                             description="Serving knobs of every role (a role may override).")
    speculative: Speculative = Field(default_factory=Speculative,
                                     description="Speculative decoding (EAGLE/MTP or DSpark).")
    workload: Workload = Field(default_factory=Workload,
                               description="What the deployment must hold at once.")
    kernels: Kernels = Field(default_factory=Kernels, description="dsv4ctl's bundled kernels.")
    monitoring: Monitoring = Field(default_factory=Monitoring,
                                   description="Prometheus, alerts and the Grafana dashboard.")
    health: Health = Field(default_factory=Health,
                           description="Health checks and the stability window of apply.")
    rollout: Rollout = Field(default_factory=Rollout,
                             description="Releases kept, rollback and a fleet's waves.")
    secrets: dict[EnvName, SecretRef] = Field(
        default_factory=dict,
        description="Secrets for the engine env (e.g. HF_TOKEN), written to a 0600 env file. "
        "DSV4_SECRET_<FLAG> names set the engine's secret flags (DSV4_SECRET_API_KEY -> "
        "--api-key, DSV4_SECRET_ADMIN_API_KEY, DSV4_SECRET_SSL_KEYFILE_PASSWORD; the router's: "
        "DSV4_SECRET_ROUTER_API_KEY, default the engines' key; not with DSV4_SECRET_API_KEY: "
        "sglang-router 0.3.2 has one key for clients and engines), which extra_args refuses. Names "
        "dsv4ctl renders (CUDA_VISIBLE_DEVICES, kernel switches, a role's env) or the loader reads "
        "(PATH, LD_*, PYTHON*) are refused.",
    )
    acknowledge: list[Acknowledgement] = Field(
        default_factory=list, description="Warnings accepted on purpose, by check id."
    )

    @model_validator(mode="after")
    def _one_target(self) -> Profile:
        if (self.host is None) == (self.hosts is None):
            raise ValueError(
                "give exactly one of 'host' (one host: an inventory name or an inline host) or "
                "'hosts' (a fleet: an inventory group name or a list of host names)"
                if self.host is None else
                "'host' and 'hosts' are both set: keep 'host' for one host or 'hosts' for a fleet")
        if isinstance(self.hosts, list) and len(set(self.hosts)) != len(self.hosts):
            dup = sorted({h for h in self.hosts if self.hosts.count(h) > 1})
            raise ValueError(f"hosts lists {', '.join(dup)} more than once; name each host once")
        return self

    def roles(self) -> dict[str, Role]:
        """Engine roles by name, in a stable order."""
        topo = self.topology
        if isinstance(topo, ColocatedTopology):
            return {"engine": topo.engine}
        return {"prefill": topo.prefill, "decode": topo.decode}


def knob(profile: Profile, role: Role, name: str) -> object:
    """A serving knob for one role: the role's override, else the profile-wide value."""
    value = getattr(role, name)
    return value if value is not None else getattr(profile.serving, name)
