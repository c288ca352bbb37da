"""The inventory schema: the hosts dsv4ctl can deploy to, and what we declare about each.

A host entry says how to reach it (address, user, port, key, optional jump host), how services are managed
there (systemd at system or user scope), where releases live, and its declared facts (GPUs, disks, models
already present). The declared facts let ``dsv4ctl plan`` work with no host reachable; ``--host`` replaces
them with probed ones.

A group (issue 23) is a fleet of hosts a profile can target with ``hosts: GROUP``: its ``defaults``
are host fields every member shares, and each member gives what is its own (address) and what differs
(GPU count, disks, install root), a member's field replacing the default's as a whole. Every host
name, top-level or a group member, names one host: ``host: NAME`` and ``--host NAME`` find either.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    model_validator,
)

from orchestrator.profile.types import (
    AbsPath,
    HostName,
    Port,
    SafePath,
    Size,
    Slug,
    Text,
    UserName,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeclaredGpus(_Strict):
    model: str = Field(
        description="Catalog GPU id or the exact nvidia-smi name, e.g. rtx-pro-6000-se.",
        min_length=1,
        max_length=200,
    )
    count: int = Field(ge=1, le=64, description="Number of GPUs of that model.")


class DeclaredDisk(_Strict):
    path: AbsPath = Field(description="Mount point or directory that will hold checkpoints.")
    size: Size = Field(description="Total size, e.g. 3.84TB.")
    free: Size = Field(description="Free space now, e.g. 78GiB.")

    @model_validator(mode="after")
    def _free_le_size(self) -> DeclaredDisk:
        if self.free > self.size:
            raise ValueError(
                f"free ({self.free} B) is larger than size ({self.size} B); check the units"
            )
        return self


class PresentModel(_Strict):
    path: AbsPath = Field(description="Directory of a checkpoint already on the host.")
    size: Size = Field(description="Its size on disk (the index's total_size when known).")
    variant: str | None = Field(
        default=None, description="Catalog variant id, if this is a DeepSeek-V4 checkpoint."
    )


class JumpHost(_Strict):
    address: HostName = Field(description="The jump host's DNS name or IP address.")
    user: UserName = Field(default="dsv4", description="SSH user on the jump host (not root "
                           "by default: least privilege).")
    port: Port | Literal[22] = Field(default=22, description="SSH port of the jump host.")


# Directories that belong to the system: an install root there would mix dsv4ctl's releases with
# the OS's files (and `/` or `/etc` would let a release path land on system configuration).
# A root under /tmp or /var/tmp (world-writable, sticky) is refused on the host, where the mode of
# every ancestor is seen (hostfs.dsv4_root), not here: tests render into pytest's temp dirs.
_SYSTEM_TREES = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
                 "/proc", "/sys", "/dev", "/run")
_SYSTEM_DIRS = ("/", "/home", "/root", "/opt", "/srv", "/var", "/var/lib", "/mnt", "/media",
                "/usr/local")


def _dedicated_root(value: str) -> str:
    """install_root must be a directory of its own (issue 19). What can only be seen on the host
    (owner, mode, links, a world-writable ancestor) is checked there before anything is written
    (orchestrator.remote.hostfs)."""
    if value in _SYSTEM_DIRS:
        raise ValueError(f"{value} is a system directory shared with everything else on the host; "
                         "use a dedicated directory such as /srv/dsv4")
    for tree in _SYSTEM_TREES:
        if value == tree or value.startswith(tree + "/"):
            raise ValueError(f"{value} is under {tree}, which belongs to the operating system; "
                             "use a dedicated directory such as /srv/dsv4")
    return value


class Host(_Strict):
    address: HostName = Field(description="DNS name or IP address used for SSH.")
    user: UserName = Field(
        default="dsv4",
        description="SSH user: the deploying user. Not root by default (least privilege): a user "
        "that owns install_root and the engine env, with sudo rights for systemctl in system "
        "scope, or its own `systemd --user` in user scope. root works and is a warning.")
    port: Port | Literal[22] = Field(default=22, description="SSH port.")
    key: AbsPath | None = Field(
        default=None, description="Private key file on the controller; default: ssh agent/keys."
    )
    jump: JumpHost | None = Field(default=None, description="Optional bastion (ProxyJump).")
    known_hosts: AbsPath | None = Field(
        default=None,
        description="known_hosts file on the controller that pins this host's SSH key (only it is "
        "read). Unset: the controller's /etc/ssh/ssh_known_hosts and ~/.ssh/known_hosts are read. "
        "Unknown keys are refused unless --accept-new-host-key (which records the key here); "
        "changed keys always.",
    )
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300,
                                     description="Seconds to wait for the SSH connection.")
    scope: Literal["system", "user"] = Field(
        default="system",
        description="systemd scope: 'system' on production hosts, 'user' for systemctl --user.",
    )
    rdma: bool = Field(
        default=False,
        description="Whether the host has RDMA NICs (PD transfer backend 'mooncake' needs them).",
    )
    install_root: Annotated[SafePath, AfterValidator(_dedicated_root)] = Field(
        default="/srv/dsv4",
        description="Where releases/ and the current link live on the host: a dedicated directory "
        "owned by the SSH user or root and not writable by group or others (checked on the host).",
    )
    service_user: UserName = Field(
        default="dsv4",
        description="Unprivileged user the engine and router run as (system scope: User= in the "
        "units; apply creates it as a system user without a login shell if it is missing). In user "
        "scope the units run as the SSH user, whose `systemd --user` manages them.",
    )
    gpus: DeclaredGpus | None = Field(
        description="Declared GPUs, used when the host is not probed; null for a host that runs "
        "no engine (a fleet's router host).")

    @model_validator(mode="after")
    def _service_user_not_root(self) -> Host:
        if self.service_user == "root":
            raise ValueError("service_user: root would run the engines with every privilege; "
                             "name an unprivileged user (default dsv4)")
        return self
    disks: list[DeclaredDisk] = Field(
        default_factory=list, description="Declared free space per path, used when the host is "
        "not probed.")
    models: list[PresentModel] = Field(
        default_factory=list, description="Checkpoints already present on the host."
    )
    service_address: Annotated[str, Field(pattern=r"^[0-9a-fA-F.:]+$")] | None = Field(
        default=None,
        description="Fleets: the IP address this host's engines listen on when the router "
        "or a PD peer on another host must reach them (the private network between the hosts). "
        "Unset: the address when it is an IP. A host whose engines only its own router reaches "
        "keeps them on 127.0.0.1.",
    )
    link_gbps: float | None = Field(
        default=None, gt=0, le=10000,
        description="Fleets: the speed of the network link between this host and the others, in "
        "Gbit/s (e.g. 25 for 25GbE). The planner estimates cross-host PD KV transfer time from it.",
    )
    description: Text | None = Field(default=None, description="Free text for humans.")


def _optional(field: Any) -> tuple[Any, Any]:
    ann = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return ann | None, Field(default=None, description=field.description)


# A partial host: every Host field, each optional. Types and ranges are checked where they are
# written; what only the whole host can answer (a required field, service_user) when the group
# merges defaults and member.
HostPatch = create_model(  # type: ignore[call-overload]
    "HostPatch", __base__=_Strict,
    **{name: _optional(f) for name, f in Host.model_fields.items()})


def _merge_error(member: str, exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        where = ".".join(str(x) for x in e["loc"]) or "host"
        if e["type"] == "missing":
            parts.append(f"{where} is required and neither the group's defaults nor host "
                         f"'{member}' give it; add {where}: to defaults or to the host")
        else:
            parts.append(f"{where}: {e['msg']}")
    return f"hosts.{member}: " + "; ".join(parts)


class HostGroup(_Strict):
    """A fleet: hosts that run the same profile behind one router."""

    description: Text | None = Field(default=None, description="Free text for humans.")
    defaults: HostPatch = Field(  # type: ignore[valid-type]
        default_factory=HostPatch,
        description="Host fields every member shares (user, scope, install_root, gpus, disks, ...).")
    hosts: dict[Slug, HostPatch | None] = Field(  # type: ignore[valid-type]
        min_length=1,
        description="Members in rollout order: each gives its own fields (at least address) and "
        "overrides where it differs from the defaults (GPU count, disks, install root); a field "
        "given here replaces the default's as a whole.")
    _members: dict[str, Host] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _merge(self) -> HostGroup:
        base = self.defaults.model_dump(exclude_unset=True, by_alias=True)
        members: dict[str, Host] = {}
        for name, patch in self.hosts.items():
            own = patch.model_dump(exclude_unset=True, by_alias=True) if patch is not None else {}
            try:
                members[name] = Host.model_validate({**base, **own})
            except ValidationError as exc:
                raise ValueError(_merge_error(name, exc)) from None
        self._members = members
        return self

    @property
    def members(self) -> dict[str, Host]:
        """Each member as a whole host: the defaults with its own fields over them."""
        return dict(self._members)


class Inventory(_Strict):
    api_version: Literal["dsv4ctl/v1"] = Field(default="dsv4ctl/v1", alias="apiVersion",
                                               description="Inventory format version.")
    hosts: dict[Slug, Host] = Field(
        default_factory=dict, description="Hosts by name (a profile's `host: NAME`).")
    groups: dict[Slug, HostGroup] = Field(
        default_factory=dict,
        description="Fleets by name (a profile's `hosts: NAME`): hosts that run one profile "
        "behind one router.")

    @model_validator(mode="after")
    def _names(self) -> Inventory:
        if not self.hosts and not self.groups:
            raise ValueError("the inventory declares no host: add one under 'hosts:' (or a group "
                             "under 'groups:')")
        seen: dict[str, str] = {n: "hosts" for n in self.hosts}
        for g, group in self.groups.items():
            if g in seen:
                raise ValueError(f"groups.{g}: the name is also a host ({seen[g]}.{g}); a name "
                                 "must mean one thing: rename the group or the host")
            for m in group.hosts:
                if m in seen:
                    raise ValueError(f"groups.{g}.hosts.{m}: host '{m}' is already declared "
                                     f"under {seen[m]}; a host belongs to one place: rename one "
                                     "of them")
                seen[m] = f"groups.{g}.hosts"
            seen[g] = "groups"
        return self

    def all_hosts(self) -> dict[str, Host]:
        """Every host by name: the top-level ones, then each group's members."""
        out = dict(self.hosts)
        for group in self.groups.values():
            out.update(group.members)
        return out
