"""``unlock --force`` signals only the process that really holds the lock (issue 31, Deliver 5).

Before: it signalled the pid named in the lock's info file, even when another process held the
lock: the real holder survived, the named process and its children did not. Now the holder is
the one the host's kernel lists for the lock file (/proc/locks); the info file is display only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.remote.lock import parse_lock_holders
from tests.integration.test_apply import ROOT, Env, env  # noqa: F401  (env is a fixture)

pytestmark = pytest.mark.integration


def _alive(e: Env, pid: int) -> bool:
    """Running (a zombie nobody reaped yet has ended)."""
    state = e.fake.exec(f"sed -n 's/^State:[[:space:]]*//p' /proc/{pid}/status").stdout.strip()
    return bool(state) and not state.startswith(("Z", "X"))


@pytest.fixture
def started(env: Env) -> Iterator[tuple[Env, list[int]]]:  # noqa: F811
    pids: list[int] = []
    yield env, pids
    for pid in pids:  # only what this test started, by pid
        env.fake.exec(f"kill -KILL {pid} 2>/dev/null")


def _spawn(e: Env, cmd: str, pids: list[int]) -> int:
    out = e.fake.exec(f"nohup {cmd} >/dev/null 2>&1 </dev/null & echo $!", check=True).stdout
    pid = int(out.strip())
    pids.append(pid)
    return pid


def test_unlock_force_ends_the_kernels_holder_not_the_info_files_pid(
        started: tuple[Env, list[int]], capsys: pytest.CaptureFixture[str]) -> None:
    e, pids = started
    e.fake.exec(f"mkdir -p {ROOT}", check=True)
    victim = _spawn(e, "sh -c 'sleep 600 & wait'", pids)
    child = int(e.fake.exec(f"sleep 0.3; pgrep -P {victim}").stdout.split()[0])
    pids.append(child)
    holder = _spawn(e, f"flock {ROOT}/.dsv4ctl.lock sleep 600", pids)
    e.fake.exec(f"sleep 0.3; printf '%s\\n%s\\n' {victim} "
                "'{\"user\": \"x\", \"command\": \"dsv4ctl apply\"}' "
                f"> {ROOT}/.dsv4ctl.lock.info", check=True)
    assert not e.lock_free()
    assert e.cli("unlock", "--host", "h", "--force") == 0, capsys.readouterr()
    assert e.lock_free()
    assert not _alive(e, holder)
    assert _alive(e, victim) and _alive(e, child), "the info file's pid was signalled"


def test_the_lock_table_names_holders_not_waiters() -> None:
    table = ("KEY fe:00:42\n"
             "1: FLOCK  ADVISORY  WRITE 100 fe:00:42 0 EOF\n"
             "1: -> FLOCK  ADVISORY  WRITE 200 fe:00:42 0 EOF\n"
             "2: FLOCK  ADVISORY  WRITE 300 fe:00:43 0 EOF\n"
             "3: POSIX  ADVISORY  WRITE 400 fe:00:42 0 EOF\n")
    assert parse_lock_holders(table) == [100]
    assert parse_lock_holders(table.replace("KEY fe:00:42\n", "")) == []
