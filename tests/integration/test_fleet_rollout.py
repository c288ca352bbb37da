"""Rolling and canary apply of a fleet (issue 23) on four fake hosts: three engine hosts and the
router's own, each with its own sshd, filesystem and `systemd --user`, the engine simulator behind
each engine and the real sglang-router 0.3.2 in front of the three.

- A rolling update while a bounded load loop runs through the router: 0 failed requests, every
  host ends on the new release, each host's release record and the fleet's journal say so.
- A canary whose health never comes up: only the canary moves, is rolled back, the other hosts
  never change, the router still serves from all three at the end; the exit code says so.
- `status --profile` of the fleet; a host whose sshd and engine die mid-wave stops the rollout.

One cluster for the module (the box is small); the tests run in order and build on each other.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import ExitCode
from tests.harness import FakeHost, HostCluster

pytestmark = pytest.mark.integration
MODEL = "/models/DeepSeek-V4-Flash-NVFP4"
ROOT = "/srv/dsv4"
ENGINES = ("gpu-a", "gpu-b", "gpu-c")


def profile(**serving: Any) -> dict[str, Any]:
    return {
        "apiVersion": "dsv4ctl/v1", "name": "fleet", "hosts": "fleet",
        "engine": {"env": "/opt/sglang-env"},
        "model": {"variant": "dsv4-flash-nvfp4", "path": MODEL},
        "moe": {"runner_backend": "flashinfer_cutlass"},
        "attention": {"index_topk": 1024},
        "topology": {"mode": "colocated",
                     "engine": {"gpus": [0, 1, 2, 3, 4, 5, 6, 7], "tp": 8, "ep": 8,
                                "attn_dp": 8, **serving},
                     "router": {"runs_on": "router-1", "port": 8000, "prometheus_port": 29000}},
        "kernels": {"enabled": False},
        "health": {"startup_timeout_s": 10, "poll_interval_s": 0.3, "stability_window_s": 1.5},
        "rollout": {"keep_releases": 3, "rollback_timeout_s": 20,
                    "strategy": {"canary": 1, "max_unavailable": 1, "max_failures": 0,
                                 "drain_timeout_s": 10}},
    }


class Fleet:
    def __init__(self, hosts: list[FakeHost], tmp: Path) -> None:
        self.fakes = dict(zip([*ENGINES, "router-1"], hosts, strict=True))
        self.tmp = tmp
        self.inventory = tmp / "inventory.yaml"

        def entry(h: FakeHost) -> dict[str, Any]:
            inv = h.inventory_dict()
            return {"address": inv["address"], "port": inv["port"], "user": inv["user"],
                    "key": inv["key"], "known_hosts": inv["known_hosts"], "scope": "user",
                    "install_root": ROOT, "connect_timeout_s": 5}

        self.inventory.write_text(yaml.safe_dump({"apiVersion": "dsv4ctl/v1", "hosts": {
            "router-1": {**entry(self.fakes["router-1"]), "gpus": None}}, "groups": {
            "fleet": {"defaults": {"gpus": {"model": "rtx-pro-6000-se", "count": 8}},
                      "hosts": {n: entry(self.fakes[n]) for n in ENGINES}}}}))

    @property
    def router_url(self) -> str:
        return self.fakes["router-1"].url(8000)

    def apply(self, prof: dict[str, Any], name: str = "profile.yaml") -> int:
        path = self.tmp / name
        path.write_text(yaml.safe_dump(prof))
        return main(["apply", str(path), "--yes", "-i", str(self.inventory)])

    def current(self, host: str) -> str | None:
        r = self.fakes[host].exec(f"readlink {ROOT}/current")
        return r.stdout.strip().rsplit("/", 1)[-1] if r.returncode == 0 else None

    def record(self, host: str, release: str) -> dict[str, Any]:
        return json.loads(self.fakes[host].read(f"{ROOT}/releases/{release}/record.json"))

    def journals(self) -> list[dict[str, Any]]:
        h = self.fakes["router-1"]
        names = h.exec(f"ls -1 {ROOT}/fleet 2>/dev/null").stdout.split()
        return [json.loads(h.read(f"{ROOT}/fleet/{n}")) for n in sorted(names)]

    def router_pids(self) -> list[int]:
        """The router processes on router-1 (found in its cgroup: the units' sandbox keeps the
        simulators from recording their starts in the engine env)."""
        return _host_pids(self.fakes["router-1"], ("sglang::router",))  # its setproctitle

    def workers(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.router_url + "/workers", timeout=10) as r:
            return json.loads(r.read())["workers"]

    def chat(self) -> int:
        body = json.dumps({"model": "deepseek-v4-flash", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "What is 6 * 7?"}]}).encode()
        req = urllib.request.Request(self.router_url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 599


class Load:
    """A bounded load loop through the router: 2 clients, until stopped (at most 2000 requests)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet, self.stop_event = fleet, threading.Event()
        self.ok = 0
        self.failed: list[int] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]

    def _loop(self) -> None:
        while not self.stop_event.is_set() and self.ok + len(self.failed) < 2000:
            status = self.fleet.chat()
            with self.lock:
                if status == 200:
                    self.ok += 1
                else:
                    self.failed.append(status)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=60)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    with HostCluster(n=4, workdir=tmp / "hosts") as hosts:
        for h in hosts[:3]:
            h.exec(f"mkdir -p {MODEL} && printf '%s' '{{\"metadata\": {{\"total_size\": "
                   f"158000000000}}, \"weight_map\": {{}}}}' > {MODEL}/model.safetensors.index.json",
                   check=True)
            # every request spends 0.3 s in the engine: a drain has something to wait for
            h.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}})
        yield Fleet(hosts, tmp)


def test_first_rollout_brings_up_the_fleet(fleet: Fleet) -> None:
    assert fleet.apply(profile()) == 0
    for h in (*ENGINES, "router-1"):
        assert fleet.current(h) is not None, h
    assert sorted(w["url"] for w in fleet.workers()) == sorted(
        f"http://{fleet.fakes[h].address}:30000" for h in ENGINES)
    assert fleet.chat() == 200


def test_rolling_update_under_load_drops_nothing(fleet: Fleet) -> None:
    before = {h: fleet.current(h) for h in (*ENGINES, "router-1")}
    router_pids = fleet.router_pids()
    assert router_pids
    with Load(fleet) as load:
        time.sleep(1.0)
        rc = fleet.apply(profile(cuda_graph_max_bs=32), "profile-v2.yaml")
        time.sleep(1.0)
    assert rc == 0
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert load.ok > 10
    for h in ENGINES:
        new = fleet.current(h)
        assert new != before[h], h
        assert fleet.record(h, new)["status"] == "healthy"
    # the router's host gets the release of the new profile, but its router was not restarted
    assert fleet.current("router-1") != before["router-1"]
    assert fleet.router_pids() == router_pids
    journal = fleet.journals()[-1]
    assert journal["exit_code"] == 0 and journal["stopped_after_wave"] is None
    assert journal["waves"] == [["gpu-a"], ["gpu-b"], ["gpu-c"], ["router-1"]]
    states = {o["host"]: o["state"] for o in journal["outcomes"]}
    assert states == {"gpu-a": "moved", "gpu-b": "moved", "gpu-c": "moved", "router-1": "moved"}
    assert all(o["drained"] for o in journal["outcomes"] if o["host"] in ENGINES)
    assert {journal["releases"][h] for h in ENGINES} == {fleet.current(h) for h in ENGINES}
    assert len(fleet.workers()) == 3 and all(w["is_healthy"] for w in fleet.workers())


def test_canary_that_never_becomes_healthy_is_rolled_back_alone(fleet: Fleet) -> None:
    before = {h: fleet.current(h) for h in ENGINES}
    canary = fleet.fakes["gpu-a"]
    canary.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}, "rules": [
        {"match": {"argv_contains": ["--cuda-graph-max-bs-decode 48"]},
         "set": {"never_ready": True}}]})
    try:
        with Load(fleet) as load:
            rc = fleet.apply(profile(cuda_graph_max_bs=48), "profile-v3.yaml")
            time.sleep(0.5)
    finally:
        canary.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}})
    assert rc == ExitCode.ROLLED_BACK
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert {h: fleet.current(h) for h in ENGINES} == before  # the canary is back, others untouched
    releases = fleet.fakes["gpu-a"].exec(f"ls -1 {ROOT}/releases").stdout.split()
    failed = [r for r in releases if r.startswith("r") and r != before["gpu-a"]
              and fleet.record("gpu-a", r)["status"] != "healthy"]
    assert failed, "the canary's failed release has no record"
    journal = fleet.journals()[-1]
    assert journal["exit_code"] == int(ExitCode.ROLLED_BACK) and journal["stopped_after_wave"] == 0
    states = {o["host"]: o["state"] for o in journal["outcomes"]}
    assert states == {"gpu-a": "rolled_back", "gpu-b": "not_reached", "gpu-c": "not_reached",
                      "router-1": "not_reached"}
    workers = fleet.workers()
    assert sorted(w["url"] for w in workers) == sorted(
        f"http://{fleet.fakes[h].address}:30000" for h in ENGINES)
    assert all(w["is_healthy"] for w in workers)
    assert fleet.chat() == 200


def test_status_shows_the_fleet(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """After the canary stopped the rollout: every host healthy on its release, in the router,
    and the last rollout stopped after the canary wave."""
    capsys.readouterr()
    rc = main(["status", "--profile", str(fleet.tmp / "profile-v3.yaml"), "-i",
               str(fleet.inventory), "--format", "json"])
    st = json.loads(capsys.readouterr().out)
    assert rc == 0, st
    rows = {r["host"]: r for r in st["hosts"]}
    for h in ENGINES:
        assert rows[h]["current"] == fleet.current(h) and rows[h]["healthy"], rows[h]
        assert rows[h]["in_router"] is True
    assert rows["router-1"]["role"] == "router" and rows["router-1"]["healthy"]
    last = st["last_rollout"]
    assert last["stopped_after_wave"] == 0 and last["exit_code"] == int(ExitCode.ROLLED_BACK)
    rc = main(["status", "--profile", str(fleet.tmp / "profile-v3.yaml"), "-i",
               str(fleet.inventory)])
    text = capsys.readouterr().out
    assert rc == 0 and "stopped after wave 1" in text and "gpu-a" in text
    # history of the fleet: the three rollouts so far, what each host did, where it stopped
    rc = main(["history", "--profile", str(fleet.tmp / "profile-v3.yaml"), "-i",
               str(fleet.inventory), "--format", "json"])
    rollouts = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["exit_code"] for r in rollouts] == [0, 0, int(ExitCode.ROLLED_BACK)]
    assert [r["stopped_after_wave"] for r in rollouts] == [None, None, 0]
    assert {o["host"]: o["state"] for o in rollouts[1]["outcomes"]} == {
        "gpu-a": "moved", "gpu-b": "moved", "gpu-c": "moved", "router-1": "moved"}
    rc = main(["history", "--profile", str(fleet.tmp / "profile-v3.yaml"), "-i",
               str(fleet.inventory)])
    text = capsys.readouterr().out
    assert rc == 0 and "stopped after wave 1" in text and "gpu-a            wave 1: rolled_back" \
        in text


def _host_pids(h: FakeHost, match: tuple[str, ...]) -> list[int]:
    """Pids of this fake host's processes (its own cgroup, which the harness created) whose
    command line contains every string of ``match``."""
    found = []
    for procs in h.cgroup.rglob("cgroup.procs"):
        for pid in (int(p) for p in procs.read_text().split()):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if all(m in cmd for m in match):
                found.append(pid)
    return sorted(found)


def _kill_host_processes(h: FakeHost, match: tuple[str, ...]) -> list[int]:
    """SIGKILL this fake host's processes whose command line contains one of ``match``."""
    import os
    import signal

    killed = []
    for m in match:
        for pid in _host_pids(h, (m,)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def test_host_dying_mid_wave_stops_the_rollout(fleet: Fleet,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """gpu-c's sshd and engine are killed while its apply waits for health in wave 2 (gpu-b and
    gpu-c together): the rollout stops after that wave within the 10 s health timeout of the
    death, the exit code says a host was left neither moved nor restored, and status shows which
    host is where: gpu-a and gpu-b healthy on the new release in the router, gpu-c unreachable
    and out of the router. Where the time goes: the failure is seen at once (the unit query over
    the dead connection fails), then ~7 s of reconnect backoff (1+2+4 s) to record gpu-c's
    outcome; gpu-c is then left out of the router at once (before: the router was asked to add
    it back and waited 60 s for it, the rollout stopped ~67 s after the death)."""
    before = {h: fleet.current(h) for h in ENGINES}
    victim = fleet.fakes["gpu-c"]
    victim.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}, "rules": [
        {"match": {"argv_contains": ["--cuda-graph-max-bs-decode 40"]},
         "set": {"start_delay_s": 60}}]})
    prof = profile(cuda_graph_max_bs=40)
    prof["rollout"]["strategy"]["max_unavailable"] = 2
    killed: list[int] = []
    killed_at: list[float] = []

    def killer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _host_pids(victim, ("dsv4sim.engine", "--cuda-graph-max-bs-decode 40")):
                time.sleep(1.0)  # its apply is now waiting for health
                killed.extend(_kill_host_processes(victim, ("sshd", "dsv4sim.engine")))
                killed_at.append(time.monotonic())
                return
            time.sleep(0.2)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    t0 = time.monotonic()
    rc = fleet.apply(prof, "profile-v4.yaml")
    done = time.monotonic()
    t.join(timeout=5)
    journal = fleet.journals()[-1]
    assert killed and killed_at, "gpu-c's processes were never killed"
    assert rc in (ExitCode.ROLLBACK_FAILED, ExitCode.ERROR), rc
    stopped_s = done - killed_at[0]
    with capsys.disabled():  # the measurement, for the report (-s shows it)
        print(f"\nthe rollout stopped {stopped_s:.1f} s after gpu-c died ({done - t0:.1f} s in "
              "all)")
    assert stopped_s < prof["health"]["startup_timeout_s"], stopped_s
    states = {o["host"]: o["state"] for o in journal["outcomes"]}
    assert states["gpu-a"] == "moved" and states["gpu-b"] == "moved", states
    assert states["gpu-c"] in ("rollback_failed", "failed") and states["router-1"] == "not_reached"
    assert journal["stopped_after_wave"] == 1
    for h in ("gpu-a", "gpu-b"):
        assert fleet.current(h) != before[h]
    capsys.readouterr()
    rc = main(["status", "--profile", str(fleet.tmp / "profile-v4.yaml"), "-i",
               str(fleet.inventory), "--format", "json"])
    st = json.loads(capsys.readouterr().out)
    rows = {r["host"]: r for r in st["hosts"]}
    assert rc == 1
    assert rows["gpu-a"]["healthy"] and rows["gpu-a"]["in_router"] is True
    assert rows["gpu-b"]["healthy"] and rows["gpu-b"]["in_router"] is True
    assert rows["gpu-c"]["error"] and not rows["gpu-c"]["healthy"]  # unreachable: said so
    assert rows["gpu-c"]["in_router"] is False  # drained, never put back
    assert fleet.chat() == 200  # the router serves from the two that are left
