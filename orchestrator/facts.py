"""Facts: what a host really is, as the planner needs to know it.

Facts come from one of two places: the inventory's declarations (offline planning, no host needed) or
probes run over SSH (``orchestrator.remote.probes``). Either way the planner sees the same model, so a plan
made offline and one made against the live host differ only where the host differs from its declaration.
Facts are part of a saved plan's identity: apply refuses a plan whose facts no longer hold.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.profile.inventory import Host


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuFact(_Frozen):
    index: int
    name: str  # catalog id when declared, nvidia-smi name when probed
    memory_mib: int | None = None  # None when declared: the catalog supplies it
    compute_cap: str | None = None
    uuid: str | None = None


class DiskFact(_Frozen):
    path: str
    size_bytes: int
    free_bytes: int


class ModelFact(_Frozen):
    path: str
    size_bytes: int
    variant: str | None = None


class UnitFact(_Frozen):
    name: str
    active: str  # active, inactive, failed, activating, ...


class PoolMeasurement(_Frozen):
    """What an engine really allocated for one role on this host (issue 22: calibration).

    Written by ``dsv4ctl apply`` after a healthy start (from ``/server_info`` and the scheduler's
    startup log line) or by ``dsv4ctl calibrate --host HOST --from-log FILE``; kept on the host in
    ``<install_root>/calibration.json`` and read back as a fact, so a plan depends only on the
    profile and the facts. ``model_tokens`` is what the planner's uncalibrated model predicted for
    the configuration that was measured, ``bytes_per_token`` its bytes per full-context token: their
    difference to ``measured_tokens`` is memory the model does not explain.
    """

    # bounded (issue 31): the file comes back from the host, and 10**5000 or inf overflowed
    # into tracebacks; 2**40 tokens per rank and 1 GiB per token are far past any real engine
    role: str = Field(max_length=64)  # engine | prefill | decode
    engine_version: str = Field(max_length=64)
    model_variant: str = Field(max_length=128)
    measured_tokens: int = Field(ge=0, le=1 << 40)  # max_total_num_tokens per rank (attn-DP worker)
    model_tokens: int = Field(ge=0, le=1 << 40)  # the uncalibrated model's prediction
    predicted_tokens: int = Field(ge=0, le=1 << 40)  # what the applied plan predicted
    bytes_per_token: float = Field(gt=0, le=1 << 30, allow_inf_nan=False)
    mem_fraction_static: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    available_gpu_mem_gib: float | None = Field(default=None, ge=0, le=1 << 20,
                                                allow_inf_nan=False)  # after startup
    source: str  # "server_info", "server_info + log", "log FILE"
    release: str | None = None
    measured_at: str

    @property
    def unexplained_bytes(self) -> int:
        """Per-rank bytes the engine used before KV profiling that the model does not predict
        (negative: the engine had more room than predicted)."""
        return round((self.model_tokens - self.measured_tokens) * self.bytes_per_token)


class EngineEnvFact(_Frozen):
    """The engine environment's trust check on the host (remote.hostfs.check_engine_env): owner
    and mode along the whole real path of the env, its bin/ and its interpreter, and nothing
    inside it writable by others. ``problem``: the host's refusal, None when it passed."""

    path: str
    problem: str | None = None


class KernelTiming(_Frozen):
    """One contender of one op at one shape, as ``dsv4ctl qualify kernels`` measured it."""

    op: str  # attention | indexer | mhc_pre
    contender: str  # flashinfer, sglang-triton, tilelang, sglang-torch, sglang-fp32, bundled
    shape: str  # "decode B=64", "prefill T=8192", "indexer B=64 ctx=32768", "mhc B=64"
    status: Literal["ok", "unavailable", "wrong", "failed"]
    us: float | None = None  # median of CUDA-graph replays, cold L2
    error: float | None = None  # relative error against the reference
    detail: str | None = None  # why unavailable/wrong/failed (an import error, the GPU)


class KernelQualification(_Frozen):
    """The host's measurement of the hooked ops for one role (``<install_root>/
    kernels-qualification.json``; :mod:`orchestrator.kernel_paths` decides from it)."""

    role: str
    host: str
    measured_at: str
    engine_version: str
    gpu: str  # the nvidia-smi name of the GPU it ran on
    compute_cap: str
    shape: dict[str, int]  # kernel_paths.role_shape of the role it was measured for
    timings: list[KernelTiming]
    runner: str  # the module and kernels digest that measured


class ConnectionFact(_Frozen):
    """Which machine the probe reached (issue 31: a saved plan binds its target): the host key
    the SSH server proved it holds, and the address the connection went to."""

    host_key: str  # "ssh-ed25519 SHA256:..." (OpenSSH's fingerprint form)
    peer: str | None = None  # the IP address connected to (None through a jump host)


class Facts(_Frozen):
    source: Literal["declared", "probed"]
    host: str
    gpus: list[GpuFact]
    driver: str | None = None
    disks: list[DiskFact] = Field(default_factory=list)
    models: list[ModelFact] = Field(default_factory=list)
    ports_in_use: list[int] = Field(default_factory=list)
    units: list[UnitFact] = Field(default_factory=list)
    current_release: str | None = None
    current_files: dict[str, str] = Field(
        default_factory=dict, description="path -> sha256 of the current release's files"
    )
    # The host's last pool measurement per (role, engine version, model variant): what the
    # planner calibrates its KV-pool prediction with (orchestrator/calibration.py).
    calibration: list[PoolMeasurement] = Field(default_factory=list)
    # The host's last kernel measurement per role (``dsv4ctl qualify kernels``): which path each
    # hooked op takes under auto (orchestrator/kernel_paths.py).
    kernel_qualification: list[KernelQualification] = Field(default_factory=list)
    current_roles: dict[str, list[str]] = Field(
        default_factory=dict,
        description="path -> roles that restart when it changes (from the current manifest; only "
                    "files with roles)")
    connection: ConnectionFact | None = Field(
        default=None, description="the machine the probe reached (probed only); not part of the "
        "fingerprint: apply compares it with the plan's target by itself, naming both")
    engine_env: EngineEnvFact | None = Field(
        default=None, description="the engine environment's owner/mode check (probed only); not "
        "part of the fingerprint: apply checks it again itself before running anything from it")
    latest_release: str | None = Field(
        default=None, description="the newest release on the host, whatever its outcome: a plan "
        "made after a failed attempt differs from one made before it (issue 20 #8)")

    drift: dict[str, str] = Field(
        default_factory=dict, description="what differs from the current release's manifest, "
        "changed outside dsv4ctl: release path -> how (modified, missing, installed unit "
        "modified); '.' when the release directory itself is missing (remote/drift.py)")
    running: dict[str, list[str]] = Field(
        default_factory=dict, description="unit of the current release -> the command line its "
        "main process runs now, from its first '--' flag (remote/drift.py); the planner compares "
        "it with the release's (planner.transition.running_drift)")

    def fingerprint(self) -> str:
        """Stable hash of everything a plan depends on; a saved plan stores it to detect staleness.

        Disks enter with their path and size but not their free space. Free space moves on a live
        host (logs, caches), and even rounded down to whole GiB (``remote.probes``) it crosses a
        boundary now and then: a CI run saw a saved plan refused as stale with nothing else
        changed. Apply compares free space with what the plan needs instead
        (``apply.preflight.stale_reason``)."""
        data = self.model_dump(mode="json")
        # apply checks it itself: preflight (the run's own probe, or under the lock for a saved
        # plan) and the kernels step again, right before it runs the env's python
        del data["engine_env"]
        del data["connection"]  # apply compares the machine itself (preflight.check_target)
        if not data["calibration"]:
            del data["calibration"]  # uncalibrated hosts keep the fingerprints they always had
        if not data["kernel_qualification"]:
            del data["kernel_qualification"]  # likewise hosts never qualified
        if data["latest_release"] is None:  # fingerprints of facts without it stay as they were
            del data["latest_release"]
        if not data["drift"]:  # a host without drift keeps the fingerprint it always had
            del data["drift"]
        if not data["running"]:  # likewise a host that runs nothing of a release
            del data["running"]
        for disk in data["disks"]:
            del disk["free_bytes"]
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def declared_facts(name: str, host: Host) -> Facts:
    """Facts as the inventory declares them: no probing, no network."""
    return Facts(
        source="declared",
        host=name,
        gpus=[GpuFact(index=i, name=host.gpus.model)
              for i in range(host.gpus.count if host.gpus else 0)],
        disks=[DiskFact(path=d.path, size_bytes=d.size, free_bytes=d.free) for d in host.disks],
        models=[ModelFact(path=m.path, size_bytes=m.size, variant=m.variant) for m in host.models],
    )
