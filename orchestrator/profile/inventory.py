"""The inventory schema: the hosts dsv4ctl can deploy to, and what we declare about each.

A host entry says how to reach it (address, user, port, key, optional jump host), how services are managed
there (systemd at system or user scope), where releases live, and its declared facts (GPUs, disks, models
already present). The declared facts let ``dsv4ctl plan`` work with no host reachable; ``--host`` replaces
them with probed ones.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

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
    address: HostName
    user: UserName = "root"
    port: Port | Literal[22] = 22


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
    user: UserName = Field(default="root", description="SSH user.")
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
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)
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
    gpus: DeclaredGpus = Field(description="Declared GPUs, used when the host is not probed.")

    @model_validator(mode="after")
    def _service_user_not_root(self) -> Host:
        if self.service_user == "root":
            raise ValueError("service_user: root would run the engines with every privilege; "
                             "name an unprivileged user (default dsv4)")
        return self
    disks: list[DeclaredDisk] = Field(default_factory=list)
    models: list[PresentModel] = Field(
        default_factory=list, description="Checkpoints already present on the host."
    )
    description: Text | None = None


class Inventory(_Strict):
    api_version: Literal["dsv4ctl/v1"] = Field(default="dsv4ctl/v1", alias="apiVersion")
    hosts: dict[Slug, Host] = Field(min_length=1)
