"""The resolved deployment: a profile with every default filled in, in the terms the engine uses.

A profile leaves many things unsaid (ports, per-role knobs that inherit, the model's default
``index_topk``). ``resolve`` turns it into a :class:`Deployment` where each value is final, so the
renderer, the diff and the apply steps all read one answer instead of re-deriving defaults. It is a pure
function of the profile, the host entry and two model facts from the catalog.

In a fleet (issue 23) each host gets its own Deployment from the same function, given the fleet's
:class:`Placement` (which host runs which role and the router, and the address each host's engines
are reached at); the single host is the fleet of one and its Deployment is what it always was.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from orchestrator.profile.inventory import Host
from orchestrator.profile.schema import (
    KERNEL_OPS,
    ColocatedTopology,
    PDTopology,
    PrefillRole,
    Profile,
    Role,
    Router,
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



KernelPath = Literal["engine", "bundled"]


class OpPath(BaseModel):
    """What runs for one op of one role, and why (plan shows it; render writes ``env``). Decided
    by :func:`orchestrator.kernel_paths.decide`; defined here, with the deployment that carries
    it, so the two modules do not import each other."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: str
    choice: str  # the profile's kernels.<op>: auto | engine | bundled
    path: KernelPath
    runs: str  # the function that runs, in words
    why: str
    source: str
    # the env render writes for this op besides the hook's own switches (bundled only)
    env: tuple[tuple[str, str], ...] = ()
    measured: str | None = None  # the measurement the choice cites, or why it was ignored

class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


LOOPBACK = "127.0.0.1"


class Placement(_Frozen):
    """Where each part of a fleet runs. ``orchestrator.planner.fleet`` decides it; :func:`resolve`
    reads it. Tuples of pairs rather than dicts keep it hashable and its dump ordered."""

    hosts: tuple[str, ...]  # the engine hosts, in rollout order
    addresses: tuple[tuple[str, str], ...]  # host -> the address its engines are reached at
    roles: tuple[tuple[str, tuple[str, ...]], ...]  # role -> the hosts that run it
    router_on: str | None  # the host that runs the router (None: no router)

    def address(self, host: str) -> str:
        return dict(self.addresses)[host]

    def hosts_of(self, role: str) -> tuple[str, ...]:
        return dict(self.roles).get(role, ())

    def cross_host(self, host: str) -> bool:
        """Whether anything on another host must reach this host's engines: a router elsewhere,
        or a PD peer role (prefill <-> decode) on another host."""
        mine = [r for r, hs in self.roles if host in hs]
        if not mine:
            return False
        if self.router_on is not None and self.router_on != host:
            return True
        peers = {"prefill": "decode", "decode": "prefill"}
        return any(h != host for r in mine if r in peers for h in self.hosts_of(peers[r]))


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
    # --host: loopback unless something on another host must reach this engine (a fleet's router
    # or PD peer elsewhere), then the host's service address, never 0.0.0.0
    listen: str = LOOPBACK
    # the path each hooked op runs (orchestrator/kernel_paths.decide; empty until decided, and
    # an undecided role runs the engine's own paths everywhere)
    kernels: tuple[OpPath, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{self.listen}:{self.port}"


class RouterDeployment(_Frozen):
    unit: str
    host: str
    port: int
    prometheus_port: int
    policy: str
    prefill: tuple[tuple[str, int], ...]  # (url, bootstrap port)
    decode: tuple[str, ...]
    worker_urls: tuple[str, ...] = ()  # regular mode (a colocated fleet): every host's engine
    on: str | None = None  # fleets: the inventory host that runs it

    @property
    def pd(self) -> bool:
        return bool(self.prefill or self.decode)


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
    # the profile's kernels.<op> (auto | engine | bundled); kernel_paths.decide turns them into
    # each role's paths
    kernel_choices: tuple[tuple[str, str], ...]
    kernels_selftest: bool
    secret_names: tuple[str, ...]  # names only; values never enter a plan
    # fleets (issue 23): every engine host of the fleet, and the host whose release runs the
    # router (`router` above is set on that host only); a fleet of one leaves both empty
    fleet: tuple[str, ...] = ()
    router_on: str | None = None
    # how long an apply keeps watching after every check passed (health.stability_window_s, or
    # the router's own time to drop a dead worker when the profile leaves it: resolved by the
    # planner, planner/context.py, so `plan` shows the wait; None in plans made before that)
    stability_window_s: float | None = None
    stability_window_default: bool = False

    @property
    def pd(self) -> bool:
        """Prefill/decode disaggregation (on this host a role may be one of the two, or none)."""
        return self.transfer_backend is not None

    @model_validator(mode="before")
    @classmethod
    def _single_switch_release(cls, data: Any) -> Any:
        """A deployment read back from a release planned before per-op kernel choices (its
        plan.json has kernels_enabled/kernels_bf16_gemms): what those releases ran, as paths.
        Their env files are already on the host; nothing renders from these."""
        if not isinstance(data, dict) or "kernels_enabled" not in data:
            return data
        data = dict(data)
        on = bool(data.pop("kernels_enabled"))
        bf16 = bool(data.pop("kernels_bf16_gemms", False))
        ran = {"attention": on, "indexer": on, "mhc_pre": on and bf16}
        data.setdefault("kernel_choices", [[op, "bundled" if b else "engine"]
                                           for op, b in ran.items()])
        why = ("a release planned before per-op kernel choices (kernels.enabled "
               f"{str(on).lower()}, kernels.bf16_gemms {str(bf16).lower()})")
        data["roles"] = [
            {**r, "kernels": r.get("kernels") or [
                {"op": op, "choice": "bundled" if b else "engine",
                 "path": "bundled" if b else "engine",
                 "runs": "dsv4_kernels" if b else "SGLang's own", "why": why,
                 "source": "the release's plan.json"} for op, b in ran.items()]}
            if isinstance(r, dict) else r for r in data.get("roles", [])]
        return data

    @property
    def kernels_enabled(self) -> bool:
        """Whether any role runs a bundled kernel (then the release ships and activates them)."""
        return any(p.path == "bundled" for r in self.roles for p in r.kernels)

    def role(self, name: str) -> RoleDeployment:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)


def unit_name(deployment_name: str, role: str) -> str:
    return f"dsv4-{deployment_name}-{role}.service"


def _role(profile: Profile, name: RoleName, role: Role, mode: Literal["prefill", "decode"] | None,
          listen: str = LOOPBACK) -> RoleDeployment:
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
        listen=listen,
    )


def _port(profile: Profile, name: str) -> int:
    role = profile.roles()[name]
    return role.port or DEFAULT_PORTS[name]["port"]


def _router(profile: Profile, placement: Placement) -> RouterDeployment:
    """The one router of a fleet, with every engine of every host behind it."""
    topo = profile.topology
    conf = topo.router
    assert conf is not None and placement.router_on is not None

    def url(host: str, role: str) -> str:
        # the router reaches an engine on its own host over loopback when that engine listens
        # there; any other engine at its host's address
        addr = (LOOPBACK if host == placement.router_on and not placement.cross_host(host)
                else placement.address(host))
        return f"http://{addr}:{_port(profile, role)}"

    if isinstance(topo, PDTopology):
        boot = topo.prefill.bootstrap_port or DEFAULT_PORTS["prefill"]["bootstrap_port"]
        prefill = tuple((url(h, "prefill"), boot) for h in placement.hosts_of("prefill"))
        decode = tuple(url(h, "decode") for h in placement.hosts_of("decode"))
        workers: tuple[str, ...] = ()
    else:
        prefill, decode = (), ()
        workers = tuple(url(h, "engine") for h in placement.hosts_of("engine"))
    return RouterDeployment(
        unit=unit_name(profile.name, "router"),
        host=conf.host,
        port=conf.port,
        prometheus_port=conf.prometheus_port,
        policy=conf.policy,
        prefill=prefill,
        decode=decode,
        worker_urls=workers,
        on=placement.router_on if len(placement.hosts) > 1 or placement.router_on not in
        placement.hosts else None,
    )


def single_placement(profile: Profile, host_name: str) -> Placement:
    """The fleet of one: every role and (in PD) the router on ``host_name``, over loopback."""
    return Placement(
        hosts=(host_name,),
        addresses=((host_name, LOOPBACK),),
        roles=tuple((r, (host_name,)) for r in profile.roles()),
        router_on=(host_name if isinstance(profile.topology, PDTopology)
                   or profile.topology.router is not None else None),
    )


def resolve(profile: Profile, host_name: str, host: Host, *, default_index_topk: int,
            max_context_length: int, placement: Placement | None = None) -> Deployment:
    """Fill every default of ``profile`` for ``host_name``; ``default_index_topk`` and
    ``max_context_length`` come from the catalog's model entry. ``placement`` says where the parts
    of a fleet run; unset, the host is the fleet of one."""
    topo = profile.topology
    fleet = placement is not None and (len(placement.hosts) > 1
                                       or placement.router_on not in (None, *placement.hosts))
    place = placement or single_placement(profile, host_name)
    listen = place.address(host_name) if place.cross_host(host_name) else LOOPBACK
    transfer = None
    if isinstance(topo, ColocatedTopology):
        all_roles: tuple[RoleDeployment, ...] = (
            _role(profile, "engine", topo.engine, None, listen),)
    else:
        assert isinstance(topo, PDTopology)
        all_roles = (_role(profile, "prefill", topo.prefill, "prefill", listen),
                     _role(profile, "decode", topo.decode, "decode", listen))
        transfer = topo.transfer_backend
    roles = tuple(r for r in all_roles if host_name in place.hosts_of(r.name))
    router = None
    if place.router_on == host_name:
        if isinstance(topo, ColocatedTopology) and topo.router is None:
            topo = topo.model_copy(update={"router": Router()})
            profile = profile.model_copy(update={"topology": topo})
        router = _router(profile, place)
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
        kernel_choices=tuple((op, getattr(profile.kernels, op)) for op in KERNEL_OPS),
        kernels_selftest=profile.kernels.selftest,
        secret_names=tuple(sorted(profile.secrets)),
        fleet=place.hosts if fleet else (),
        router_on=place.router_on if fleet else None,
    )
