"""One driver for every host-changing run (issue 30), on four fake hosts: three engine hosts and
the router's own, the engine simulator behind each engine and the real sglang-router 0.3.2.

- A fleet apply opens one SSH connection per host (the probe's, kept for prepare and switch),
  counted in each host's sshd log.
- `apply -p FLEET --host MEMBER` under a load loop: only that member moves, drained through the
  router, no request fails.
- `apply -p FLEET --host GROUP` (an inventory group of fleet members): exactly the group moves.
- `unlock -p FLEET` shows the fleet lock's holder; `--force` frees it.
- Fleet runs are ordered by their sequence number, never by a clock: a controller a day behind
  or a host's file times a day ahead do not reorder `history` or `status`.
- A fleet rollback killed mid-health resumes from the fleet journal: every host ends on the killed
  run's target and back in the router.
- A host that became unreachable mid-run: the record kept on the controller carries the final
  status and the real error, and the next run puts it back on the host.

The runs of issue 30 point 5 (the last three) run under a load loop through the router, and no
request fails.

One cluster for the module; the tests run in order and build on each other.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import ExitCode
from tests.harness import HostCluster
from tests.integration.test_fleet_rollout import (
    ENGINES,
    ROOT,
    Fleet,
    Load,
    _host_pids,
    _kill_host_processes,
    engine_hosts,
    profile,
)

pytestmark = pytest.mark.integration
EVERY = (*ENGINES, "router-1")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet-driver")
    with HostCluster(n=4, workdir=tmp / "hosts") as hosts:
        engine_hosts(hosts)
        yield Fleet(hosts, tmp)


def accepted(fleet: Fleet) -> dict[str, int]:
    """SSH connections each host's sshd accepted so far (its log, LogLevel INFO)."""
    return {h: (fleet.fakes[h].log_dir / "sshd.log").read_text(errors="replace")
            .count("Accepted publickey") for h in EVERY}


def cli(fleet: Fleet, *args: str) -> int:
    return main([*args, "-i", str(fleet.inventory)])


def test_a_fleet_apply_opens_one_connection_per_host(fleet: Fleet) -> None:
    assert fleet.apply(profile()) == 0  # the first rollout brings the fleet up
    before = accepted(fleet)
    assert fleet.apply(profile(cuda_graph_max_bs=32), "profile-v2.yaml") == 0
    after = accepted(fleet)
    assert {h: after[h] - before[h] for h in EVERY} == dict.fromkeys(EVERY, 1)
    journal = fleet.journals()[-1]
    assert {o["host"]: o["state"] for o in journal["outcomes"]} == dict.fromkeys(EVERY, "moved")


def test_apply_one_member_under_load(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `--host MEMBER` took the single-host path: no fleet lock, no drain."""
    before = {h: fleet.current(h) for h in EVERY}
    path = fleet.tmp / "profile-v3.yaml"
    path.write_text(yaml.safe_dump(profile(cuda_graph_max_bs=24)))
    with Load(fleet) as load:
        time.sleep(1.0)
        rc = cli(fleet, "apply", str(path), "--host", "gpu-b", "--yes")
        time.sleep(1.0)
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert load.ok > 10
    assert fleet.current("gpu-b") != before["gpu-b"]
    assert {h: fleet.current(h) for h in EVERY if h != "gpu-b"} == {
        h: v for h, v in before.items() if h != "gpu-b"}
    journal = fleet.journals()[-1]
    assert journal["selected"] == ["gpu-b"] and journal["waves"] == [["gpu-b"]]
    assert [(o["host"], o["state"], o["drained"]) for o in journal["outcomes"]] == [
        ("gpu-b", "moved", True)]
    assert "[gpu-b] drained: 0 requests left" in out
    assert "[gpu-a]" not in out and "[gpu-c]" not in out  # nobody else was drained or touched
    workers = fleet.workers()
    assert len(workers) == 3 and all(w["is_healthy"] for w in workers)


def test_apply_a_group_moves_exactly_the_group(fleet: Fleet) -> None:
    """The profile names its hosts as a list; the inventory splits them into two groups, and
    `--host left` moves left's two members only. Before: a bare KeyError."""
    inv = yaml.safe_load(fleet.inventory.read_text())
    members = inv["groups"]["fleet"]
    inv["groups"] = {
        "left": {"defaults": members["defaults"],
                 "hosts": {h: members["hosts"][h] for h in ("gpu-a", "gpu-b")}},
        "right": {"defaults": members["defaults"], "hosts": {"gpu-c": members["hosts"]["gpu-c"]}}}
    split = fleet.tmp / "inventory-split.yaml"
    split.write_text(yaml.safe_dump(inv))
    prof = profile(cuda_graph_max_bs=40)
    prof["hosts"] = list(ENGINES)
    path = fleet.tmp / "profile-list.yaml"
    path.write_text(yaml.safe_dump(prof))
    before = {h: fleet.current(h) for h in EVERY}
    with Load(fleet) as load:
        rc = main(["apply", str(path), "--host", "left", "--yes", "-i", str(split)])
        time.sleep(0.5)
    assert rc == 0
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    moved = {h for h in EVERY if fleet.current(h) != before[h]}
    assert moved == {"gpu-a", "gpu-b"}
    journal = fleet.journals()[-1]
    assert journal["selected"] == ["gpu-a", "gpu-b"]
    assert journal["waves"] == [["gpu-a"], ["gpu-b"]]
    assert all(o["drained"] for o in journal["outcomes"])
    before_ssh = accepted(fleet)
    assert main(["apply", str(path), "--host", "nowhere", "--yes", "-i", str(split)]) == \
        ExitCode.ERROR
    assert accepted(fleet) == before_ssh  # refused before any connection


def test_unlock_shows_and_frees_the_fleet_lock(fleet: Fleet,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.planner.targets import fleet_lock_name
    from orchestrator.profile import load_inventory
    from orchestrator.remote.connection import connect
    from orchestrator.remote.lock import HostLock, is_locked

    router = load_inventory(fleet.inventory).all_hosts()["router-1"]
    path = str(fleet.tmp / "profile-v3.yaml")
    name = fleet_lock_name("fleet")
    with connect("router-1", router) as remote:
        held = HostLock(remote, ROOT, "dsv4ctl apply held-by-the-test.yaml", name=name)
        held.acquire()
        try:
            capsys.readouterr()
            assert cli(fleet, "unlock", "-p", path) == ExitCode.LOCKED
            out = capsys.readouterr().out
            assert "fleet fleet (its lock on host 'router-1') is locked by:" in out, out
            assert "held-by-the-test.yaml" in out and "not unlocking without --force" in out
            assert "host 'gpu-a' is not locked" in out
            # a run of the fleet is refused while it is held
            assert fleet.apply(profile(cuda_graph_max_bs=24), "profile-v3.yaml") == \
                ExitCode.LOCKED
            assert cli(fleet, "unlock", "-p", path, "--force") == 0
            assert "lock released" in capsys.readouterr().out
        finally:
            held.release()
        assert not is_locked(remote, ROOT, name)


def test_runs_are_ordered_by_sequence_not_by_a_clock(fleet: Fleet, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The controller's clock a day behind for one run, then the host's file times a day ahead
    for an older journal: `history` and `status` still show the runs in the order they ran.
    The run with the clock behind is under a load loop: no request fails.
    Before: journals were named after the controller's clock (history sorted by name) and
    status took the newest file time on the host (`ls -t`)."""
    import orchestrator.apply.fleet_ops as fleet_ops

    real = time.time
    behind = type("Clock", (), {"time": staticmethod(lambda: real() - 86400),
                                "strftime": staticmethod(time.strftime),
                                "gmtime": staticmethod(time.gmtime)})
    monkeypatch.setattr(fleet_ops, "time", behind)
    path = fleet.tmp / "profile-v5.yaml"
    path.write_text(yaml.safe_dump(profile(cuda_graph_max_bs=20)))
    with Load(fleet) as load:  # the run behind the router that serves meanwhile
        time.sleep(0.5)
        rc = cli(fleet, "apply", str(path), "--host", "gpu-c", "--yes")
        time.sleep(0.5)
    monkeypatch.undo()
    assert rc == 0
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert load.ok > 0
    newest = fleet.journals()[-1]
    assert newest["selected"] == ["gpu-c"]
    # an older journal's file time a day ahead (a host clock that ran fast when it was written)
    h = fleet.fakes["router-1"]
    first = sorted(h.exec(f"ls -1 {ROOT}/fleet/fleet").stdout.split())[0]
    h.exec(f"touch -d '+1 day' {ROOT}/fleet/fleet/{first}", check=True)
    capsys.readouterr()
    assert cli(fleet, "history", "-p", str(path), "--format", "json") == 0
    runs = json.loads(capsys.readouterr().out)
    assert runs[-1]["selected"] == ["gpu-c"] and runs[-1]["command"] == newest["command"]
    assert [r["sequence"] for r in runs] == sorted(r["sequence"] for r in runs)
    cli(fleet, "status", "-p", str(path), "--format", "json")
    st = json.loads(capsys.readouterr().out)
    assert st["last_rollout"]["sequence"] == newest["sequence"], st["last_rollout"]


def test_a_killed_fleet_rollback_resumes_from_the_fleet_journal(
        fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """`rollback -p FLEET` SIGKILLed while the canary waits for health (it was drained, switched
    to its target, its record says rollback:health running), then the same command again under
    a load loop: it resumes from the fleet's journal, every host ends on its target and back in
    the router, no request fails. Before: the re-run started a new rollback from each host's
    current, so gpu-a (already on its target) exited 1 with "no previous release on host 'gpu-a'"
    and stayed out of the router, or, with an older release left, was rolled past its target
    while its target's record kept rollback:health at running (exit 0: hence the hosts are
    checked before the journal)."""
    import signal
    import subprocess
    import sys

    from tests.integration.test_apply import REPO

    path = str(fleet.tmp / "profile-v5.yaml")
    before = {h: fleet.current(h) for h in EVERY}
    canary = fleet.fakes["gpu-a"]
    # every engine start on gpu-a from now on takes 30 s to become ready
    canary.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}, "rules": [
        {"match": {"argv_contains": ["--port"]}, "set": {"start_delay_s": 30}}]})
    argv = [sys.executable, "-c", "from orchestrator.cli import entrypoint; entrypoint()",
            "rollback", "-p", path, "-i", str(fleet.inventory), "--yes"]
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120

        def waiting_for_health() -> bool:  # gpu-a switched, its rollback waits for health
            cur = fleet.current("gpu-a")
            if cur == before["gpu-a"]:
                return False
            steps = {e["step"]: e["result"] for e in fleet.record("gpu-a", cur)["journal"]}
            return steps.get("rollback:health") == "running"

        while not waiting_for_health():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
            assert time.monotonic() < deadline, "gpu-a never waited for health"
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    target = fleet.current("gpu-a")
    rec = fleet.record("gpu-a", target)
    assert {e["step"]: e["result"] for e in rec["journal"]}.get("rollback:health") == "running"
    assert f"http://{fleet.fakes['gpu-a'].address}:30000" not in {w["url"] for w in
                                                                  fleet.workers()}
    journal = fleet.journals()[-1]
    assert journal["kind"] == "rollback" and journal["state"] == "running"
    assert journal["targets"]["gpu-a"] == target
    canary.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}})
    capsys.readouterr()
    with Load(fleet) as load:
        time.sleep(0.5)
        rc = cli(fleet, "rollback", "-p", path, "--yes")
        time.sleep(0.5)
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    # what the hosts say first, then the journal: a re-run that starts a new rollback instead of
    # resuming exits 0 too when gpu-a has an older release, and takes gpu-a past its target
    after = {h: fleet.current(h) for h in EVERY}
    assert after["gpu-a"] == target, (after, before)  # kept on the killed run's target
    assert all(after[h] != before[h] for h in ENGINES), (after, before)
    rec = fleet.record("gpu-a", target)
    steps = [e for e in rec["journal"] if e["step"] == "rollback:health"]
    assert [e["result"] for e in steps] == ["interrupted", "ok"], steps
    assert rec["status"] == "healthy"
    workers = fleet.workers()
    assert len(workers) == 3 and all(w["is_healthy"] for w in workers)
    assert f"resuming rollback {journal['sequence']}" in out
    done = fleet.journals()[-1]
    assert done["state"] == "finished" and done["exit_code"] == 0
    assert done["resumes"] == journal["sequence"]
    assert done["targets"] == journal["targets"]
    assert after == journal["targets"]


def test_a_host_lost_mid_run_has_its_real_error_put_back(fleet: Fleet,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """gpu-c's sshd and engine die while its apply waits for health. The record dsv4ctl keeps
    on the controller says what happened (not "applying"); once gpu-c is back, the next run puts
    it on the host, and the host tells the real error instead of "the run doing this step was
    lost". Both runs are under a load loop through the router: gpu-c was drained before its
    switch, so its death drops nothing, and putting it back drops nothing either."""
    victim = fleet.fakes["gpu-c"]
    victim.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}, "rules": [
        {"match": {"argv_contains": ["--cuda-graph-max-bs-decode 56"]},
         "set": {"start_delay_s": 60}}]})
    known = set(victim.exec(f"ls -1 {ROOT}/releases").stdout.split())
    path = fleet.tmp / "profile-v6.yaml"
    path.write_text(yaml.safe_dump(profile(cuda_graph_max_bs=56)))

    def killer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _host_pids(victim, ("dsv4sim.engine", "--cuda-graph-max-bs-decode 56")):
                time.sleep(1.0)
                _kill_host_processes(victim, ("sshd", "dsv4sim.engine"))
                return
            time.sleep(0.2)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    with Load(fleet) as load:  # gpu-c was drained before its switch: its death drops nothing
        rc = cli(fleet, "apply", str(path), "--host", "gpu-c", "--yes")
        t.join(timeout=5)
        time.sleep(0.5)
    assert rc != 0
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert load.ok > 0
    new = sorted(set(victim.exec(f"ls -1 {ROOT}/releases").stdout.split()) - known)
    assert len(new) == 1, new
    rel = new[0]
    host_rec = fleet.record("gpu-c", rel)
    assert host_rec["status"] == "applying"  # what the host could be told before it went away
    state = Path(os.environ["XDG_STATE_HOME"]) / "dsv4ctl" / "records" / "gpu-c"
    kept = json.loads((state / f"{rel}.json").read_text())
    assert kept["status"] == "interrupted", kept["status"]
    failed = [e for e in kept["journal"] if e["result"] == "failed"]
    assert failed and failed[0]["error"], kept["journal"]
    cause = failed[0]["error"]
    # gpu-c comes back (its sshd; systemd restarts nothing it was not told to), the cause fixed
    victim.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}})
    victim._sshd_up()
    capsys.readouterr()
    with Load(fleet) as load:
        time.sleep(0.5)
        rc = cli(fleet, "apply", str(path), "--host", "gpu-c", "--yes")
        time.sleep(0.5)
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert load.ok > 0
    rec = fleet.record("gpu-c", rel)
    assert rec["status"] == "interrupted"
    steps = {e["step"]: e for e in rec["journal"]}
    errors = [e["error"] for e in steps.values() if e.get("error")]
    assert cause in errors, errors
    assert not any("the run doing this step was lost" in (e or "") for e in errors), errors
    assert any(e["kind"] == "reconciled" for e in rec["events"])
    assert not (state / f"{rel}.json").exists()
    assert fleet.current("gpu-c") not in (rel, None)
    workers = fleet.workers()
    assert len(workers) == 3 and all(w["is_healthy"] for w in workers)
