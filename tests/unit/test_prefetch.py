"""Preflight's reads run ahead in one round trip (issue 20 #10, orchestrator/apply/prefetch.py).

The store's readers answered from one batched script give exactly what they give run one by one
(a local sh stands in for the host), each prefetched answer is used once, and a command that was
not predicted goes to the real shell.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.apply.prefetch import Batch, Prefetched, prefetched
from orchestrator.errors import RemoteError
from orchestrator.release.store import MANIFEST, PLAN, ReleaseStore
from tests.unit.test_release import LocalShell

RID = "r0001-20260101T000000Z-00000000"


class Counting(LocalShell):
    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str, *, timeout: float | None = None):  # type: ignore[no-untyped-def]
        self.commands.append(command)
        return super().run(command, timeout=timeout)


def _host(tmp_path: Path) -> None:
    d = tmp_path / "releases" / RID
    d.mkdir(parents=True)
    (d / MANIFEST).write_text('{"files": {}}\n')
    (d / PLAN).write_text("{}")
    (d / "profile.yaml").write_text("name: x\n")
    (d / "record.json").write_text("{broken")
    (tmp_path / "current").symlink_to(f"releases/{RID}")
    (tmp_path / "releases" / ".tmp-leftover").mkdir()


def test_store_reads_from_one_batch_equal_the_reads_one_by_one(tmp_path: Path) -> None:
    _host(tmp_path)
    direct = ReleaseStore(LocalShell(), str(tmp_path))
    want = (direct.current(), [r.model_dump() for r in direct.read_records()],
            direct.read_files(RID, [MANIFEST, PLAN, "profile.yaml"]))

    shell = Counting()
    store = ReleaseStore(shell, str(tmp_path))
    batch = Batch([store.ensure_layout_command(clean=True), store.current_command(),
                   store.records_command(),
                   store.read_files_command(RID, [MANIFEST, PLAN, "profile.yaml"])])
    results = batch.results(shell.run(batch.script).stdout)
    ctx = SimpleNamespace(remote=shell, store=store, svc=SimpleNamespace(remote=shell))
    with prefetched(ctx, results):
        store.ensure_layout(clean=True)
        got = (store.current(), [r.model_dump() for r in store.read_records()],
               store.read_files(RID, [MANIFEST, PLAN, "profile.yaml"]))
        assert len(shell.commands) == 1  # the batch only
        store.current()  # a second read is not answered from the batch: it goes to the host
        assert len(shell.commands) == 2
    assert store.shell is shell and ctx.svc.remote is shell  # restored after the block
    assert got == want
    assert not (tmp_path / "releases" / ".tmp-leftover").exists()  # ensure_layout ran


def test_prefetched_passes_unpredicted_commands_and_failures_through(tmp_path: Path) -> None:
    shell = Counting()
    batch = Batch(["echo ahead", "echo oops >&2; exit 4"])
    pf = Prefetched(shell, batch.results(shell.run(batch.script).stdout))
    assert pf.run("echo ahead").stdout == "ahead\n" and len(shell.commands) == 1
    assert pf.run("echo other").stdout == "other\n" and len(shell.commands) == 2
    # RemoteHost.check's wording, from the prefetched result
    with pytest.raises(RemoteError, match=r"the thing failed on host 'local' \(exit 4\): oops"):
        pf.check("echo oops >&2; exit 4", what="the thing")
    assert len(shell.commands) == 2
    assert pf.name == "local"  # everything else is the real shell's
