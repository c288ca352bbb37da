"""The resolved deployment: a profile with every default filled in, in the terms the engine uses.

A profile leaves many things unsaid (ports, per-role knobs that inherit, the model's default
``index_topk``). ``resolve`` turns it into a :class:`Deployment` where each value is final, so the
renderer, the diff and the apply steps all read one answer instead of re-deriving defaults. It is a pure
function of the profile, the host entry and two model facts from the catalog.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.profile.inventory import Host
from orchestrator.profile.schema import (
    ColocatedTopology,
    PDTopology,
    PrefillRole,
    Profile,
    Role,
    knob,
)

RoleName = Literal["engine", "prefill", "decode"]

# Default ports per role. They are distinct on purpose: prefill and decode run on one host, and SGLang
# needs separate --port, --nccl-port and --engine-info-bootstrap-port per instance (sglang 0.5.23
# server args: "must be set explicitly when running multiple instances on the same node").
DEFAULT_PORTS: dict[str, dict[str, int]] = {
    "engine": {"port": 30000, "nccl_port": 30300, "engine_info_bootstrap_port": 6789},
    "prefill": {"port": 30001, "nccl_port": 30301, "engine_info_bootstrap_port": 6789,
                "bootstrap_port": 8998},
    "decode": {"port": 30002, "nccl_port": 30401, "engine_info_bootstrap_port": 6790},
}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RoleDeployment(_Frozen):
    name: RoleName
    unit: str  # systemd unit name, e.g. dsv4-default-decode.service
    disaggregation_mode: Literal["prefill", "decode"] | None
    gpus: tuple[int, ...]
    tp: int
    ep: int
    attn_dp: int
    port: int
    nccl_port: int
    engine_info_bootstrap_port: int
    bootstrap_port: int | None  # prefill only: --disaggregation-bootstrap-port
    mem_fraction_static: float | None
    max_running_requests: int | None
    chunked_prefill_size: int | None
    cuda_graph_max_bs: int | None
    extra_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # sorted

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class RouterDeployment(_Frozen):
    unit: str
    host: str
    port: int
    prometheus_port: int
    policy: str
    prefill: tuple[tuple[str, int], ...]  # (url, bootstrap port)
    decode: tuple[str, ...]


class Deployment(_Frozen):
    name: str
    host: str
    scope: Literal["system", "user"]
    install_root: str
    service_user: str
    rdma: bool
    engine_name: str
    engine_version: str
    router_version: str
    engine_env: str
    model_variant: str
    model_path: str
    served_name: str
    trust_remote_code: bool
    model_revision: str | None
    expert_storage: str
    moe_runner_backend: str
    index_topk: int
    kv_cache_dtype: str
    context_length: int
    fp4_indexer: bool
    speculative_algorithm: str  # none | eagle | dspark
    speculative_num_steps: int | None
    speculative_num_draft_tokens: int | None
    speculative_dspark_block_size: int | None
    temperature: float
    top_p: float
    enable_cache_report: bool
    watchdog_timeout_s: int
    transfer_backend: str | None
    roles: tuple[RoleDeployment, ...]
    router: RouterDeployment | None
    kernels_enabled: bool
    kernels_selftest: bool
    kernels_bf16_gemms: bool  # kernels.bf16_gemms, and only when kernels.enabled
    secret_names: tuple[str, ...]  # names only; values never enter a plan

    def role(self, name: str) -> RoleDeployment:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def entry_url(self) -> str:
        """Where clients (and the smoke test) send requests: the router in PD, else the engine."""
        if self.router is not None:
            return f"http://127.0.0.1:{self.router.port}"
        return self.roles[0].url


def unit_name(deployment_name: str, role: str) -> str:
    return f"dsv4-{deployment_name}-{role}.service"


def _role(profile: Profile, name: RoleName, role: Role, mode: Literal["prefill", "decode"] | None
          ) -> RoleDeployment:
    ports = DEFAULT_PORTS[name]
    bootstrap = None
    if isinstance(role, PrefillRole):
        bootstrap = role.bootstrap_port or ports["bootstrap_port"]
    return RoleDeployment(
        name=name,
        unit=unit_name(profile.name, name),
        disaggregation_mode=mode,
        gpus=tuple(role.gpus),
        tp=role.tp,
        ep=role.ep,
        attn_dp=role.attn_dp,
        port=role.port or ports["port"],
        nccl_port=role.nccl_port or ports["nccl_port"],
        engine_info_bootstrap_port=role.engine_info_bootstrap_port
        or ports["engine_info_bootstrap_port"],
        bootstrap_port=bootstrap,
        mem_fraction_static=knob(profile, role, "mem_fraction_static"),  # type: ignore[arg-type]
        max_running_requests=knob(profile, role, "max_running_requests"),  # type: ignore[arg-type]
        chunked_prefill_size=knob(profile, role, "chunked_prefill_size"),  # type: ignore[arg-type]
        cuda_graph_max_bs=knob(profile, role, "cuda_graph_max_bs"),  # type: ignore[arg-type]
        extra_args=tuple(role.extra_args),
        env=tuple(sorted(role.env.items())),
    )


def resolve(profile: Profile, host_name: str, host: Host, *, default_index_topk: int,
            max_context_length: int) -> Deployment:
    """Fill every default of ``profile``; ``default_index_topk`` and ``max_context_length`` come from
    the catalog's model entry."""
    topo = profile.topology
    router = None
    transfer = None
    if isinstance(topo, ColocatedTopology):
        roles: tuple[RoleDeployment, ...] = (_role(profile, "engine", topo.engine, None),)
    else:
        assert isinstance(topo, PDTopology)
        pre = _role(profile, "prefill", topo.prefill, "prefill")
        dec = _role(profile, "decode", topo.decode, "decode")
        roles = (pre, dec)
        transfer = topo.transfer_backend
        assert pre.bootstrap_port is not None
        router = RouterDeployment(
            unit=unit_name(profile.name, "router"),
            host=topo.router.host,
            port=topo.router.port,
            prometheus_port=topo.router.prometheus_port,
            policy=topo.router.policy,
            prefill=((pre.url, pre.bootstrap_port),),
            decode=(dec.url,),
        )
    spec = profile.speculative
    return Deployment(
        name=profile.name,
        host=host_name,
        scope=host.scope,
        install_root=host.install_root,
        service_user=host.service_user,
        rdma=host.rdma,
        engine_name=profile.engine.name,
        engine_version=profile.engine.version,
        router_version=profile.engine.router_version,
        engine_env=profile.engine.env,
        model_variant=profile.model.variant,
        model_path=profile.model.path,
        served_name=profile.model.served_name,
        trust_remote_code=profile.model.trust_remote_code,
        model_revision=profile.model.revision,
        expert_storage=profile.model.expert_storage,
        moe_runner_backend=profile.moe.runner_backend,
        index_topk=profile.attention.index_topk or default_index_topk,
        kv_cache_dtype=profile.attention.kv_cache_dtype,
        context_length=profile.attention.context_length or max_context_length,
        fp4_indexer=profile.attention.fp4_indexer,
        speculative_algorithm=spec.algorithm,
        speculative_num_steps=spec.num_steps,
        speculative_num_draft_tokens=spec.num_draft_tokens,
        speculative_dspark_block_size=spec.dspark_block_size,
        temperature=profile.serving.sampling_defaults.temperature,
        top_p=profile.serving.sampling_defaults.top_p,
        enable_cache_report=profile.serving.enable_cache_report,
        watchdog_timeout_s=profile.serving.watchdog_timeout_s,
        transfer_backend=transfer,
        roles=roles,
        router=router,
        kernels_enabled=profile.kernels.enabled,
        kernels_selftest=profile.kernels.selftest,
        kernels_bf16_gemms=profile.kernels.enabled and profile.kernels.bf16_gemms,
        secret_names=tuple(sorted(profile.secrets)),
    )
