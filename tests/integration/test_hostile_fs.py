"""Hostile filesystem on a harness host: symbolic links planted where dsv4ctl writes, and install
roots it must not use (issue 19, Deliver 4 and its acceptance).

Before: a planted `secrets/` link received the secrets file, a planted `.dsv4ctl.lock.info.tmp`
link overwrote its target, a planted `releases/<id>` link moved the release elsewhere, and
`install_root` was never checked for owner or mode. Each test plants the link (or the bad root)
on a real host (sshd + SFTP), runs the real code over SSH, and checks that it is refused with the
path and the reason, and that the link's target is untouched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from orchestrator.errors import DsvError
from orchestrator.release.record import ReleaseRecord
from orchestrator.release.store import ReleaseStore
from orchestrator.remote.connection import RemoteHost
from orchestrator.remote.lock import HostLock
from tests.integration.test_apply import ROOT, Env, env  # noqa: F401  (env is a fixture)

pytestmark = pytest.mark.integration

VICTIM = "/srv/victim"
RID = "r0042-20261201T120000Z-0123abcd"


@pytest.fixture
def victim(env: Env) -> Iterator[Env]:  # noqa: F811
    # /srv/victim stands for a file the deploying user must not reach through a link: root's
    env.fake.exec(f"rm -rf {VICTIM} && mkdir -p {VICTIM} && printf original > {VICTIM}/file",
                  check=True, root=True)
    yield env
    env.fake.exec(f"rm -rf {VICTIM}", root=True)


def untouched(e: Env) -> None:
    assert e.fake.exec(f"ls -A {VICTIM}").stdout.split() == ["file"]
    assert e.fake.read(f"{VICTIM}/file") == "original"
    assert e.fake.exec(f"stat -c %a {VICTIM}/file").stdout.strip() == "644"


def record(rid: str = RID) -> ReleaseRecord:
    return ReleaseRecord(id=rid, created="2026-12-01T12:00:00Z", host="h", deployment="itest",
                         profile_name="itest", plan_id="p", base_release=None, status="applying")


def _store(e: Env) -> tuple[RemoteHost, ReleaseStore]:
    remote = RemoteHost("h", e.host).connect()
    e.fake.exec(f"mkdir -p {ROOT}/releases", check=True)
    return remote, ReleaseStore(remote, ROOT)


def test_planted_secrets_link_is_refused(victim: Env) -> None:
    victim.fake.exec(f"ln -s {VICTIM} {ROOT}/secrets", check=True)
    remote, store = _store(victim)
    with remote, pytest.raises(DsvError) as exc:
        store.write_secrets("itest", RID, {"HF_TOKEN": "hf_canary"})
    assert f"{ROOT}/secrets" in exc.value.message and "symbolic link" in exc.value.message
    untouched(victim)
    assert victim.fake.exec(f"stat -c %a {VICTIM}").stdout.strip() == "755"  # no chmod through it


def test_planted_release_dir_link_is_refused(victim: Env) -> None:
    victim.fake.exec(f"mkdir -p {ROOT}/releases && ln -s {VICTIM} {ROOT}/releases/{RID}",
                     check=True)
    remote, store = _store(victim)
    with remote:
        with pytest.raises(DsvError) as exc:
            store.write_record(record())
        assert f"{ROOT}/releases/{RID}" in exc.value.message
        assert "symbolic link" in exc.value.message
        data = b"echo hi\n"
        with pytest.raises(DsvError) as exc:
            store.upload(RID, {"bin/x.sh": (data, 0o755)},
                         {"bin/x.sh": hashlib.sha256(data).hexdigest()})
        assert "symbolic link" in exc.value.message
    untouched(victim)


def test_planted_file_link_is_refused_by_the_sftp_writer(victim: Env) -> None:
    victim.fake.exec(f"mkdir -p {ROOT}/releases/{RID} && "
                     f"ln -s {VICTIM}/file {ROOT}/releases/{RID}/record.json", check=True)
    remote, store = _store(victim)
    with remote, pytest.raises(DsvError) as exc:
        store.write_record(record())
    assert f"{ROOT}/releases/{RID}/record.json" in exc.value.message
    assert "symbolic link" in exc.value.message
    untouched(victim)


def test_put_bytes_creates_the_file_with_its_final_mode_and_no_temp_left(victim: Env) -> None:
    remote, _ = _store(victim)
    with remote:
        remote.put_bytes(b"k=v\n", f"{ROOT}/private.env", mode=0o600)
        remote.replace_bytes(b"k=w\n", f"{ROOT}/private.env", mode=0o600)
    assert victim.fake.exec(f"stat -c %a {ROOT}/private.env").stdout.strip() == "600"
    assert victim.fake.read(f"{ROOT}/private.env") == "k=w\n"
    assert victim.fake.exec(f"ls -A {ROOT}").stdout.split().count("private.env") == 1
    assert not [n for n in victim.fake.exec(f"ls -A {ROOT}").stdout.split() if n.endswith(".tmp")]


def test_planted_lock_info_temp_link_is_refused(victim: Env) -> None:
    victim.fake.exec(f"mkdir -p {ROOT} && ln -s {VICTIM}/file {ROOT}/.dsv4ctl.lock.info.tmp",
                     check=True)
    with RemoteHost("h", victim.host).connect() as remote:
        lock = HostLock(remote, ROOT, "test")
        with pytest.raises(DsvError) as exc:
            lock.acquire()
    assert f"{ROOT}/.dsv4ctl.lock.info.tmp" in exc.value.message
    assert "symbolic link" in exc.value.message
    untouched(victim)
    assert victim.lock_free()


@pytest.mark.parametrize(("setup", "path", "reason"), [
    (f"mkdir -p {ROOT} && chmod 0777 {ROOT}", ROOT, "writable by group or others (mode 777)"),
    (f"mkdir -p {ROOT} && chown 12345 {ROOT}", ROOT, "owned by uid 12345"),
    (f"chmod 0777 {ROOT.rsplit('/', 1)[0]}", ROOT.rsplit("/", 1)[0],
     "writable by group or others (mode 777)"),
])
def test_unsafe_install_root_is_refused_before_anything_is_written(
        victim: Env, setup: str, path: str, reason: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    parent = ROOT.rsplit("/", 1)[0]
    mode = victim.fake.exec(f"stat -c %a {parent}").stdout.strip()
    victim.fake.exec(setup, check=True, root=True)
    try:
        assert victim.apply(victim.profile()) != 0
        err = " ".join(capsys.readouterr().err.split())  # the CLI wraps to the terminal width
        assert f"dsv4ctl refuses {path}: " in err and reason in err, err
        assert "Traceback" not in err
        untouched(victim)
        assert victim.fake.exec(f"ls -A {ROOT}/ 2>/dev/null").stdout.split() in (
            [], ["file"], [".dsv4ctl.lock"]), "something was written under the refused root"
    finally:
        # the harness mounts ROOT: restore its owner and mode rather than recreate it
        victim.fake.exec(f"chmod {mode} {parent}; chown {victim.fake.uid}:{victim.fake.uid} "
                         f"{ROOT}; chmod 0755 {ROOT}", root=True)
