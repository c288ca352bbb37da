"""Host-key pinning against a real sshd: a known key connects, an unknown one is refused at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import RemoteError
from orchestrator.profile.inventory import Host
from orchestrator.remote.connection import connect
from tests.harness import FakeHost


def _host(fake: FakeHost, known_hosts: Path | None) -> Host:
    inv = fake.inventory_dict()
    return Host(address=inv["address"], port=inv["port"], user=inv["user"], key=inv["key"],
                known_hosts=str(known_hosts) if known_hosts else None, connect_timeout_s=5,
                gpus={"model": "rtx-pro-6000-se", "count": 8})


def test_pinned_key_connects(hosts: list[FakeHost]) -> None:
    fake = hosts[0]
    with connect("h", _host(fake, Path(fake.known_hosts))) as remote:
        assert remote.run("echo ok").stdout.strip() == "ok"


def test_unknown_key_is_refused_without_retry(hosts: list[FakeHost], tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    slept: list[float] = []
    with pytest.raises(RemoteError) as info:
        connect("h", _host(hosts[0], empty), sleep=slept.append)
    assert "not in known_hosts" in info.value.message
    assert "verify the host's key" in (info.value.fix or "")
    assert slept == []  # not treated as a transient failure


def test_missing_known_hosts_file_is_a_clear_error(hosts: list[FakeHost], tmp_path: Path) -> None:
    with pytest.raises(RemoteError) as info:
        connect("h", _host(hosts[0], tmp_path / "nope"))
    assert "cannot read known_hosts" in info.value.message
