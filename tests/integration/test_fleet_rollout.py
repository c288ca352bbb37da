"""Rolling and canary apply of a fleet (issue 23) on four fake hosts: three engine hosts and the
router's own, each with its own sshd, filesystem and `systemd --user`, the engine simulator behind
each engine and the real sglang-router 0.3.2 in front of the three.

- A rolling update while a bounded load loop runs through the router: 0 failed requests, every
  host ends on the new release, each host's release record and the fleet's journal say so.
- A canary whose health never comes up: only the canary moves, is rolled back, the other hosts
  never change, the router still serves from all three at the end; the exit code says so.
- Every host's release is prepared (preflight under its lock, upload, verify) in parallel before
  the first switch; a host whose prepare fails stops the rollout before any switch, nothing
  serving changes anywhere, and the prepared hosts' records say they were never switched.
- `rollback -p FLEET` under load: every host back to its previous release wave by wave, each
  drained through the router: 0 failed requests, the records and the fleet's journal say so;
  `rollback -p FLEET --host NAME` moves that host alone, and refuses clearly (unknown host, no
  previous release, a RELEASE without --host).
- `status --profile` of the fleet; a host whose sshd and engine die mid-wave stops the rollout.

One cluster for the module (the box is small); the tests run in order and build on each other.
"""

from __future__ import annotations

import contextlib
import http.client
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
                     # reached from outside router-1's network namespace (the default is
                     # loopback): every interface, acknowledged
                     "router": {"runs_on": "router-1", "host": "0.0.0.0", "port": 8000,
                                "prometheus_port": 29000}},
        "acknowledge": [{"id": "exposure.all-interfaces",
                         "reason": "test harness: clients reach the router from outside its netns"}],
        "kernels": {"enabled": False},
        "health": {"startup_timeout_s": 10, "poll_interval_s": 0.3, "stability_window_s": 1.5},
        "rollout": {"keep_releases": 3, "rollback_timeout_s": 20,
                    "strategy": {"canary": 1, "max_unavailable": 1, "max_failures": 0,
                                 "drain_timeout_s": 10}},
    }


class Fleet:
    key: str | None = None  # the router's API key, sent by chat() and workers()

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
        """The fleet's run journals on its lock host, in the order the runs were numbered."""
        h = self.fakes["router-1"]
        names = h.exec(f"ls -1 {ROOT}/fleet/fleet 2>/dev/null").stdout.split()
        return [json.loads(h.read(f"{ROOT}/fleet/fleet/{n}")) for n in sorted(names)]

    def router_pids(self) -> list[int]:
        """The router processes on router-1 (found in its cgroup: the units' sandbox keeps the
        simulators from recording their starts in the engine env)."""
        return _host_pids(self.fakes["router-1"], ("sglang::router",))  # its setproctitle

    def _auth(self, key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def workers(self) -> list[dict[str, Any]]:
        req = urllib.request.Request(self.router_url + "/workers", headers=self._auth(self.key))
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["workers"]

    def chat(self) -> int:
        """One chat completion through the router, with the fleet's key (if it has one)."""
        return self.chat_as(self.key)

    def chat_as(self, key: str | None) -> int:
        body = json.dumps({"model": "deepseek-v4-flash", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "What is 6 * 7?"}]}).encode()
        req = urllib.request.Request(self.router_url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json",
                                              **self._auth(key)})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, http.client.HTTPException):  # refused, reset, or a bad status line
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


def engine_hosts(hosts: list[FakeHost]) -> None:
    """The three engine hosts get the checkpoint's index and a simulator whose every request
    spends 0.3 s in the engine: a drain has something to wait for."""
    for h in hosts[:3]:
        h.exec(f"mkdir -p {MODEL} && printf '%s' '{{\"metadata\": {{\"total_size\": "
               f"158000000000}}, \"weight_map\": {{}}}}' > {MODEL}/model.safetensors.index.json",
               check=True)
        h.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    with HostCluster(n=4, workdir=tmp / "hosts") as hosts:
        engine_hosts(hosts)
        yield Fleet(hosts, tmp)


def endpoint_lines(fleet: Fleet) -> list[str]:
    """What a fleet run and `status -p FLEET` end with: the router (every interface, reached at
    router-1's inventory address) first, then each engine host's engine behind it."""
    router = fleet.fakes["router-1"].address
    return ["Endpoints:",
            f"  http://{router}:8000/v1  (router on router-1; every interface; no API key)",
            *(f"  http://{fleet.fakes[h].address}:30000/v1  (engine on {h}, behind the router; "
              "one host address; no API key)" for h in ENGINES)]


def test_first_rollout_brings_up_the_fleet(fleet: Fleet, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    capsys.readouterr()
    assert fleet.apply(profile()) == 0
    out = capsys.readouterr().out
    for h in (*ENGINES, "router-1"):
        assert fleet.current(h) is not None, h
    assert sorted(w["url"] for w in fleet.workers()) == sorted(
        f"http://{fleet.fakes[h].address}:30000" for h in ENGINES)
    assert fleet.chat() == 200
    # the run ends with where clients connect (before: "Rollout complete" and no endpoint)
    want = endpoint_lines(fleet)
    lines = out.rstrip("\n").splitlines()
    assert lines[-len(want) - 1].startswith("Rollout complete") and lines[-len(want):] == want, \
        out[-2000:]
    # and so does the fleet's status, from each host's current release
    inv = ["-i", str(fleet.inventory)]
    assert main(["status", "-p", str(fleet.tmp / "profile.yaml"), *inv]) == 0
    status_out = capsys.readouterr().out
    assert status_out.rstrip("\n").splitlines()[-len(want):] == want, status_out
    assert main(["status", "-p", str(fleet.tmp / "profile.yaml"), *inv, "--format", "json"]) == 0
    eps = json.loads(capsys.readouterr().out)["endpoints"]
    assert [(e["name"], e["host"], e["exposure"], e["client_facing"]) for e in eps] == [
        ("router", "router-1", "all", True), *(("engine", h, "host", False) for h in ENGINES)]
    # the router host's Prometheus scrapes every engine host's GPUs: the apply wrote it the
    # plan rules of each, as each engine host's own release has them (its exporter as instance)
    def planned(host: str) -> list[tuple[str, str, str]]:
        text = fleet.fakes[host].read(f"{ROOT}/releases/{fleet.current(host)}/monitoring/"
                                      "plan.rules.yml")
        return sorted((r["labels"]["instance"], r["labels"]["gpu"], r["expr"])
                      for r in yaml.safe_load(text)["groups"][0]["rules"])

    own = {h: planned(h) for h in ENGINES}
    assert {h: {i for i, _, _ in rows} for h, rows in own.items()} == {
        h: {f"{fleet.fakes[h].address}:9400"} for h in ENGINES}
    assert planned("router-1") == sorted(r for rows in own.values() for r in rows)
    assert len(planned("router-1")) == 3 * 8


def test_rolling_update_under_load_drops_nothing(fleet: Fleet,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # what diff predicts for this change, from the rollout strategy, before it runs
    old, new = fleet.tmp / "predict-v1.yaml", fleet.tmp / "predict-v2.yaml"
    old.write_text(yaml.safe_dump(profile()))
    new.write_text(yaml.safe_dump(profile(cuda_graph_max_bs=32)))
    capsys.readouterr()
    assert main(["diff", str(old), str(new), "--format", "json", "-i", str(fleet.inventory)]) == 0
    predicted = json.loads(capsys.readouterr().out)["summary"]
    assert predicted["outage"] is False and predicted["downtime"].startswith("no outage")
    before = {h: fleet.current(h) for h in (*ENGINES, "router-1")}
    router_pids = fleet.router_pids()
    assert router_pids
    with Load(fleet) as load:
        time.sleep(1.0)
        rc = fleet.apply(profile(cuda_graph_max_bs=32), "profile-v2.yaml")
        time.sleep(1.0)
    assert rc == 0
    # the prediction held: "no outage", and the load loop saw no failed request
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert load.ok > 10
    for h in ENGINES:
        rel = fleet.current(h)
        assert rel != before[h], h
        assert fleet.record(h, rel)["status"] == "healthy"
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
    # every host's release was uploaded before the first switch (the canary's stop), not in
    # its wave: the prepare phase runs on all hosts in parallel first
    steps = {h: _steps(fleet.record(h, fleet.current(h))) for h in (*ENGINES, "router-1")}
    uploaded = max(s["upload"]["end"] for s in steps.values())
    first_stop = min(s["stop"]["start"] for s in steps.values())
    assert uploaded <= first_stop, (uploaded, first_stop)
    assert steps["gpu-c"]["upload"]["end"] < steps["gpu-b"]["stop"]["start"]
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


def _steps(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A release record's journal by step name (the apply's own steps, not rollback:...)."""
    return {e["step"]: e for e in record["journal"]}


def test_a_host_failing_its_prepare_stops_the_rollout_before_any_switch(fleet: Fleet) -> None:
    """gpu-c's host lock is held by another run: its prepare fails. gpu-a and gpu-b were prepared
    in parallel (their new release uploaded), but no host switches: every host still serves the
    release it served, under load nothing fails, the exit code is 1, the prepared hosts' records
    say 'failed: not switched' and the fleet's journal says where it stopped. (Before the
    prepare phase held the uploads, the canary gpu-a and gpu-b moved, and gpu-c failed in its
    wave.)"""
    before = {h: fleet.current(h) for h in (*ENGINES, "router-1")}
    known = {h: set(fleet.fakes[h].exec(f"ls -1 {ROOT}/releases").stdout.split())
             for h in ENGINES}
    # the holder: one process (a shell that takes the lock on its fd 9, then becomes `sleep`),
    # so ending it by its pid frees the lock (a `flock FILE sleep` child would keep it)
    holder = fleet.fakes["gpu-c"].exec(
        f"bash -c 'exec 9>>{ROOT}/.dsv4ctl.lock && flock -n 9 && exec sleep 300' "
        ">/dev/null 2>&1 & echo $!", check=True)
    pid = int(holder.stdout.strip())
    deadline = time.monotonic() + 10
    while fleet.fakes["gpu-c"].exec(f"flock -n {ROOT}/.dsv4ctl.lock true").returncode == 0:
        assert time.monotonic() < deadline, "the lock holder did not take gpu-c's lock"
        time.sleep(0.1)
    try:
        with Load(fleet) as load:
            rc = fleet.apply(profile(cuda_graph_max_bs=24), "profile-prep.yaml")
            time.sleep(0.5)
    finally:
        fleet.fakes["gpu-c"].exec(f"kill {pid}")
    deadline = time.monotonic() + 10
    while fleet.fakes["gpu-c"].exec(f"flock -n {ROOT}/.dsv4ctl.lock true").returncode != 0:
        assert time.monotonic() < deadline, "gpu-c's lock is still held after its holder ended"
        time.sleep(0.1)
    assert rc == ExitCode.ERROR
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert {h: fleet.current(h) for h in before} == before  # nothing serving changed anywhere
    journal = fleet.journals()[-1]
    assert journal["stopped_after_wave"] == -1 and journal["exit_code"] == int(ExitCode.ERROR)
    states = {o["host"]: o for o in journal["outcomes"]}
    assert states["gpu-c"]["state"] == "failed" and "lock" in states["gpu-c"]["message"]
    assert journal["releases"] == {}
    for h in ("gpu-a", "gpu-b"):
        assert states[h]["state"] == "not_reached", states[h]
        new = sorted(set(fleet.fakes[h].exec(f"ls -1 {ROOT}/releases").stdout.split()) - known[h])
        assert len(new) == 1, new  # its release was uploaded in the prepare phase ...
        assert journal["prepared_not_switched"][h] == new[0]
        rec = fleet.record(h, new[0])
        steps = _steps(rec)
        assert rec["status"] == "failed", rec["status"]  # ... and never switched to
        assert steps["upload"]["result"] == "ok" and steps["switch"]["result"] == "not-run"
        assert "not switched" in steps["fleet"]["error"]
        assert fleet.fakes[h].exec(f"flock -n {ROOT}/.dsv4ctl.lock true").returncode == 0
    assert not (set(fleet.fakes["gpu-c"].exec(f"ls -1 {ROOT}/releases").stdout.split())
                - known["gpu-c"])  # refused before its upload
    assert all(w["is_healthy"] for w in fleet.workers()) and len(fleet.workers()) == 3


def _rollback(fleet: Fleet, *args: str) -> int:
    return main(["rollback", *args, "-p", str(fleet.tmp / "profile-v2.yaml"), "-i",
                 str(fleet.inventory), "--yes"])


def test_fleet_rollback_under_load(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """Every host (the router's too) goes back to its previous healthy release, which is the
    first rollout's, wave by wave like a rollout, each engine host drained through the router
    before its rollback: 0 failed requests, every host on its first release, its record says it
    serves again, and the fleet's journal and `history -p` tell it as a rollback."""
    first = fleet.journals()[0]["releases"]
    before = {h: fleet.current(h) for h in (*ENGINES, "router-1")}
    assert all(first[h] != before[h] for h in before), (first, before)
    with Load(fleet) as load:
        time.sleep(0.5)
        rc = _rollback(fleet)
        time.sleep(0.5)
    assert rc == 0
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert load.ok > 10
    for h in before:
        assert fleet.current(h) == first[h], h
        rec = fleet.record(h, first[h])
        assert rec["status"] == "healthy"
        assert any(e["kind"] == "rollback-to" and e["other"] == before[h] for e in rec["events"])
    journal = fleet.journals()[-1]
    assert journal["kind"] == "rollback" and journal["exit_code"] == 0
    assert journal["stopped_after_wave"] is None
    assert journal["waves"] == [["gpu-a"], ["gpu-b"], ["gpu-c"], ["router-1"]]
    assert {o["host"]: o["state"] for o in journal["outcomes"]} == dict.fromkeys(before, "moved")
    assert all(o["drained"] for o in journal["outcomes"] if o["host"] in ENGINES)
    assert journal["releases"] == first
    workers = fleet.workers()
    assert len(workers) == 3 and all(w["is_healthy"] for w in workers)
    capsys.readouterr()
    assert main(["history", "-p", str(fleet.tmp / "profile-v2.yaml"), "-i",
                 str(fleet.inventory)]) == 0
    text = capsys.readouterr().out
    last = text[text.rindex("rollback "):]
    assert "exit 0  completed" in last and f"gpu-a            wave 1: moved -> {first['gpu-a']}" \
        in last, text


def test_one_host_rollback(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """`rollback -p FLEET --host gpu-b`: refused with exit 1 and the reason when gpu-b has no
    earlier release, for a host not in the fleet, and for a RELEASE without --host, nothing
    changed; then to an explicit release under load, drained through the router: only gpu-b
    moves, 0 failed requests."""
    before = {h: fleet.current(h) for h in (*ENGINES, "router-1")}
    n = len(fleet.journals())
    capsys.readouterr()
    assert _rollback(fleet, "--host", "gpu-b") == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "no previous release on host 'gpu-b'" in err, err
    assert _rollback(fleet, "--host", "gpu-z") == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "host 'gpu-z' is not a host of fleet" in err and "gpu-a, gpu-b, gpu-c" in err, err
    assert _rollback(fleet, before["gpu-b"]) == ExitCode.ERROR
    assert "no --host was given" in capsys.readouterr().err
    assert {h: fleet.current(h) for h in before} == before
    refused = fleet.journals()[n:]
    assert [(j["kind"], j["stopped_after_wave"]) for j in refused] == [("rollback", -1)]
    second = fleet.journals()[1]["releases"]["gpu-b"]  # the rolling update's release
    with Load(fleet) as load:
        time.sleep(0.5)
        rc = _rollback(fleet, second, "--host", "gpu-b")
        time.sleep(0.5)
    assert rc == 0
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert fleet.current("gpu-b") == second
    assert {h: fleet.current(h) for h in before if h != "gpu-b"} == {
        h: v for h, v in before.items() if h != "gpu-b"}
    journal = fleet.journals()[-1]
    assert journal["kind"] == "rollback" and journal["waves"] == [["gpu-b"]]
    assert journal["outcomes"][0]["drained"] is True and journal["releases"] == {"gpu-b": second}
    assert len(fleet.workers()) == 3 and all(w["is_healthy"] for w in fleet.workers())


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
