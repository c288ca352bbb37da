"""Releases: ids, pruning, records, the playbooks, and the release store's real shell commands.

The store is exercised with a local shell (bash + coreutils on this machine, the same commands that
run on a host over SSH): upload with hash verification, atomic switch, pruning, record rewrite.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.apply.executor import ACTIONS
from orchestrator.apply.playbook import load_playbook
from orchestrator.errors import DsvError, InputError, RemoteError
from orchestrator.planner.transition import (
    ReleaseFile,
    release_from_manifest,
    roles_affected,
    transition,
)
from orchestrator.release.prune import select_prunable
from orchestrator.release.record import (
    ReleaseRecord,
    chosen_rollback_target,
    last_healthy,
    rollback_target,
)
from orchestrator.release.store import ReleaseStore, build_tarball
from orchestrator.release_ids import is_release_id, new_release_id, sequence, sort_ids
from orchestrator.remote.probes import CommandResult

T = datetime(2026, 11, 29, 10, 15, 0, tzinfo=UTC)


def test_release_ids_sortable_unique() -> None:
    a = new_release_id([], T, "1a2b3c4d" + "0" * 56)
    assert a == "r0001-20261129T101500Z-1a2b3c4d" and is_release_id(a)
    b = new_release_id([a, "junk", ".tmp-x"], T, "ffffffff")
    assert b.startswith("r0002-") and sequence(b) == 2
    # sequence decides order even when the clock went backwards
    c = new_release_id([a, b], datetime(2020, 1, 1, tzinfo=UTC), "00000000")
    assert sort_ids([c, a, b]) == [a, b, c]
    assert sequence("r10000-20261129T101500Z-1a2b3c4d") == 10000
    with pytest.raises(ValueError):
        new_release_id([], T, "xyz")


@given(n=st.integers(2, 30), keep=st.integers(1, 10), cur=st.integers(0, 29),
       healthy=st.integers(0, 29))
def test_prune_never_removes_current_or_last_healthy(n: int, keep: int, cur: int,
                                                     healthy: int) -> None:
    ids = [f"r{i + 1:04d}-20261129T101500Z-00000000" for i in range(n)]
    current, lh = ids[cur % n], ids[healthy % n]
    doomed = select_prunable([*ids, "not-a-release"], keep=keep, current=current,
                             last_healthy=lh)
    assert current not in doomed and lh not in doomed
    assert set(ids[-keep:]).isdisjoint(doomed)
    assert len(doomed) == max(0, n - len(set(ids[-keep:]) | {current, lh}))


def rec(i: int, status: str) -> ReleaseRecord:
    return ReleaseRecord(id=f"r{i:04d}-20261129T101500Z-00000000", created="", host="h",
                         deployment="d", profile_name="p", plan_id="x", base_release=None,
                         status=status)  # type: ignore[arg-type]


def test_last_healthy_and_rollback_target() -> None:
    rs = [rec(1, "healthy"), rec(2, "healthy"), rec(3, "rolled-back"), rec(4, "applying")]
    assert last_healthy(rs) == rs[1].id
    assert last_healthy(rs, exclude=[rs[1].id]) == rs[0].id
    # after a failed apply: the release serving when the apply began wins, if it was healthy
    assert rollback_target(rs, rs[0].id, failed=rs[3].id) == rs[0].id
    # else the newest healthy one, never the failed release itself
    assert rollback_target(rs, rs[2].id, failed=rs[3].id) == rs[1].id
    assert rollback_target([rec(1, "failed")], None, failed=rec(2, "failed").id) is None
    # `dsv4ctl rollback` without a release: the newest healthy one before current
    assert rollback_target(rs, rs[1].id) == rs[0].id
    assert rollback_target(rs, rs[0].id) is None
    assert rollback_target(rs, rs[3].id) == rs[1].id


def test_the_rollback_a_command_asks_for() -> None:
    """One owner for `dsv4ctl rollback [RELEASE]`'s choice and refusals: the preview shown before
    the prompt and the rollback itself both call it."""
    rs = [rec(1, "healthy"), rec(2, "healthy")]
    assert chosen_rollback_target(rs, rs[1].id, None, "h") == rs[0].id
    assert chosen_rollback_target(rs, rs[1].id, rs[1].id, "h") == rs[1].id
    with pytest.raises(DsvError, match="no healthy release before"):
        chosen_rollback_target(rs, rs[0].id, None, "h")
    for bad in ("r0009-20261129T101500Z-1a2b3c4d", "../r1", "latest"):
        with pytest.raises(DsvError, match="does not exist on host 'h'") as e:
            chosen_rollback_target(rs, rs[1].id, bad, "h")
        assert "dsv4ctl history --host h" in (e.value.fix or "")


def test_changed_roles() -> None:
    """The roles whose process a transition touches (what a release record calls restarted)."""
    a = {"units/x": ReleaseFile("1", ("decode",)), "units/p": ReleaseFile("5", ("prefill",)),
         "bin/p": ReleaseFile("2", ("prefill",)), "monitoring/m": ReleaseFile("3", ())}

    def changed(old: dict, new: dict) -> set[str]:
        return set(roles_affected(transition(old or None, new, None)))

    b = dict(a)
    assert changed(a, b) == set()
    b["monitoring/m"] = ReleaseFile("4", ())
    assert changed(a, b) == set()  # monitoring changes restart nothing (but are changes)
    assert transition(a, b, None) != []
    b["units/x"] = ReleaseFile("9", ("decode",))
    assert changed(a, b) == {"decode"}
    del b["bin/p"]
    assert changed(a, b) == {"decode", "prefill"}
    assert changed({}, b) == {"decode", "prefill"}
    assert release_from_manifest({"files": {"a": {"sha256": "h", "roles": ["router"]},
                                            "manifest.json": {"sha256": "m"}}}) == {
        "a": ReleaseFile("h", ("router",))}


def test_playbooks_load_and_reference_known_actions(tmp_path: Path) -> None:
    apply_pb = load_playbook("apply", set(ACTIONS))
    names = [s.name for s in apply_pb.steps]
    assert names == ["preflight", "upload", "kernels", "stop", "switch", "units", "start",
                     "health", "smoke", "measure", "qualify", "record"]
    # everything from the first step that can touch serving on rolls back
    assert [s.on_failure for s in apply_pb.steps][3:] == ["rollback"] * 9
    assert load_playbook("rollback", set(ACTIONS)).steps[-1].action == "record_rollback"
    (tmp_path / "bad.yaml").write_text("name: bad\nsteps:\n  - {name: a, action: nope}\n"
                                       "  - {name: a, action: preflight}\n")
    with pytest.raises(InputError) as exc:
        load_playbook("bad", set(ACTIONS), directory=tmp_path)
    text = exc.value.render()
    assert "unknown action" in text and "unique" in text and "bad.yaml" in text


class LocalShell:
    """The store's HostShell on this machine: the same shell commands, run by bash locally."""

    name = "local"

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return CommandResult(command, p.returncode, p.stdout, p.stderr)

    def check(self, command: str, *, timeout: float | None = None, what: str = "") -> str:
        r = self.run(command, timeout=timeout)
        if r.rc:
            raise RemoteError(f"{what} failed: {r.stderr}")
        return r.stdout

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644, chunk: int = 1 << 16,
                  on_progress: Callable[[int, int], None] | None = None) -> None:
        Path(remote_path).write_bytes(data)
        Path(remote_path).chmod(mode)

    def replace_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644) -> None:
        tmp = Path(remote_path + ".tmp")
        self.put_bytes(data, str(tmp), mode=mode)
        tmp.replace(remote_path)


def tree(decode_arg: str) -> tuple[dict[str, tuple[bytes, int]], dict[str, str]]:
    import hashlib
    import json

    files = {"bin/launch-decode.sh": (f"exec sglang {decode_arg}\n".encode(), 0o755),
             "units/dsv4-x-decode.service": (b"[Service]\n", 0o644)}
    sha = {p: hashlib.sha256(d).hexdigest() for p, (d, _) in files.items()}
    manifest = json.dumps({"format": 1, "files": {p: {"sha256": h, "roles": ["decode"]}
                                                  for p, h in sha.items()}})
    files["manifest.json"] = (manifest.encode(), 0o644)
    return files, sha


def test_store_upload_switch_prune_records(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()  # the host lock creates and checks the root (hostfs.dsv4_root)
    store = ReleaseStore(LocalShell(), str(tmp_path / "root"))
    store.ensure_layout()
    assert store.current() is None and store.list_ids() == []
    ids = [f"r{i:04d}-20261129T101500Z-0000000{i}" for i in (1, 2, 3)]
    for i, rid in enumerate(ids):
        r = rec(i + 1, "healthy")
        store.write_record(r.model_copy(update={"id": rid}))
        files, sha = tree(f"--n {i}")
        store.upload(rid, files, sha)
        store.switch(rid)
        assert store.current() == rid
        assert (tmp_path / "root/current").is_symlink()
        assert (tmp_path / f"root/releases/{rid}/bin/launch-decode.sh").stat().st_mode & 0o111
    assert store.list_ids() == ids
    assert [r.id for r in store.read_records()] == ids
    assert store.manifest(ids[0])["bin/launch-decode.sh"] == tree("--n 0")[1][
        "bin/launch-decode.sh"]
    # a corrupted upload is refused before anything moves into releases/
    files, sha = tree("--n 9")
    sha["bin/launch-decode.sh"] = "0" * 64
    with pytest.raises(RemoteError, match="verifying"):
        store.upload("r0009-20261129T101500Z-00000009", files, sha)
    assert not (tmp_path / "root/releases/r0009-20261129T101500Z-00000009/bin").exists()
    store.clean_temp()
    assert not list((tmp_path / "root/releases").glob(".tmp-*"))
    # switching to an incomplete release is refused; current stays
    with pytest.raises(RemoteError):
        store.switch("r0009-20261129T101500Z-00000009")
    assert store.current() == ids[2]
    # current points at the oldest; keep 1 keeps the newest plus current plus last healthy
    store.switch(ids[0])
    assert store.prune(1, last_healthy=ids[1]) == []
    assert store.prune(1, last_healthy=ids[0]) == [ids[1]]
    assert store.list_ids() == [ids[0], ids[2]]


def test_store_reports_unreadable_record(tmp_path: Path) -> None:
    store = ReleaseStore(LocalShell(), str(tmp_path))
    d = tmp_path / "releases" / "r0001-20261129T101500Z-00000001"
    d.mkdir(parents=True)
    (d / "record.json").write_text("{broken")
    (r,) = store.read_records()
    assert r.status == "failed" and "unreadable" in r.reason


def test_secrets_file_is_private_and_quoted(tmp_path: Path) -> None:
    store = ReleaseStore(LocalShell(), str(tmp_path))
    rid = "r0001-20261129T101500Z-00000001"
    store.write_secrets("dep", rid, {"HF_TOKEN": 'a"b\\c'})
    f = tmp_path / "secrets" / f"dep.{rid}.env"
    assert f.read_text() == 'HF_TOKEN="a\\"b\\\\c"\n'
    assert f.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700
    assert store.read_secrets("dep", rid) == {"HF_TOKEN": 'a"b\\c'}
    # written for the release only: nothing the units read changes before the switch
    assert not (tmp_path / "secrets" / "dep.env").exists() and store.read_secrets("dep") is None
    # what apply compares to decide whether the values change: the digest, computed on the host
    import hashlib

    from orchestrator.release.store import secrets_body

    assert store.secrets_digest("dep", rid) == hashlib.sha256(
        secrets_body({"HF_TOKEN": 'a"b\\c'})).hexdigest()
    assert store.secrets_digest("dep") is None
    with pytest.raises(RemoteError, match="newline"):
        store.write_secrets("dep", rid, {"X": "a\nb"})


def test_switch_owns_the_active_secrets_file(tmp_path: Path) -> None:
    """Issues 19, 20: the file the units read (secrets/<dep>.env) is the current release's,
    made so by the switch only: forward, back (rollback), removed for a release without secrets,
    kept for one that predates per-release secrets; pruning takes a release's file with it."""
    root = tmp_path / "root"
    root.mkdir()
    store = ReleaseStore(LocalShell(), str(root))
    store.ensure_layout()
    ids = [f"r{i:04d}-20261129T101500Z-0000000{i}" for i in (1, 2, 3, 4)]
    for i, rid in enumerate(ids):
        store.write_record(rec(i + 1, "healthy").model_copy(update={"id": rid}))
        store.upload(rid, *tree(f"--n {i}"))
    active = root / "secrets" / "dep.env"
    store.write_secrets("dep", ids[0], {"API": "old"})
    assert store.switch(ids[0], secrets=("dep", True)) == "activated"
    assert store.read_secrets("dep") == {"API": "old"} and active.stat().st_mode & 0o777 == 0o600
    store.write_secrets("dep", ids[1], {"API": "new"})
    assert store.read_secrets("dep") == {"API": "old"}  # uploaded, not switched: untouched
    assert store.switch(ids[1], secrets=("dep", True)) == "activated"
    assert store.read_secrets("dep") == {"API": "new"} and store.current() == ids[1]
    assert store.switch(ids[0], secrets=("dep", True)) == "activated"  # a rollback
    assert store.read_secrets("dep") == {"API": "old"}
    # status: the units' file is current's; an edit is drift (named, no value shown)
    assert store.secrets_drift("dep", ids[0], True) is None
    active.write_text('API="edited"\n')
    assert "differs from " + ids[0] in (store.secrets_drift("dep", ids[0], True) or "")
    store.switch(ids[0], secrets=("dep", True))
    # a copy, not a link: the release's own file is not changed by whatever happens to the other
    assert not active.is_symlink() and active.stat().st_ino != (
        root / "secrets" / f"dep.{ids[0]}.env").stat().st_ino
    assert store.switch(ids[2], secrets=("dep", False)) == "none"
    assert not active.exists() and store.current() == ids[2]
    assert store.secrets_drift("dep", ids[2], False) is None
    # a switch to a release without secrets creates nothing, and never removes through a link
    (root / "secrets").rename(root / "secrets.real")
    (root / "secrets").symlink_to(root / "secrets.real")
    (root / "secrets.real" / "dep.env").write_text("keep")
    with pytest.raises(RemoteError, match="symbolic link"):
        store.switch(ids[2], secrets=("dep", False))
    assert (root / "secrets.real" / "dep.env").read_text() == "keep"
    (root / "secrets").unlink()
    assert store.switch(ids[2], secrets=("dep", False)) == "none"
    assert not (root / "secrets").exists()
    (root / "secrets.real").rename(root / "secrets")
    (root / "secrets" / "dep.env").unlink()
    assert "is missing" in (store.secrets_drift("dep", ids[1], True) or "")
    store.switch(ids[0], secrets=("dep", True))
    assert store.switch(ids[3], secrets=("dep", True)) == "kept"  # named secrets, no own file
    assert store.read_secrets("dep") == {"API": "old"}
    # a link planted at the active name is refused, and current does not move
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    active.unlink()
    active.symlink_to(victim)
    with pytest.raises(RemoteError, match="symbolic link"):
        store.switch(ids[1], secrets=("dep", True))
    assert victim.read_text() == "untouched" and store.current() == ids[3]
    active.unlink()
    # pruning removes the releases' secrets files with them, never current's
    store.switch(ids[1], secrets=("dep", True))
    assert store.prune(1, last_healthy=ids[1]) == [ids[0], ids[2]]
    assert sorted(p.name for p in (root / "secrets").iterdir()) == ["dep.env", f"dep.{ids[1]}.env"]


def test_tarball_is_deterministic() -> None:
    files, _ = tree("--x")
    assert build_tarball(files) == build_tarball(dict(reversed(list(files.items()))))


def test_store_reads_several_files_of_a_release_at_once(tmp_path: Path) -> None:
    """One round trip for the three files preflight needs; contents come back exactly, and a
    missing file is an error naming the files."""
    store = ReleaseStore(LocalShell(), str(tmp_path))
    d = tmp_path / "releases" / "r0001-20260101T000000Z-00000000"
    d.mkdir(parents=True)
    (d / "a.json").write_text('{"x": 1}\n')
    (d / "b.yaml").write_text("no newline at the end")
    (d / "c").write_text("@@dsv4-fake 1\n\n")
    got = store.read_files(d.name, ["a.json", "b.yaml", "c"])
    assert got == {"a.json": '{"x": 1}\n', "b.yaml": "no newline at the end",
                   "c": "@@dsv4-fake 1\n\n"}
    with pytest.raises(RemoteError, match=r"reading a\.json, missing"):
        store.read_files(d.name, ["a.json", "missing"])
