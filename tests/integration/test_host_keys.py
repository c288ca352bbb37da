"""Host-key pinning against a real sshd: a known key connects, an unknown one is refused at once."""

from __future__ import annotations

import subprocess
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


# ---- issue 19, Deliver 1: unknown keys are refused by default, accept-new is an explicit opt-in --

@pytest.fixture
def controller_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """The controller's system and user known_hosts and dsv4ctl's own (where the opt-in records
    a key: issue 31), pointed at files this test owns (nothing outside tmp_path is read or
    written)."""
    from orchestrator.remote import connection

    system, user = tmp_path / "etc_ssh_known_hosts", tmp_path / "home" / ".ssh" / "known_hosts"
    monkeypatch.setattr(connection, "SYSTEM_KNOWN_HOSTS", str(system), raising=False)
    monkeypatch.setattr(connection, "USER_KNOWN_HOSTS", str(user), raising=False)
    own = tmp_path / "config" / "dsv4ctl" / "known_hosts"
    monkeypatch.setattr(connection, "OWN_KNOWN_HOSTS", str(own), raising=False)
    return system, user, own


def _other_key_line(fake: FakeHost, tmp_path: Path) -> str:
    """A known_hosts line for the host's address with a key it does not have (a changed key)."""
    key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kind, b64 = key.with_suffix(".pub").read_text().split()[:2]
    return f"{fake.address} {kind} {b64}\n"


def _line_of(fake: FakeHost) -> str:
    return next(ln for ln in Path(fake.known_hosts).read_text().splitlines()
                if ln.split()[0] == fake.address) + "\n"


def test_never_seen_key_is_refused_by_default(hosts: list[FakeHost],
                                              controller_files: tuple[Path, Path, Path]) -> None:
    """No known_hosts in the inventory and the key in no controller file: refused, not retried
    (before issue 19 fabric's AutoAddPolicy accepted any key silently)."""
    slept: list[float] = []
    with pytest.raises(RemoteError) as info:
        connect("h", _host(hosts[0], None), sleep=slept.append)
    assert "is unknown" in info.value.message and "--accept-new-host-key" in (info.value.fix or "")
    assert slept == []
    assert not controller_files[1].exists()  # nothing recorded without the opt-in


def test_system_and_user_known_hosts_are_read(hosts: list[FakeHost],
                                              controller_files: tuple[Path, Path, Path]) -> None:
    system, user, _ = controller_files
    system.write_text(_line_of(hosts[0]))
    with connect("h", _host(hosts[0], None)) as remote:
        assert remote.run("echo ok").stdout.strip() == "ok"
    system.unlink()
    user.parent.mkdir(parents=True)
    user.write_text(_line_of(hosts[0]))
    with connect("h", _host(hosts[0], None)) as remote:
        assert remote.run("echo ok").stdout.strip() == "ok"


@pytest.mark.parametrize("where", ["inventory", "user"])
def test_changed_key_is_refused_even_with_the_opt_in(
        hosts: list[FakeHost], controller_files: tuple[Path, Path], tmp_path: Path,
        where: str) -> None:
    from orchestrator.remote.connection import accept_new_host_keys

    line = _other_key_line(hosts[0], tmp_path)
    if where == "inventory":
        pinned: Path | None = tmp_path / "pinned_known_hosts"
        pinned.write_text(line)  # type: ignore[union-attr]
    else:
        pinned = None
        controller_files[1].parent.mkdir(parents=True)
        controller_files[1].write_text(line)
    for opt_in in (False, True):
        with accept_new_host_keys(opt_in), pytest.raises(RemoteError) as info:
            connect("h", _host(hosts[0], pinned), sleep=lambda s: None)
        assert "CHANGED" in info.value.message
    assert (pinned or controller_files[1]).read_text() == line  # nothing recorded


def test_never_seen_key_is_accepted_only_with_the_opt_in(
        hosts: list[FakeHost], controller_files: tuple[Path, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    from orchestrator.remote.connection import accept_new_host_keys

    user, own = controller_files[1], controller_files[2]
    with pytest.raises(RemoteError, match="is unknown"):
        connect("h", _host(hosts[0], None), sleep=lambda s: None)
    with caplog.at_level("WARNING", logger="dsv4ctl.ssh"), accept_new_host_keys(), \
            connect("h", _host(hosts[0], None)) as remote:
        assert remote.run("echo ok").stdout.strip() == "ok"
    assert any("accepted the new host key" in r.getMessage() and str(own) in r.getMessage()
               for r in caplog.records)
    # recorded like OpenSSH's accept-new (0600 file), in dsv4ctl's own file only (issue 31),
    # and from now on pinned without the opt-in
    assert own.read_text() == _line_of(hosts[0]) and own.stat().st_mode & 0o777 == 0o600
    assert not user.exists()
    with connect("h", _host(hosts[0], None)) as remote:
        assert remote.run("echo ok").stdout.strip() == "ok"


def test_opt_in_records_in_dsv4ctls_own_file_never_the_inventorys(
        hosts: list[FakeHost], tmp_path: Path,
        controller_files: tuple[Path, Path, Path]) -> None:
    """With a per-host known_hosts that does not exist yet, the opt-in records the key in
    dsv4ctl's own file, not in the file the inventory (or a profile) names (issue 31: it appended
    to whatever file that was); the user's file is left alone; the host is pinned from then on."""
    from orchestrator.remote.connection import accept_new_host_keys

    pinned = tmp_path / "new_known_hosts"
    with accept_new_host_keys(), connect("h", _host(hosts[0], pinned)) as remote:
        assert remote.run("echo ok").stdout.strip() == "ok"
    assert not pinned.exists() and controller_files[2].read_text() == _line_of(hosts[0])
    assert not controller_files[1].exists()
    with connect("h", _host(hosts[0], pinned)) as remote:
        assert remote.run("echo ok").stdout.strip() == "ok"


def test_cli_refuses_then_accepts_with_the_flag(hosts: list[FakeHost], tmp_path: Path,
                                                controller_files: tuple[Path, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`dsv4ctl status` end to end: refused with a fix naming the flag, then accepted with
    --accept-new-host-key (said on stderr, key recorded), then pinned without it."""
    import yaml

    from orchestrator.cli import main

    inv = hosts[0].inventory_dict()
    entry = {k: inv[k] for k in ("address", "port", "user", "key", "scope")}
    entry.update(install_root=str(tmp_path / "root"), connect_timeout_s=5,
                 gpus={"model": "rtx-pro-6000-se", "count": 8})
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "dsv4ctl/v1", "hosts": {"h": entry}}))
    argv = ["status", "--host", "h", "-i", str(path)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "is unknown" in err and "--accept-new-host-key" in err
    main([*argv, "--accept-new-host-key"])
    out = capsys.readouterr()
    assert "host h:" in out.out and "accepted the new host key" in out.err
    assert controller_files[2].read_text() == _line_of(hosts[0])
    main(argv)
    assert "host h:" in capsys.readouterr().out


# ---- issue 31: known_hosts writes only to dsv4ctl's own file; odd files are clear errors ------

def test_a_revoked_line_in_known_hosts_is_a_clear_error(
        hosts: list[FakeHost], tmp_path: Path, controller_files: tuple[Path, Path, Path]) -> None:
    pinned = tmp_path / "known_hosts"
    kind_b64 = _line_of(hosts[0]).split(None, 1)[1]
    pinned.write_text(f"@revoked * {kind_b64}" + _line_of(hosts[0]))
    with pytest.raises(RemoteError) as info:
        connect("h", _host(hosts[0], pinned), sleep=lambda s: None)
    assert "line 1 has a marker (@revoked" in info.value.message
