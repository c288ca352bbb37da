"""The wrapper every SSH command runs in (:func:`orchestrator.remote.connection.die_with_channel`)
starts the user's shell start-up once, as sshd itself does, never a second time per command
(issue 30: with a `pyenv init` in root's ~/.bashrc, the second read cost each command ~0.1 s and a
no-change apply a third of its time).

sshd runs a command as ``$SHELL -c COMMAND`` with SSH_CLIENT set; Debian's bash then reads
~/.bashrc even though the shell is not interactive. Here that is a local ``bash -c`` with the same
environment and a ~/.bashrc that counts its reads, in the test's own temporary HOME."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.remote.connection import die_with_channel


def run_as_sshd(command: str, home: Path) -> subprocess.CompletedProcess[bytes]:
    env = {"HOME": str(home), "SSH_CLIENT": "10.0.0.1 40000 22", "SHELL": "/bin/bash",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run(["bash", "-c", command], env=env, input=b"", capture_output=True,
                          timeout=30, check=False)


def test_the_users_shell_start_up_is_read_once_per_command(tmp_path: Path) -> None:
    count = tmp_path / "reads"
    (tmp_path / ".bashrc").write_text(f"echo read >> {count}\nexport DSV4_FROM_RC=yes\n")
    # the sshd-like start without the wrapper: how often bash reads its rc on this machine
    count.write_text("")
    assert run_as_sshd("true", tmp_path).returncode == 0
    baseline = count.read_text().count("read")
    count.write_text("")
    res = run_as_sshd(die_with_channel("echo \"$DSV4_FROM_RC\"; exit 3"), tmp_path)
    assert res.returncode == 3  # the command's status comes back
    assert res.stdout.decode().strip() == "yes"  # and it sees what the start-up exports
    assert count.read_text().count("read") == baseline, count.read_text()
