"""Verified remote writes (issue 20 #3): a write that lands short - a full disk whose SFTP error
replies were lost in pipelining - is an error naming the real cause, and an atomic replace never
renames a short or empty temp file over the file it replaces.

The SFTP side is a small in-memory double that silently keeps only what fits on its "disk"
(what a pipelined writer sees when the error replies are lost); ``df`` answers from the same
numbers."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import RemoteError
from orchestrator.profile.inventory import Host
from orchestrator.remote.connection import RemoteHost
from orchestrator.remote.probes import CommandResult


class FullDisk:
    """An SFTP client over a dict of files with ``capacity`` bytes in all."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.files: dict[str, bytes] = {}
        self.renames: list[tuple[str, str]] = []

    def used(self) -> int:
        return sum(len(v) for v in self.files.values())

    @contextlib.contextmanager
    def open(self, path: str, mode: str) -> Any:
        self.files[path] = b""
        disk = self

        class Fh:
            def set_pipelined(self, on: bool) -> None:
                pass

            def write(self, data: bytes) -> None:
                room = max(0, disk.capacity - disk.used())
                disk.files[path] += data[:room]  # the rest is lost, and so is the error

            def chmod(self, mode: int) -> None:
                pass

        yield Fh()

    def chmod(self, path: str, mode: int) -> None:
        pass

    def stat(self, path: str) -> Any:
        return SimpleNamespace(st_size=len(self.files[path]))

    def posix_rename(self, a: str, b: str) -> None:
        self.renames.append((a, b))
        self.files[b] = self.files.pop(a)

    def remove(self, path: str) -> None:
        del self.files[path]


def host(disk: FullDisk, monkeypatch: pytest.MonkeyPatch) -> RemoteHost:
    r = RemoteHost("h", Host(address="h", gpus={"model": "x", "count": 1}))
    monkeypatch.setattr(r, "_sftp", lambda: disk)
    monkeypatch.setattr(r, "_open_new", lambda path, mode: disk.open(path, "wb"))
    monkeypatch.setattr(r, "_refuse_link", lambda path: None)
    free_kib = (disk.capacity - disk.used()) // 1024

    def run(command: str, *, timeout: float | None = None) -> CommandResult:
        assert command.startswith("df -Pk ")
        return CommandResult(command, 0, f"tmpfs 8192 8000 {free_kib} 99% /srv/dsv4\n", "")

    monkeypatch.setattr(r, "run", run)
    return r


def test_short_upload_is_an_error_naming_the_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    disk = FullDisk(capacity=4096)
    r = host(disk, monkeypatch)
    with pytest.raises(RemoteError) as exc:
        r.put_bytes(b"x" * 100_000, "/srv/dsv4/.incoming/r1.tar.gz")
    msg = exc.value.message
    assert "is short: 4096 of 100000 bytes" in msg and "the disk is full" in msg
    assert "4 KiB free under /srv/dsv4/.incoming" in msg and "nothing was replaced" in msg
    assert disk.files == {}  # the short temp file is gone, nothing was renamed into place
    r2 = host(FullDisk(capacity=1 << 30), monkeypatch)
    r2.put_bytes(b"y" * 5000, "/srv/dsv4/f")  # a complete write passes


def test_atomic_replace_never_installs_a_short_file(monkeypatch: pytest.MonkeyPatch) -> None:
    disk = FullDisk(capacity=2000)
    disk.files["/srv/dsv4/releases/r1/record.json"] = b'{"id": "r1"}'
    r = host(disk, monkeypatch)
    with pytest.raises(RemoteError, match="is short"):
        r.replace_bytes(b"z" * 5000, "/srv/dsv4/releases/r1/record.json")
    assert disk.renames == []  # nothing renamed over the record
    assert disk.files == {"/srv/dsv4/releases/r1/record.json": b'{"id": "r1"}'}  # temp removed
    disk.capacity = 1 << 20
    r.replace_bytes(b"z" * 5000, "/srv/dsv4/releases/r1/record.json")
    assert disk.files["/srv/dsv4/releases/r1/record.json"] == b"z" * 5000
