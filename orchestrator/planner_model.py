"""The Plan: everything ``dsv4ctl plan`` decided, as one serialisable value.

A plan is what the planner proves about a profile on a host (capacity per GPU, disk, checks) and what
applying it would do (the rendered release tree and the actions against the host's current release).
It is the contract between ``plan`` and ``apply``: a saved plan (``plan -o plan.json``) holds the file
contents and the fingerprints of its inputs, so apply can refuse it when it has gone stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.deployment import Deployment, Placement
from orchestrator.errors import FixChange

PLAN_FORMAT = 2  # bump when the JSON shape changes incompatibly
FLEET_FORMAT = 1  # the fleet plan's JSON shape (planner/fleet.py)

Severity = Literal["error", "warning", "info"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Check(_Frozen):
    id: str  # stable, dotted: capacity.weights-exceed-gpu, engine.index-topk, ...
    severity: Severity
    title: str
    message: str  # with the numbers that led to it
    fix: str | None = None
    # the profile edit the fix proposes, when it is one (the fix's text is rendered from it,
    # orchestrator.errors.fix_text); not part of the plan's JSON (saved plans keep their shape)
    change: tuple[FixChange, ...] = Field(default=(), exclude=True)
    subject: str | None = None  # role, GPU or disk it is about
    numbers: dict[str, float | int | str] = Field(default_factory=dict)
    acknowledged: bool = False
    ack_reason: str | None = None
    source: str | None = None  # upstream issue or doc behind the rule
    field: str | None = None  # dotted profile path the check is about (topology.decode.gpus)
    location: str | None = None  # file:line:col of that field (or its nearest written parent)


class WeightGroup(_Frozen):
    name: str
    bytes: int


class HeadroomTermRow(_Frozen):
    """One thing that needs GPU memory outside mem_fraction_static (planner/headroom.py)."""

    id: str  # cuda_context, nccl, custom_allreduce, activations, cuda_graphs, indexer_logits
    phase: Literal["before-baseline", "runtime"]
    bytes: int
    exact: bool  # computed as SGLang's code computes it; False: an estimate
    source: str
    detail: str


class RoleCapacity(_Frozen):
    role: str
    gpu_model: str
    gpu_total_bytes: int
    tp: int
    ep: int
    attn_dp: int
    mem_fraction_static: float
    weights_per_rank: list[WeightGroup]
    weights_per_rank_bytes: int
    static_budget_bytes: int  # total * mfs
    headroom_bytes: int  # total * (1 - mfs): activations, CUDA graphs, NCCL
    kv_pool_bytes_per_rank: int
    bytes_per_token: float
    fixed_bytes_per_rank: int
    max_total_tokens_per_rank: int
    token_capacity: int  # per-rank tokens x attention-DP groups: what the role can hold at once
    max_running_requests: int
    notes: list[str] = Field(default_factory=list)
    # The arithmetic behind the numbers above (`plan --explain`), per rank, in bytes. A GPU's
    # memory = preload + weights + KV pools + req_to_token + headroom, exactly.
    preload_bytes: int = 0  # in use before SGLang's baseline (CUDA context, NCCL)
    req_to_token_bytes: int = 0  # the request->token table, allocated after KV profiling
    kv_budget_bytes: int = 0  # what SGLang's profiling leaves the KV pools: pre*mfs - weights
    slack_bytes: int = 0  # pre * (1 - mfs): what SGLang keeps outside the KV budget
    kv_unused_bytes: int = 0  # budget - allocated pools: left by page rounding (part of headroom)
    kv_pools: dict[str, int] = Field(default_factory=dict)  # allocated bytes per pool
    kv_tokens: dict[str, int] = Field(default_factory=dict)  # tokens/slots per pool
    bytes_per_token_terms: dict[str, float] = Field(default_factory=dict)
    page_size: int = 0
    # The headroom model: what lives outside mem_fraction_static at the worst moment of the
    # declared workload (planner/headroom.py); empty when the pool could not be sized.
    headroom_terms: list[HeadroomTermRow] = Field(default_factory=list)
    headroom_need_bytes: int = 0  # sum of the runtime terms; compare with headroom_bytes
    longest_request_tokens: int = 0
    chunked_prefill_size: int = 0  # as SGLang resolves it (its default when unset)
    # Calibration (orchestrator/calibration.py): the uncalibrated model's tokens per rank, the
    # per-host, per-engine-version term applied (bytes per rank taken before KV profiling that the
    # model does not explain; negative: room it did not expect), and the sentence saying so.
    model_tokens_per_rank: int = 0
    calibration_bytes: int = 0
    calibrated: str | None = None


class GpuRow(_Frozen):
    index: int
    role: str | None
    model: str
    total_bytes: int
    weights_bytes: int
    kv_bytes: int
    headroom_bytes: int
    free_static_bytes: int  # static budget minus weights minus KV (what page alignment left over)
    preload_bytes: int = 0  # in use before SGLang's baseline (CUDA context, NCCL)
    req_to_token_bytes: int = 0  # the request->token table


class DiskRow(_Frozen):
    path: str
    size_bytes: int
    free_bytes: int
    needed_bytes: int
    present: bool  # the checkpoint already sits on this host
    shortfall_bytes: int
    could_free: list[str] = Field(default_factory=list)  # present models whose removal closes the gap


class PlannedFile(_Frozen):
    path: str  # relative to the release root
    mode: int
    sha256: str
    roles: list[str] = Field(default_factory=list)  # roles that must restart if this file changes
    content: str | None = None  # present in saved plans, left out of `plan --format json`


# Start order: engines before the router that fronts them (stop order is the reverse). Owned
# here, below the planner, because Plan.restarts reads it (the transition re-exports it).
ROLE_ORDER = ("prefill", "decode", "engine", "router")
UNIT_KINDS = ("stop", "restart", "start")


def role_key(role: str) -> tuple[int, str]:
    """Sort key of a role name in start order (unknown names last, by name)."""
    return (ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER), role)


def roles_restarted(actions: Iterable[Any]) -> list[str]:
    """Roles whose running process is replaced (restart actions), in start order."""
    return sorted({r for a in actions if a.kind == "restart" for r in a.roles}, key=role_key)


def roles_affected(actions: Iterable[Any]) -> list[str]:
    """Roles whose process is stopped, started or restarted."""
    return sorted({r for a in actions if a.kind in UNIT_KINDS for r in a.roles}, key=role_key)


class Action(_Frozen):
    """One step of a transition (:mod:`orchestrator.planner.transition` computes them)."""

    kind: Literal["create", "change", "remove", "start", "stop", "restart"]
    target: str  # a release file's path (create/change/remove) or a unit (start/stop/restart)
    roles: list[str] = Field(default_factory=list)  # roles the file restarts / the unit runs
    reason: str = ""
    # what the role's clients see: a router restart drops connections for seconds, an engine
    # restart reloads the model (minutes)
    downtime: Literal["none", "seconds", "minutes"] = "none"


# the words of the summary line, per action kind (Terraform's "to add" for a created file)
ACTION_WORDS = {"create": "add", "change": "change", "remove": "remove",
                "start": "start", "restart": "restart", "stop": "stop"}


def count_actions(actions: Iterable[Action]) -> dict[str, int]:
    """How many actions of each kind, keyed by the summary's words (add, change, ...)."""
    out = dict.fromkeys(ACTION_WORDS.values(), 0)
    for a in actions:
        out[ACTION_WORDS[a.kind]] += 1
    return out


def summarize_actions(actions: Iterable[Action]) -> str:
    """``3 to add, 1 to change, 0 to remove; 1 to start, 2 to restart, 3 to stop.``: the counts
    ``plan``, ``diff`` and ``apply`` print (callers put ``Plan:`` or ``Diff:`` before it)."""
    c = count_actions(actions)
    return (f"{c['add']} to add, {c['change']} to change, {c['remove']} to remove; "
            f"{c['start']} to start, {c['restart']} to restart, {c['stop']} to stop.")


def plan_line(actions: Sequence[Action], errors: int = 0) -> str:
    """The one summary line of a plan (and of a diff, which is the plan against the old release).
    A plan with errors applies nothing, so it says that instead of counting actions."""
    if errors:
        return f"Plan: {errors} error{'s' if errors != 1 else ''}; it will not apply."
    if not actions:
        return "Plan: no changes."
    return "Plan: " + summarize_actions(actions)


def downtime_text(action: Action) -> str:
    """What clients see from one unit action, in words (plan and diff print the same)."""
    if action.downtime == "none":
        return ""
    if action.kind == "stop":
        return ("the router's clients see refused connections" if action.downtime == "seconds"
                else "this role serves nothing from now on")
    if action.downtime == "seconds":
        return "clients see refused connections for seconds"
    return "the model reloads: this role serves nothing for minutes"


class PlanTarget(_Frozen):
    """The machine a plan was made for (issue 31: a saved plan binds its target). Where the host
    entry came from, how dsv4ctl reaches it, and, when probed, the host key the machine proved it
    holds: apply refuses a saved plan on any other machine, naming both."""

    source: Literal["inventory", "profile"]  # profile: an inline host (the inventory is unused)
    user: str
    address: str
    port: int
    jump: str | None = None  # user@address:port of a bastion
    known_hosts: str | None = None  # the pinned known_hosts file, if any
    host_key: str | None = None  # "ssh-ed25519 SHA256:...", probed plans only
    peer: str | None = None  # the IP address the probe reached, probed plans only

    def describe(self) -> str:
        where = f"{self.user}@{self.address}:{self.port}"
        if self.jump:
            where += f" via {self.jump}"
        if self.peer and self.peer != self.address:
            where += f" ({self.peer})"
        return where + (f", host key {self.host_key}" if self.host_key else "")


class Plan(_Frozen):
    format: int = PLAN_FORMAT
    tool_version: str
    profile_name: str
    profile_path: str | None
    profile_sha256: str
    host: str
    facts_source: Literal["declared", "probed"]
    facts_fingerprint: str
    current_release: str | None
    deployment: Deployment
    capacity: list[RoleCapacity]
    gpus: list[GpuRow]
    disks: list[DiskRow]
    checks: list[Check]
    files: list[PlannedFile]
    actions: list[Action]  # the transition from the host's current release (planner.transition)
    target: PlanTarget | None = None  # the machine it was made for (None: plans before 31)
    # where apply reads each secret on the controller: "env NAME" or "file PATH" (never a value)
    secret_sources: dict[str, str] = Field(default_factory=dict)
    # roles restarted on request (`--replace ROLE`): apply recomputes the same transition with them
    replace: list[str] = Field(default_factory=list)

    @property
    def restarts(self) -> list[str]:
        """Roles whose running engine or router is replaced (downtime), from the actions."""
        return roles_restarted(self.actions)

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if c.severity == "error" and not c.acknowledged]

    @property
    def has_changes(self) -> bool:
        return bool(self.actions)


class FleetHostRow(_Frozen):
    """One line of the fleet summary: a host, whether it fits, its checks and changes."""

    host: str
    roles: list[str]  # engine roles on this host, plus "router" where the router runs
    fits: bool  # no unacknowledged error
    errors: int
    warnings: int
    changes: int  # actions
    restarts: int


class FleetPlan(_Frozen):
    """A profile planned on every host of its fleet (issue 23; planner/fleet.py). The fleet of one
    holds one plan. ``plans`` are in rollout order: the engine hosts as the inventory group (or the
    profile's list) orders them, then the router's own host when it has one."""

    format: int = FLEET_FORMAT
    kind: Literal["fleet"] = "fleet"
    profile_name: str
    profile_path: str | None
    hosts: list[str]  # the engine hosts
    router_on: str | None  # the host that runs the router
    router_only_host: str | None = None  # set when that host runs no engine
    placement: Placement
    checks: list[Check]  # what only the fleet can check (cross-host PD transfer)
    plans: list[Plan]
    # what clients see while the change rolls out, from the rollout strategy (planner/rollout.py);
    # None for a fleet of one (its actions say it)
    downtime: str | None = None
    outage: bool | None = None

    def plan(self, host: str) -> Plan:
        for p in self.plans:
            if p.host == host:
                return p
        raise KeyError(host)

    @property
    def errors(self) -> list[Check]:
        own = [c for c in self.checks if c.severity == "error" and not c.acknowledged]
        return own + [c for p in self.plans for c in p.errors]

    @property
    def failed_hosts(self) -> list[str]:
        """Hosts whose plan has an error, in rollout order."""
        return [p.host for p in self.plans if p.errors]

    @property
    def has_changes(self) -> bool:
        return any(p.has_changes for p in self.plans)

    def summary(self) -> list[FleetHostRow]:
        rows = []
        for p in self.plans:
            roles = [r.name for r in p.deployment.roles]
            if p.deployment.router is not None:
                roles.append("router")
            rows.append(FleetHostRow(
                host=p.host, roles=roles, fits=not p.errors, errors=len(p.errors),
                warnings=sum(1 for c in p.checks if c.severity == "warning" and not c.acknowledged),
                changes=len(p.actions), restarts=len(p.restarts)))
        return rows
