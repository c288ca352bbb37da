"""Bounded SSH on a harness host (issue 31, Deliver 4).

Before: a 300 MB remote file cost 660 MiB of controller memory (HTTP was capped, SSH was not), and
a remote command outlived the controller: one kept writing into the host's temp directory after
dsv4ctl was killed. Now every output read is capped with a clear error past the cap, a command
dies with its channel (its process group is ended host-side when the channel closes: a timeout,
a closed connection or a killed controller), and the probe batch keeps its files in dsv4ctl's own
directory, capped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.errors import DsvError
from orchestrator.remote import connection
from orchestrator.remote.connection import RemoteHost
from orchestrator.remote.probes import collect_facts
from tests.integration.test_apply import MODEL, ROOT, Env, env  # noqa: F401  (env is a fixture)

pytestmark = pytest.mark.integration

PIDFILE = f"{ROOT}/bound-test.pid"


def _gone(e: Env, pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        state = e.fake.exec(f"sed -n 's/^State:[[:space:]]*//p' /proc/{pid}/status"
                            ).stdout.strip()
        if not state or state.startswith(("Z", "X")):
            return True
        time.sleep(0.2)
    return False


def _pid(e: Env) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = e.fake.exec(f"cat {PIDFILE} 2>/dev/null").stdout.strip()
        if out.isdigit():
            return int(out)
        time.sleep(0.1)
    raise AssertionError("the remote command never started")


@pytest.fixture
def host(env: Env) -> Env:  # noqa: F811
    env.fake.exec(f"mkdir -p {ROOT} && rm -f {PIDFILE}", check=True)
    return env


def test_output_past_the_cap_is_a_clear_error_and_ends_the_command(
        host: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "MAX_STDOUT", 1 << 20)
    with RemoteHost("h", host.host).connect() as remote, pytest.raises(DsvError) as exc:
        remote.run(f"echo $$ > {PIDFILE}; exec yes dsv4-bound-test", timeout=60)
    assert "passed 1 MiB; dsv4ctl stopped reading and ended the command" in exc.value.render()
    assert _gone(host, _pid(host)), "the command outlived its channel"


def test_a_timed_out_command_dies_with_its_channel(host: Env) -> None:
    with RemoteHost("h", host.host).connect() as remote, pytest.raises(DsvError, match="timed"):
        remote.run(f"sh -c 'echo $$ > {PIDFILE}; sleep 300 & wait'", timeout=1.5)
    pid = _pid(host)
    assert _gone(host, pid)
    child = host.fake.exec(f"pgrep -P {pid}").stdout.split()
    assert not child, "its child survived"


KILLED = """
import sys
from orchestrator.profile.inventory import Host
from orchestrator.remote.connection import RemoteHost
remote = RemoteHost("h", Host.model_validate_json(sys.argv[1])).connect()
print("connected", flush=True)
remote.run(sys.argv[2], timeout=600)
"""


def test_a_command_ends_when_the_controller_is_killed(host: Env) -> None:
    writer = f"echo $$ > {PIDFILE}; exec sh -c 'while :; do echo x; sleep 0.05; done' > /dev/null"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, host.host.model_dump_json(), writer],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "connected"
        pid = _pid(host)
        assert not _gone(host, pid, within=1.0)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the controller, started by this test
        proc.wait(timeout=30)
    assert _gone(host, pid, within=15.0), "the remote command outlived the killed controller"


def test_a_probe_reading_a_huge_file_is_cut_in_dsv4ctls_own_directory(host: Env) -> None:
    index = f"{MODEL}/model.safetensors.index.json"
    host.fake.exec(f"mv {index} {index}.real && truncate -s 17M {index}", check=True)  # sparse
    try:
        with RemoteHost("h", host.host).connect() as remote, pytest.raises(DsvError) as exc:
            collect_facts(remote, "h", host.host, model_paths=[MODEL])
        assert "passed 16 MiB; dsv4ctl cut it there" in exc.value.render()
        left = host.fake.exec("ls -A \"${XDG_RUNTIME_DIR:-$HOME/.cache}/dsv4ctl\"").stdout.split()
        assert left == [], f"the batch left {left} behind"
    finally:
        host.fake.exec(f"rm -f {index} && mv {index}.real {index}", check=True)
