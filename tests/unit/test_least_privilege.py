"""Least privilege on the host (issue 19, Deliver 2): units run as an unprivileged service user in
a systemd sandbox, `--trust-remote-code` only when the profile asks, and the planner says whether
the checkpoint needs it.

Before: no User= in the units (engines ran as root) and `--trust-remote-code` always rendered.
The sandbox's exposure scores are in tests/validate/test_systemd_security.py (golden files).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from orchestrator.apply.context import Context, StepFailed
from orchestrator.apply.preflight import ensure_service_user
from orchestrator.catalog import load_catalog
from orchestrator.errors import DsvError
from orchestrator.paths import data_dir
from orchestrator.planner.fleet import plan_from_paths
from orchestrator.profile.inventory import Host
from orchestrator.remote.probes import CommandResult
from tests.validate.helpers import render_path, shipped_profiles

PROFILES_DIR = data_dir("profiles")


def _unit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_system_units_run_as_the_service_user_in_a_sandbox(path: Path) -> None:
    _, dep, tree = render_path(path, scope="system")
    units = {p: f.content for p, f in tree.files.items() if p.startswith("units/")}
    assert units
    for name, text in units.items():
        lines = _unit_lines(text)
        for want in ("User=dsv4", "Group=dsv4", "NoNewPrivileges=yes", "ProtectSystem=strict",
                     "ProtectHome=yes", "PrivateTmp=yes", "CapabilityBoundingSet=",
                     f"ReadWritePaths={dep.install_root}/logs"):
            assert want in lines, (name, want)
        gpu = "router" not in name
        assert ("DeviceAllow=char-nvidia-frontend rw" in lines) == gpu, name
        assert ("DevicePolicy=closed" in lines) == gpu, name
        assert ("PrivateDevices=yes" in lines) == (not gpu), name


def test_user_scope_units_sandbox_in_their_own_user_namespace() -> None:
    """A user manager applies the mount-namespace and seccomp settings only under PrivateUsers=yes,
    and cannot apply User=, ProtectControlGroups=, ProtectProc=, ProcSubset= or the BPF device
    filter: those are not rendered (a setting it cannot apply would only fake the score)."""
    _, dep, tree = render_path(shipped_profiles()[0], scope="user")
    units = {p: f.content for p, f in tree.files.items() if p.startswith("units/")}
    assert units
    for name, text in units.items():
        lines = _unit_lines(text)
        for want in ("PrivateUsers=yes", "NoNewPrivileges=yes", "CapabilityBoundingSet=",
                     "ProtectSystem=strict", "ProtectHome=read-only", "PrivateTmp=yes",
                     f"ReadWritePaths={dep.install_root}/logs", "RestrictNamespaces=yes",
                     "SystemCallArchitectures=native"):
            assert want in lines, (name, want)
        assert not [line for line in lines if line.startswith((
            "User=", "Group=", "ProtectControlGroups=", "ProtectProc=", "ProcSubset=",
            "DevicePolicy=", "DeviceAllow=", "MemoryDenyWriteExecute="))], name
        # a fresh /dev would hide the GPUs from the engines
        assert ("PrivateDevices=yes" in lines) == ("router" in name), name


def _plan(tmp_path: Path, trust: bool | None):
    prof = yaml.safe_load((PROFILES_DIR / "default.yaml").read_text())
    if trust is not None:
        prof["model"]["trust_remote_code"] = trust
    (tmp_path / "inventory.yaml").write_text((PROFILES_DIR / "inventory.yaml").read_text())
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return plan_from_paths(path)


def _launch_lines(plan) -> str:
    return "".join(f.content or "" for f in plan.files if f.path.startswith("bin/launch-"))


def test_trust_remote_code_is_off_by_default_and_the_plan_says_it_is_not_needed(
        tmp_path: Path) -> None:
    plan = _plan(tmp_path, None)
    assert "--trust-remote-code" not in _launch_lines(plan)
    (c,) = [c for c in plan.checks if c.id == "model.trust-remote-code"]
    assert c.severity == "info" and "does not need it" in c.message
    assert "hf_transformers/common.py" in (c.source or "")


def test_trust_remote_code_when_asked_is_rendered_with_a_warning(tmp_path: Path) -> None:
    plan = _plan(tmp_path, True)
    assert _launch_lines(plan).count("--trust-remote-code") == 2  # prefill and decode
    (c,) = [c for c in plan.checks if c.id == "model.trust-remote-code"]
    assert c.severity == "warning" and "runs Python files from" in c.message


def test_a_checkpoint_that_needs_remote_code_without_it_is_an_error(tmp_path: Path) -> None:
    # the (cached) catalog entry says the engine needs it, as a future version's might
    engine = load_catalog().engine("sglang", "0.5.23")
    was = engine.trust_remote_code_needed
    object.__setattr__(engine, "trust_remote_code_needed", was.model_copy(update={"value": True}))
    try:
        plan = _plan(tmp_path, None)
    finally:
        object.__setattr__(engine, "trust_remote_code_needed", was)
    (c,) = [c for c in plan.errors if c.id == "model.trust-remote-code"]
    assert "model.trust_remote_code: true" in (c.fix or "")


def test_service_user_root_is_refused_in_the_inventory() -> None:
    with pytest.raises(ValueError, match="service_user: root"):
        Host(address="h", service_user="root", gpus={"model": "x", "count": 1})


class _Remote:
    name = "h"

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.commands: list[str] = []

    def check(self, command: str, *, timeout: float | None = None, what: str = "") -> str:
        self.commands.append(command)
        return self.stdout

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        return CommandResult(command, 0, self.stdout, "")


def _ctx(remote: _Remote, scope: str = "system") -> Context:
    host = Host(address="h", scope=scope, gpus={"model": "x", "count": 1})
    return Context(remote=remote, host_name="h", host=host,  # type: ignore[arg-type]
                   out=lambda s: None, now=lambda: datetime.now(UTC), command="t")


def test_preflight_creates_a_missing_service_user_without_login() -> None:
    remote = _Remote("created\n998\n")
    assert ensure_service_user(_ctx(remote)) == "service user dsv4 (uid 998) created"
    (cmd,) = remote.commands
    assert "useradd --system" in cmd and "--shell /usr/sbin/nologin" in cmd and "id -u dsv4" in cmd


def test_preflight_refuses_a_service_user_with_uid_0() -> None:
    with pytest.raises(StepFailed, match="uid 0"):
        ensure_service_user(_ctx(_Remote("exists\n0\n")))


def test_user_scope_needs_no_service_user() -> None:
    remote = _Remote("")
    assert ensure_service_user(_ctx(remote, scope="user")) == "" and remote.commands == []


def test_dsverror_is_the_base() -> None:
    assert issubclass(StepFailed, DsvError)


# ------------------------------------------------------ issue 31: the SSH user is not root ---

def test_the_schema_default_ssh_user_is_not_root() -> None:
    from orchestrator.profile.inventory import Host, JumpHost

    assert Host(address="h", gpus=None).user != "root"
    assert JumpHost(address="j").user != "root"


def test_a_root_ssh_user_is_a_warning_naming_the_alternative(tmp_path: Path) -> None:
    import yaml

    from orchestrator.paths import data_dir
    from orchestrator.planner.fleet import plan_from_paths

    profiles = data_dir("profiles")
    inv = yaml.safe_load((profiles / "inventory.yaml").read_text())
    inv["hosts"]["gpu-host"]["user"] = "root"
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inv))
    (tmp_path / "p.yaml").write_text((profiles / "default.yaml").read_text())
    plan = plan_from_paths(tmp_path / "p.yaml")
    (c,) = [c for c in plan.checks if c.id == "host.ssh-root"]
    assert c.severity == "warning" and "user: root" in c.message
    assert "unprivileged deploying user" in (c.fix or "") and "sudo" in (c.fix or "")
    shipped = plan_from_paths(profiles / "default.yaml")
    assert "host.ssh-root" not in {c.id for c in shipped.checks}
