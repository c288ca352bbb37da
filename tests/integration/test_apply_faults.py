"""The fault matrix of issue 20 ("apply that never lies") against fake hosts.

Owns the proof that every fault ends healthy or honestly down: a dropped connection right after
the ``current`` switch, dsv4ctl SIGKILLed in each phase then re-run, a concurrent saved-plan
apply, a rollback refused or failing, a failed restore recovered, a failed attempt re-planned.
After each case the harness observes the host itself (units, their PIDs and restarts, ``current``,
the lock, generation through the router, the kernels each running engine loaded) and checks that
``dsv4ctl status`` and ``history`` say the same (:func:`agree`). The cases marked ``kernels_on``
ship the bundled kernels in every release, so that part of the check is real there. The cases
share the session's fake hosts (``hosts`` fixture) and reset host1 between cases (the ``env``
fixture of ``test_apply``), so the matrix adds about a minute.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import ExitCode
from orchestrator.profile import load_text
from orchestrator.profile.schema import Profile
from tests.integration import test_apply as base
from tests.integration.test_apply import REPO, ROOT, Env, decode_knob, first_release, journal, rule

pytestmark = pytest.mark.integration
env = base.env  # the same fixture: host1 reset before and after each case
UNITS = {"prefill": "dsv4-itest-prefill.service", "decode": "dsv4-itest-decode.service",
         "router": "dsv4-itest-router.service"}
ENGINES = ("prefill", "decode")
HOOK_PTH = "/opt/sglang-env/lib/python3*/site-packages/dsv4_kernels_sglang.pth"


@pytest.fixture
def kernels_on(monkeypatch: pytest.MonkeyPatch, env: Env) -> Any:
    """Every profile of the case ships the bundled kernels (no self-test: the simulator has no
    GPU); the SGLang hook line they install in the shared engine env is removed afterwards."""
    plain = base.profile_dict

    def with_kernels(*a: Any, **kw: Any) -> dict[str, Any]:
        d = plain(*a, **kw)
        d["kernels"] = {"attention": "bundled", "indexer": "bundled", "mhc_pre": "engine",
                        "selftest": False}
        return d

    monkeypatch.setattr(base, "profile_dict", with_kernels)
    yield
    env.fake.exec(f"rm -f {HOOK_PTH}")


def cli_json(env: Env, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    capsys.readouterr()
    rc = env.cli(*args)
    return rc, json.loads(capsys.readouterr().out)


def said(capsys: pytest.CaptureFixture[str]) -> str:
    """Everything dsv4ctl printed (the result goes to stdout or stderr depending on its kind),
    with line folding undone (messages are wrapped to the terminal's width)."""
    c = capsys.readouterr()
    return " ".join((c.out + c.err).split())


def run_printed(out: str, verb: str, release: str) -> int:
    """Run the `dsv4ctl VERB ... RELEASE ... --host h` that dsv4ctl printed, exactly as printed
    (its own -p/-i/--host), with only --yes added: pytest's stdin is not a terminal."""
    from orchestrator.cli import main

    m = re.search(rf"dsv4ctl ({verb} [^`]*?{release}[^`]*?--host h)(?:$|[` ])", out)
    assert m, f"no printed 'dsv4ctl {verb} ... {release} ... --host h' in: {out}"
    argv = shlex.split(m.group(1))
    assert "-i" in argv or "--inventory" in argv, f"the printed command names no inventory: {argv}"
    return main([*argv, "--yes"])


def observed_units(env: Env) -> dict[str, dict[str, Any]]:
    """What systemd on the host says, read by the harness (not through dsv4ctl)."""
    out = {}
    for role, unit in UNITS.items():
        show = env.fake.exec(f"systemctl --user show -p ActiveState -p SubState -p MainPID "
                             f"-p NRestarts {unit}").stdout
        kv = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        out[role] = {"active": f"{kv.get('ActiveState')}/{kv.get('SubState')}",
                     "pid": int(kv.get("MainPID") or 0), "restarts": int(kv.get("NRestarts") or 0)}
    return out


def observed_kernels(env: Env, units: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """Engine role -> the kernels its running process loaded, read by the harness on the host:
    the hook's activation line for the unit's MainPID in the role's log, the release directory
    it names and that release's kernels.json digest; None when that process logged no line."""
    out: dict[str, str | None] = {}
    for role in ENGINES:
        pid = units[role]["pid"]
        if not pid:
            continue
        log = env.fake.exec(f"cat {ROOT}/logs/{role}.log").stdout
        lines = [ln for ln in log.splitlines()
                 if ln.startswith(f"[dsv4_kernels] active (pid {pid}): kernels from ")]
        if not lines:
            out[role] = None
            continue
        m = re.fullmatch(rf"{re.escape(ROOT)}/releases/(r[^/]+)/kernels", lines[-1].split()[-1])
        assert m, lines[-1]
        digest = json.loads(env.fake.read(f"{ROOT}/releases/{m[1]}/kernels.json"))["sha256"]
        out[role] = f"release {m[1]}, sha256 {digest[:12]}"
    return out


def agree(env: Env, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`dsv4ctl status` and `history` describe the host as the harness observes it: current,
    each unit's state, pid and restarts, the kernels each running engine loaded (status: now;
    history: the current release's, when it was verified healthy, which a healthy current
    release's engines still are), every release's record, no record left "applying", the lock
    free. Returns the status document."""
    assert env.lock_free(), "the host lock is still held"
    rc, st = cli_json(env, capsys, "status", "--host", "h", "--format", "json")
    cur = env.current()
    assert st["current"] == cur and st["locked_by"] is None
    if cur is not None:
        assert st["current_status"] == env.record(cur)["status"]
        seen = observed_units(env)
        assert {u["role"]: {k: u[k] for k in ("active", "pid", "restarts")}
                for u in st["units"]} == seen
        assert st["healthy"] == (rc == 0 or bool(st["file_drift"] or st["profile_drift"]))
        assert st["healthy"] == env.serves()
        kernels = observed_kernels(env, seen)
        planned = json.loads(env.fake.read(f"{ROOT}/releases/{cur}/plan.json"))["deployment"]
        # the release ships the kernels where some role runs a bundled op (kernel_paths)
        shipped = any(p["path"] == "bundled" for r in planned["roles"]
                      for p in r.get("kernels", []))
        said_now = {u["role"]: u.get("kernels") for u in st["units"] if u["role"] in kernels}
        if shipped:
            assert said_now == {r: k or "none loaded (no activation line from this pid in its "
                                "log)" for r, k in kernels.items()}
            if st["healthy"]:  # every engine runs the current release's kernels (by content)
                digest = json.loads(env.fake.read(f"{ROOT}/releases/{cur}/kernels.json"))
                assert kernels and all(k and k.endswith(f"sha256 {digest['sha256'][:12]}")
                                       for k in kernels.values()), kernels
        else:
            assert said_now == dict.fromkeys(kernels) and not any(kernels.values()), kernels
    _, hist = cli_json(env, capsys, "history", "--host", "h", "--json")
    assert [r["id"] for r in hist] == env.releases()
    for row in hist:
        rec = env.record(row["id"])
        assert row["current"] == (row["id"] == cur)
        assert rec["status"] != "applying" and row["status"] == rec["status"], row
        assert all(e["result"] != "running" for e in rec["journal"]), rec["journal"]
        assert row["kernels"] == rec.get("kernels", [])
        if row["current"] and rec["status"] == "healthy":
            assert {k["role"]: (k["pid"], k["loaded"]) for k in row["kernels"]} == {
                r: (seen[r]["pid"], k) for r, k in kernels.items() if shipped}, row["kernels"]
    return st


# --------------------------------------------------------------- a fault right after the switch ---

@pytest.mark.usefixtures("kernels_on")
def test_connection_dropped_right_after_switch_rolls_back(env: Env, monkeypatch: Any,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """Issue 20 #1: the journal write after the switch fails with the connection; that is a
    failure of the switch step, so the previous release is restored (it used to exit 1 with
    decode stopped and the journal at `switch: running`)."""
    from orchestrator.apply import steps

    r1 = first_release(env)
    real_switch = steps.ACTIONS["switch_current"]

    def switch_then_drop(ctx: Any, step: Any) -> Any:
        out = real_switch(ctx, step)
        if ctx.journal_prefix == "":
            ctx.remote.connection.client.get_transport().close()  # the network goes away
        return out

    monkeypatch.setitem(steps.ACTIONS, "switch_current", switch_then_drop)
    assert env.apply(decode_knob(env, 32), name="p2.json") == ExitCode.ROLLED_BACK
    monkeypatch.undo()
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    rec = env.record(r2)
    assert rec["status"] == "rolled-back" and journal(rec)["switch"] == "failed"
    assert "journal could not be written" in next(e["error"] for e in rec["journal"]
                                                  if e["step"] == "switch")
    assert journal(rec)["rollback:health"] == "ok"
    agree(env, capsys)


# ------------------------------------------------------- SIGKILL of dsv4ctl in each phase, re-run ---

PAUSED_RUN = """
import sys, time
from orchestrator.apply import steps
action = sys.argv.pop(1)
real = steps.ACTIONS[action]
def paused(ctx, step):
    if ctx.journal_prefix == "":
        print("PAUSED", flush=True)
        time.sleep(600)
    return real(ctx, step)
steps.ACTIONS[action] = paused
from orchestrator.cli import entrypoint
entrypoint()
"""


def kill_during(env: Env, action: str, *args: str) -> str:
    """Run `dsv4ctl ARGS` in a subprocess, SIGKILL it when it reaches step ``action``; returns
    its output."""
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", PAUSED_RUN, action, *args, "--yes", "-i",
         str(env.inventory_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    lines: list[str] = []
    paused = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == "PAUSED":
                paused.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    ok = paused.wait(90)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    t.join(5)
    assert ok, "dsv4ctl never reached " + action + ":\n" + "".join(lines)
    deadline = time.monotonic() + 15
    while not env.lock_free():  # the kernel frees the lock once sshd sees the connection gone
        assert time.monotonic() < deadline, "lock still held after its holder was killed"
        time.sleep(0.2)
    return "".join(lines)


@pytest.mark.usefixtures("kernels_on")
@pytest.mark.parametrize(("action", "phase"), [
    ("stop_changed", "before the switch"),
    ("install_units", "right after the switch"),
    ("wait_healthy", "during health"),
])
def test_sigkill_in_each_phase_then_plain_rerun(env: Env, capsys: pytest.CaptureFixture[str],
                                                action: str, phase: str) -> None:
    """Issue 20 #7 and the matrix: whatever phase dsv4ctl dies in, the lock is free, `current`
    is complete, `status`/`history` tell the truth (the lost release shows as interrupted, not
    "applying"), and a plain re-run ends healthy, marking the lost record interrupted with what
    is known on the host."""
    r1 = first_release(env)
    p2 = env.profile_file(decode_knob(env, 32), "p2.yaml")
    kill_during(env, action, "apply", str(p2))
    r2 = next(r for r in env.releases() if r != r1)
    assert env.record(r2)["status"] == "applying"  # what the lost run left on the host
    cur = env.current()
    assert cur == (r1 if action == "stop_changed" else r2)
    assert env.fake.exec(f"test -f {ROOT}/current/manifest.json").returncode == 0
    # status/history before any re-run: the lost release is reported as interrupted
    capsys.readouterr()
    _, hist = cli_json(env, capsys, "history", "--host", "h", "--json")
    row = next(r for r in hist if r["id"] == r2)
    assert row["status"] == "interrupted" and "lost" in row["failed_step"]
    _, st = cli_json(env, capsys, "status", "--host", "h", "--format", "json")
    assert st["current"] == cur and st["healthy"] == env.serves()
    assert {u["role"]: u["pid"] for u in st["units"]} == {
        r: v["pid"] for r, v in observed_units(env).items()}
    if action == "stop_changed":
        assert env.serves()  # nothing serving was touched
    # a plain re-run of the same command
    capsys.readouterr()
    assert env.cli("apply", str(p2)) == 0, capsys.readouterr()
    r3 = env.current()
    assert r3 not in (r1, r2) and env.record(r3)["status"] == "healthy"
    lost = env.record(r2)
    assert lost["status"] == "interrupted"
    event = lost["events"][-1]
    assert event["kind"] == "reconciled" and event["detail"], phase
    assert ("current points at it" in event["detail"]) == (cur == r2)
    assert env.serves()
    agree(env, capsys)


# ---------------------------------------------------------------------------- locks, exit codes ---

@pytest.mark.usefixtures("kernels_on")
def test_concurrent_saved_plan_apply_is_locked_not_stale(env: Env,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """Issue 20 #9: the lock is taken before the stale check, so a saved plan applied while
    another run holds the host is refused as locked (5), even when the host moved meanwhile."""
    from orchestrator.remote.connection import connect
    from orchestrator.remote.lock import HostLock
    from tests.sim.nvidia_smi import default_config

    r1 = first_release(env)
    plan = env.save(env.plan(decode_knob(env, 32)), "p2.json")
    with connect(env.host_name, env.host) as remote:
        lock = HostLock(remote, ROOT, "dsv4ctl apply other.json")
        lock.acquire()
        env.fake.set_gpus(default_config(7))  # the other run's host changes under it
        try:
            capsys.readouterr()
            assert env.cli("apply", str(plan)) == ExitCode.LOCKED
            assert "locked by another dsv4ctl run" in capsys.readouterr().err
        finally:
            env.fake.set_gpus(default_config(8))
            lock.release()
    assert env.current() == r1 and env.releases() == [r1]
    assert env.cli("apply", str(plan)) == 0  # and once free, the same plan applies
    agree(env, capsys)


@pytest.mark.usefixtures("kernels_on")
def test_refused_rollback_to_incomplete_release_changes_nothing(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 20 #9: nothing changed, so exit 1 (not 4, "restore failed"); the refusal is saved in
    the target's record."""
    r1 = first_release(env)
    assert env.apply(decode_knob(env, 32), name="p2.json") == 0
    r2 = env.current()
    env.fake.exec(f"rm {ROOT}/releases/{r1}/plan.json", check=True)
    pids = observed_units(env)
    capsys.readouterr()
    assert env.cli("rollback", r1, "--host", "h") == ExitCode.ERROR
    out = said(capsys)
    assert "nothing was changed" in out and "plan.json is missing" in out
    assert env.current() == r2 and observed_units(env) == pids and env.serves()
    ev = env.record(r1)["events"][-1]
    assert ev["kind"] == "rollback-to" and ev["result"] == "failed"
    assert journal(env.record(r1))["rollback:preflight"] == "failed"
    agree(env, capsys)


@pytest.mark.usefixtures("kernels_on")
def test_explicit_rollback_to_broken_release_falls_back(env: Env,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """Issue 20 #4 and #7: a rollback whose target never becomes healthy puts the release that
    was serving back (exit 3), saves its record, and the target is no longer marked healthy."""
    assert env.apply(decode_knob(env, 40), name="p1.json") == 0
    r1 = env.current()
    assert env.apply(decode_knob(env, 32), name="p2.json") == 0
    r2 = env.current()
    # r1's decode command line never becomes ready any more; r2's is fine
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 40", {"never_ready": True}))
    capsys.readouterr()
    assert env.cli("rollback", r1, "--host", "h") == ExitCode.ROLLED_BACK
    assert f"fell back to {r2}" in said(capsys)
    assert env.current() == r2 and env.serves()
    t = env.record(r1)
    assert t["status"] == "unhealthy"
    assert journal(t)["rollback:health"] == "failed" and journal(t)["fallback:health"] == "ok"
    assert any(e["kind"] == "rollback-to" and e["result"] == "failed" for e in t["events"])
    assert env.record(r2)["status"] == "healthy"
    assert env.record(r2)["events"][-1]["kind"] == "rollback-to"
    agree(env, capsys)


@pytest.mark.usefixtures("kernels_on")
def test_failed_restore_then_printed_recovery_works(env: Env,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 20 #4 and #7: after a failed restore (exit 4) the target is not left marked healthy,
    and the printed `dsv4ctl rollback r1` works once the cause is fixed, because a role that runs
    but is unhealthy is restarted."""
    r1 = first_release(env)
    env.fake.write_sim_control(rule("--disaggregation-mode decode", {"never_ready": True}))
    capsys.readouterr()
    assert env.apply(decode_knob(env, 32), name="p2.json") == ExitCode.ROLLBACK_FAILED
    out = said(capsys)
    assert re.search(rf"dsv4ctl rollback [^`]*{r1}[^`]*--host h", out), out
    assert env.record(r1)["status"] == "unhealthy"
    assert env.current() == r1 and not env.serves()
    env.fake.write_sim_control({})  # the cause is fixed
    before = observed_units(env)["decode"]
    assert before["active"] == "active/running"  # runs, but never became ready
    assert run_printed(out, "rollback", r1) == 0, said(capsys)
    # the running-but-unhealthy decode was restarted (a new process), not just re-verified
    assert observed_units(env)["decode"]["pid"] not in (0, before["pid"])
    env.assert_recovered(r1)
    agree(env, capsys)


@pytest.mark.usefixtures("kernels_on")
def test_failed_attempt_then_replan_applies(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 20 #8: the plan saved before a failed attempt stays refused, a re-plan (which saw the
    attempt) gets a new id and applies."""
    r1 = first_release(env)
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 32", {"never_ready": True}))
    old = env.save(env.plan(decode_knob(env, 32)), "p2.json")
    assert env.cli("apply", str(old)) == ExitCode.ROLLED_BACK
    env.fake.write_sim_control({})
    capsys.readouterr()
    assert env.cli("apply", str(old)) == ExitCode.STALE_PLAN
    assert "already applied" in capsys.readouterr().err
    saved = env.tmp / "replan.json"
    prof = env.profile_file(decode_knob(env, 32), "p2.yaml")
    assert env.cli("plan", str(prof), "--host", "h", "--live", "-o", str(saved)) == 0
    assert env.cli("apply", str(saved)) == 0
    assert env.current() not in (r1, None) and env.serves()
    agree(env, capsys)


# ------------------------------------------------------------------------- the stability window ---

def test_engine_killed_during_the_stability_window_rolls_back(env: Env,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    """Issue 20 #2: healthy at first, dead 3 s later. It used to pass (a 2 s settle, exit 0, a
    release recorded healthy with a dead decode); now the window catches it and rolls back."""
    r1 = first_release(env)
    d = base.profile_dict()
    d["health"]["stability_window_s"] = 8
    d["topology"]["decode"]["cuda_graph_max_bs"] = 32
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 32", {"crash_after_s": 3.0}))
    capsys.readouterr()
    prof = load_text(Profile, yaml.safe_dump(d), "p.yaml")
    assert env.apply(prof, name="p2.json") == ExitCode.ROLLED_BACK
    assert "stability window" in said(capsys)
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    rec = env.record(r2)
    err = next(e["error"] for e in rec["journal"] if e["step"] == "health")
    # caught by whichever check sees the dead engine first: its unit (crashed) or its port
    assert rec["status"] == "rolled-back" and "stability window" in err
    assert "crashed" in err or "no answer" in err, err
    agree(env, capsys)


# ----------------------------------------------------------------------- sshd killed mid-upload ---

def sshd_pids(env: Env) -> list[int]:
    """Every sshd process of this fake host (listener and sessions), from its cgroup."""
    pids = []
    for procs in env.fake.cgroup.rglob("cgroup.procs"):
        for pid in procs.read_text().split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                    pids.append(int(pid))
            except OSError:
                continue
    return pids


def test_sshd_killed_mid_upload_then_restored(env: Env, monkeypatch: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The host's sshd (listener and every session) dies mid-upload and comes back a second
    later: the apply reconnects, records the failed upload, exits 1; the old release never
    stopped serving."""
    from orchestrator.remote.connection import RemoteHost

    r1 = first_release(env)
    original = RemoteHost.put_bytes
    killed = threading.Event()

    def killing(self: RemoteHost, data: bytes, remote_path: str, **kw: Any) -> None:
        if remote_path.endswith(".tar.gz") and not killed.is_set():
            def cut(done: int, total: int) -> None:
                if done >= total // 2 and not killed.is_set():
                    killed.set()
                    for pid in sshd_pids(env):
                        os.kill(pid, signal.SIGKILL)
                    threading.Timer(1.0, env.fake._sshd_up).start()
            kw["on_progress"], kw["chunk"] = cut, 4096
        original(self, data, remote_path, **kw)

    monkeypatch.setattr(RemoteHost, "put_bytes", killing)
    capsys.readouterr()
    assert env.apply(decode_knob(env, 24), name="p2.json") == ExitCode.ERROR
    monkeypatch.undo()
    assert killed.is_set()
    assert "nothing serving was changed" in said(capsys)
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    rec = env.record(r2)
    assert rec["status"] == "failed" and journal(rec)["upload"] == "failed"
    assert journal(rec)["switch"] == "not-run"
    agree(env, capsys)


# ------------------------------------------------------------------------------------ disk full ---

class SmallDisk:
    """An 8 MiB tmpfs over the install root inside the host's mount namespace (holding a copy of
    what was there), which the test fills up; undone on exit."""

    def __init__(self, env: Env) -> None:
        self.env = env

    def __enter__(self) -> SmallDisk:
        # owned like the install root it covers, mode 0755: dsv4ctl refuses a group- or
        # world-writable install root (tmpfs's default is 1777)
        self.env.fake.exec(f"mkdir -p /run/smalldisk && mount -t tmpfs -o size=8m,mode=0755,"
                           f"uid=$(stat -c %u {ROOT}),gid=$(stat -c %g {ROOT}) tmpfs "
                           f"/run/smalldisk && cp -a {ROOT}/. /run/smalldisk/ && "
                           f"mount --bind /run/smalldisk {ROOT}", check=True, root=True)
        return self

    def fill(self, leave_kib: int = 0) -> None:
        """Take all free space but ``leave_kib``."""
        self.env.fake.exec(f"rm -f {ROOT}/.filler; dd if=/dev/zero of={ROOT}/.filler bs=4k "
                           "2>/dev/null; true", check=True, root=True)
        if leave_kib:
            self.env.fake.exec(f"truncate -s -{leave_kib}K {ROOT}/.filler", check=True,
                               root=True)

    def free(self) -> None:
        self.env.fake.exec(f"rm -f {ROOT}/.filler", check=True, root=True)

    def __exit__(self, *exc: object) -> None:
        self.env.fake.exec(f"umount -l {ROOT}; umount -l /run/smalldisk", root=True)


@pytest.mark.usefixtures("kernels_on")
def test_disk_full_at_upload(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 20 #3: the upload fails saying the disk is full (not "gzip: unexpected end of
    file"), nothing serving changes, and no record is emptied."""
    r1 = first_release(env)
    with SmallDisk(env) as disk:
        disk.fill(leave_kib=24)
        capsys.readouterr()
        assert env.apply(decode_knob(env, 24), name="p2.json") == ExitCode.ERROR
        captured = capsys.readouterr()
        assert "disk is full" in captured.out + captured.err
        env.assert_recovered(r1)
        r2 = next(r for r in env.releases() if r != r1)
        assert env.record(r2)["status"] == "failed" and journal(env.record(r2))["upload"] == "failed"
        assert env.record(r2)["restarted_roles"] == []  # it never started: history says so
        assert env.record(r1)["status"] == "healthy"  # never emptied
        agree(env, capsys)


@pytest.mark.usefixtures("kernels_on")
@pytest.mark.parametrize("recovery", ["re-run", "printed rollback"])
def test_disk_full_right_after_the_switch(env: Env, monkeypatch: Any, tmp_path: Any,
                                          capsys: pytest.CaptureFixture[str], recovery: str
                                          ) -> None:
    """Issue 20 #1, #3, #4, #7: the disk fills right after the switch. The journal write fails,
    which fails the switch step, so a restore runs (it used to report healthy with an emptied
    record). With the install root full the engines cannot start either (their logs live there),
    so the honest outcome is exit 4 with the reason; the record the host cannot take is kept on
    the controller. Once space is freed, a plain re-run ends healthy and puts that record back;
    no record is ever emptied."""
    from orchestrator.apply import steps

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    r1 = first_release(env)
    with SmallDisk(env) as disk:
        real_switch = steps.ACTIONS["switch_current"]

        def switch_then_fill(ctx: Any, step: Any) -> Any:
            out = real_switch(ctx, step)
            if ctx.journal_prefix == "":
                disk.fill()
            return out

        monkeypatch.setitem(steps.ACTIONS, "switch_current", switch_then_fill)
        capsys.readouterr()
        rc = env.apply(decode_knob(env, 32), name="p2.json")
        monkeypatch.undo()
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        out = said(capsys)
        assert rc in (ExitCode.ROLLED_BACK, ExitCode.ROLLBACK_FAILED), out
        assert "saved here" in out and "disk is full" in out and "Apply complete" not in out
        assert env.current() == r1 and env.lock_free()
        r2 = next(r for r in env.releases() if r != r1)
        for r in (r1, r2):
            json.loads(env.fake.read(f"{ROOT}/releases/{r}/record.json"))  # none emptied
        saved = list((tmp_path / "state" / "dsv4ctl" / "records" / "h").glob("*.json"))
        assert [p.stem for p in saved] == [r2]  # the true record waits on the controller
        assert json.loads(saved[0].read_text())["status"] in ("rolled-back", "rollback-failed")
        assert journal(json.loads(saved[0].read_text()))["switch"] == "failed"
        # once the space is freed, a plain re-run of the same command, or the rollback printed
        # when the restore failed, ends healthy: it puts the record kept on the controller back
        # on the host, and the host is as status and history say
        disk.free()
        capsys.readouterr()
        if recovery == "re-run":
            p2 = env.profile_file(decode_knob(env, 32), "p2.yaml")
            assert env.cli("apply", str(p2)) == 0, said(capsys)
            r3 = env.current()
            assert r3 not in (r1, r2) and env.record(r3)["status"] == "healthy"
        else:
            if rc == ExitCode.ROLLED_BACK:
                assert env.cli("rollback", r1, "--host", "h") == 0, said(capsys)
            else:
                assert run_printed(out, "rollback", r1) == 0, said(capsys)
            env.assert_recovered(r1)
        assert env.record(r2)["status"] in ("rolled-back", "rollback-failed")
        assert env.record(r2)["events"][-1]["kind"] == "reconciled"
        assert not list((tmp_path / "state" / "dsv4ctl" / "records" / "h").glob("*.json"))
        assert env.fake.exec(f"test -f {ROOT}/current/manifest.json").returncode == 0
        assert env.serves()
        agree(env, capsys)
