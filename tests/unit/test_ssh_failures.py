"""Connecting to something that is not a working sshd fails at once, in one clean line with the real
cause, and paramiko's own tracebacks stay out of the output (they go to stderr only with --debug).

Local TCP servers stand in for the broken hosts: one accepts and never speaks, one answers text that
is not SSH, and a closed port refuses. Each counts the connections it accepted, so "not retried" is
checked by count, not by a timed assertion.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main


class _Server:
    def __init__(self, reply: bytes | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(c)
            if self.reply is not None:
                c.sendall(self.reply)

    def close(self) -> None:
        self._stop = True
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def silent() -> Iterator[_Server]:
    s = _Server(None)
    yield s
    s.close()


@pytest.fixture
def http() -> Iterator[_Server]:
    s = _Server(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\r\nnot here\r\n")
    yield s
    s.close()


def _inventory(tmp_path: Path, port: int) -> Path:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"apiVersion": "dsv4ctl/v1", "hosts": {"h": {
        "address": "127.0.0.1", "port": port, "user": "nobody", "connect_timeout_s": 1,
        "gpus": {"model": "rtx-pro-6000-se", "count": 8}}}}))
    return inv


def _status(tmp_path: Path, port: int, *extra: str) -> int:
    return main(["status", "--host", "h", "-i", str(_inventory(tmp_path, port)), *extra])


def _clean(err: str) -> None:
    assert "Traceback" not in err and "paramiko" not in err.lower()
    # one error and its fix (each may fold onto continuation lines to fit 100 columns)
    heads = [ln for ln in err.strip().splitlines() if not ln.startswith("    ")]
    assert [h.split(":")[0].strip() for h in heads] == ["error", "fix"], err


def _unfold(err: str) -> str:
    return " ".join(ln.strip() for ln in err.splitlines())


def test_silent_port_fails_once_as_not_ssh(tmp_path: Path, silent: _Server,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    assert _status(tmp_path, silent.port) == 1
    err = capfd.readouterr().err
    assert "accepted the connection but sent no SSH banner within 1s" in _unfold(err)
    _clean(err)
    assert silent.accepted <= 2  # one attempt (+ the diagnosis' peek), not four with backoff


def test_non_ssh_answer_is_named(tmp_path: Path, http: _Server,
                                 capfd: pytest.CaptureFixture[str]) -> None:
    assert _status(tmp_path, http.port) == 1
    err = capfd.readouterr().err
    assert "answered 'HTTP/1.1 400 Bad Request', which is not SSH" in _unfold(err)
    _clean(err)
    assert http.accepted <= 2


def test_refused_port_says_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    import orchestrator.remote.connection as conn

    monkeypatch.setattr(conn, "BACKOFF_S", 0.0)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    assert _status(tmp_path, port) == 1
    err = capfd.readouterr().err
    assert f"connection refused on port {port} (nothing listens there)" in _unfold(err)
    _clean(err)


def test_debug_shows_the_library_log(tmp_path: Path, silent: _Server,
                                       capfd: pytest.CaptureFixture[str]) -> None:
    assert _status(tmp_path, silent.port, "--debug") == 1
    err = capfd.readouterr().err
    assert "paramiko.transport" in err
    assert _status(tmp_path, silent.port) == 1  # and the next run without --debug is quiet again
    _clean(capfd.readouterr().err)
