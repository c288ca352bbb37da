"""Issue 19, Deliver 1 (offline half): `plan` warns about a host with no pinned SSH key, and the
opt-in to accept a new key is an explicit flag on every command that connects. The refusals
themselves run against a real sshd in tests/integration/test_host_keys.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.cli import cli, main
from orchestrator.paths import default_profile
from orchestrator.planner.fleet import plan_from_paths


def _inventory(tmp_path: Path, **extra: str) -> Path:
    inv = yaml.safe_load((default_profile().parent / "inventory.yaml").read_text())
    inv["hosts"]["gpu-host"].update(extra)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def test_plan_warns_about_a_host_without_pinned_key(tmp_path: Path) -> None:
    plan = plan_from_paths(default_profile(), _inventory(tmp_path))
    (c,) = [c for c in plan.checks if c.id == "host.key-unpinned"]
    assert c.severity == "warning" and c.subject == "gpu-host"
    assert "--accept-new-host-key" in (c.fix or "") and "known_hosts" in c.message


def test_plan_is_quiet_for_a_pinned_host(tmp_path: Path) -> None:
    plan = plan_from_paths(default_profile(),
                           _inventory(tmp_path, known_hosts=str(tmp_path / "known_hosts")))
    assert "host.key-unpinned" not in {c.id for c in plan.checks}


def test_plan_text_shows_the_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(default_profile()), "-i", str(_inventory(tmp_path))]) == 0
    assert "host.key-unpinned" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["plan", "apply", "rollback", "history", "status", "unlock"])
def test_every_connecting_command_has_the_opt_in(command: str) -> None:
    opts = {o for p in cli.commands[command].params for o in getattr(p, "opts", [])}
    assert "--accept-new-host-key" in opts


def test_a_private_key_others_can_read_is_refused_before_connecting(tmp_path: Path) -> None:
    """OpenSSH refuses a 0644 private key; dsv4ctl did not (issue 31)."""
    from orchestrator.errors import RemoteError
    from orchestrator.profile.inventory import Host
    from orchestrator.remote.connection import RemoteHost

    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o644)
    host = Host(address="127.0.0.1", port=1029, key=str(key), gpus=None, connect_timeout_s=1)
    with pytest.raises(RemoteError) as exc:
        RemoteHost("h", host, sleep=lambda s: None).connect()
    assert "readable by others (mode 0644)" in exc.value.message
    assert exc.value.fix == f"chmod 600 {key}"
