"""`dsv4ctl apply / rollback / history / status / unlock` against fake hosts (real sshd, real
`systemd --user`, the engine simulator behind the units).

Owns the end-to-end proof of issue 4's scenarios: first apply, no-change apply, a change that
restarts only decode, never-ready and crash-after-start rolled back automatically, a dropped
connection during upload, a concurrent apply refused with the holder shown, a stale saved plan
refused, Ctrl-C during apply, explicit rollback to a named release, pruning. After every failure
scenario the test checks that a healthy release serves, the lock is free and the journal says what
happened. Plans are built from probed facts and saved to JSON, exactly what `dsv4ctl plan -o` does,
and applied through the real CLI entry point (in-process `main()` or a subprocess for Ctrl-C).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import ExitCode
from orchestrator.facts import Facts
from orchestrator.planner.fleet import plan_from_paths
from orchestrator.planner_model import Plan
from orchestrator.profile import load_text
from orchestrator.profile.inventory import Host, Inventory, JumpHost
from orchestrator.profile.schema import Profile
from orchestrator.remote import gather_facts
from tests.harness import FakeHost

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
MODEL = "/models/DeepSeek-V4-Flash-NVFP4"
ROOT = "/srv/dsv4"
TOTAL_SIZE = 158_000_000_000


# the harness's only way in from the root namespace is the host's bridge address
ALL_INTERFACES = {"id": "exposure.all-interfaces",
                  "reason": "test harness: clients reach the router from outside the host's netns"}


def profile_dict(name: str = "itest", **over: Any) -> dict[str, Any]:
    """A PD 4+4 profile with test-sized timeouts (the simulator starts in well under a second)."""
    d: dict[str, Any] = {
        "apiVersion": "dsv4ctl/v1", "name": name, "host": "h",
        "engine": {"env": "/opt/sglang-env"},
        "model": {"variant": "dsv4-flash-nvfp4", "path": MODEL},
        "moe": {"runner_backend": "flashinfer_cutlass"},
        "attention": {"index_topk": 1024},
        "topology": {"mode": "pd", "transfer_backend": "mooncake_tcp",
                     "prefill": {"gpus": [0, 1, 2, 3], "tp": 4, "ep": 4},
                     "decode": {"gpus": [4, 5, 6, 7], "tp": 4, "ep": 4},
                     # the controller reaches the router from outside the host's network
                     # namespace, so on every interface, acknowledged (the default is loopback)
                     "router": {"host": "0.0.0.0", "port": 8000, "prometheus_port": 29000}},
        "acknowledge": [ALL_INTERFACES],
        "kernels": {"enabled": False},
        "health": {"startup_timeout_s": 10, "poll_interval_s": 0.3, "stability_window_s": 1.5},
        "rollout": {"keep_releases": 3, "rollback_timeout_s": 20},
    }
    for k, v in over.items():
        d[k] = v
    return d


class Env:
    """One fake host wired up as an inventory + profile on the controller side."""

    def __init__(self, host: FakeHost, tmp: Path) -> None:
        self.fake = host
        self.tmp = tmp
        inv = host.inventory_dict()
        self.host_name = "h"
        self.inventory_path = tmp / "inventory.yaml"
        self.inventory_path.write_text(yaml.safe_dump({"apiVersion": "dsv4ctl/v1", "hosts": {
            "h": {"address": inv["address"], "port": inv["port"], "user": inv["user"],
                  "key": inv["key"], "known_hosts": inv["known_hosts"], "scope": "user",
                  "install_root": ROOT,
                  "connect_timeout_s": 5, "gpus": {"model": "rtx-pro-6000-se", "count": 8}}}}))
        inventory = load_text(Inventory, self.inventory_path.read_text(), "inventory.yaml")
        self.host: Host = inventory.hosts["h"]

    def profile(self, **over: Any) -> Profile:
        return load_text(Profile, yaml.safe_dump(profile_dict(**over)), "profile.yaml")

    def facts(self) -> Facts:
        return gather_facts(self.host_name, self.host, model_paths=[MODEL])

    def profile_file(self, profile: Profile, name: str = "profile.yaml") -> Path:
        path = self.tmp / name
        path.write_text(yaml.safe_dump(profile.model_dump(mode="json", by_alias=True)))
        return path

    def plan(self, profile: Profile, facts: Facts | None = None) -> Plan:
        """The plan `dsv4ctl plan --host h --live -o` saves: the real planner over probed facts."""
        facts = facts or self.facts()
        plan = plan_from_paths(self.profile_file(profile), self.inventory_path, facts=facts)
        assert not plan.errors, [c.message for c in plan.errors]
        return plan

    def save(self, plan: Plan, name: str = "plan.json") -> Path:
        path = self.tmp / name
        path.write_text(plan.model_dump_json(indent=2))
        return path

    def cli(self, *args: str) -> int:
        # pytest's stdin is not a terminal: apply and rollback refuse without --yes there
        yes = ["--yes"] if args and args[0] in ("apply", "rollback") else []
        return main([*args, *yes, "-i", str(self.inventory_path)])

    def apply(self, profile: Profile, *, name: str = "plan.json") -> int:
        return self.cli("apply", str(self.save(self.plan(profile), name)))

    # ---- host-side observations (through the harness, not through dsv4ctl) ----
    def current(self) -> str | None:
        r = self.fake.exec(f"readlink {ROOT}/current")
        return r.stdout.strip().rsplit("/", 1)[-1] if r.returncode == 0 else None

    def record(self, release: str) -> dict[str, Any]:
        return json.loads(self.fake.read(f"{ROOT}/releases/{release}/record.json"))

    def releases(self) -> list[str]:
        out = self.fake.exec(f"ls -1 {ROOT}/releases").stdout.split()
        return sorted(x for x in out if x.startswith("r"))

    def lock_free(self) -> bool:
        r = self.fake.exec(f"flock -n {ROOT}/.dsv4ctl.lock true")
        return r.returncode == 0

    def starts(self, mode: str) -> int:
        return sum(1 for r in self.fake.sim_runs() if r.get("mode") == mode)

    def serves(self, api_key: str | None = None) -> bool:
        """A real generation through the router, from outside the host (with the deployment's
        API key when it has one: sglang-router 0.3.2's --api-key guards its own routes too)."""
        return self.generate_status(api_key) == 200

    def generate_status(self, api_key: str | None = None) -> int | None:
        """The router's status for one chat completion; None when no full answer came (refused,
        cut off mid-body, or not JSON with choices): the load loops count that as a failure
        rather than die on it."""
        import http.client
        import urllib.error
        import urllib.request

        body = json.dumps({"model": "deepseek-v4-flash", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "say ready"}]}).encode()
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        req = urllib.request.Request(self.fake.url(8000, "/v1/chat/completions"), data=body,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status if json.loads(resp.read())["choices"] else None
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
            return None

    def assert_recovered(self, expect_current: str) -> None:
        """The post-failure invariant: the expected healthy release serves, the lock is free."""
        assert self.current() == expect_current
        assert self.record(expect_current)["status"] == "healthy"
        assert self.lock_free(), "the host lock is still held"
        deadline = time.monotonic() + 10
        while not self.serves():
            assert time.monotonic() < deadline, "the restored release does not serve"
            time.sleep(0.3)


def _clean(h: FakeHost) -> None:
    h.exec("cd ~/.config/systemd/user 2>/dev/null && for u in dsv4-*.service; do "
           "[ -e \"$u\" ] || continue; systemctl --user stop \"$u\"; "
           "systemctl --user disable \"$u\" 2>/dev/null; rm -f \"$u\"; done; "
           "systemctl --user reset-failed; systemctl --user daemon-reload; "
           f"rm -rf {ROOT}/* {ROOT}/.[!.]* /opt/sglang-env/sim-runs.jsonl")


@pytest.fixture
def env(hosts: list[FakeHost], fresh_sim_control: list[FakeHost], tmp_path: Path
        ) -> Iterator[Env]:
    h = hosts[0]
    _clean(h)
    h.exec(f"mkdir -p {MODEL} && printf '%s' "
           f"'{{\"metadata\": {{\"total_size\": {TOTAL_SIZE}}}, \"weight_map\": {{}}}}' "
           f"> {MODEL}/model.safetensors.index.json", check=True)
    yield Env(h, tmp_path)
    _clean(h)


def first_release(env: Env) -> str:
    assert env.apply(env.profile()) == 0
    cur = env.current()
    assert cur is not None
    return cur


# ------------------------------------------------------------------------------- scenarios ---

def test_first_apply_then_no_change(env: Env, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    token = "hf_SECRET_value_never_in_releases"
    monkeypatch.setenv("DSV4_TEST_HF_TOKEN", token)
    profile = env.profile(secrets={"HF_TOKEN": {"env": "DSV4_TEST_HF_TOKEN"}})
    assert env.apply(profile) == 0
    rel = env.current()
    assert rel is not None
    # the secret reaches the host only as the 0600 env file the units read, nowhere else
    assert env.fake.exec(f"stat -c %a {ROOT}/secrets/itest.env").stdout.strip() == "600"
    assert env.fake.read(f"{ROOT}/secrets/itest.env") == f'HF_TOKEN="{token}"\n'
    leaks = env.fake.exec(f"grep -rl {token} {ROOT}/releases {ROOT}/.incoming 2>/dev/null")
    assert leaks.stdout == "" and token not in capsys.readouterr().out
    rec = env.record(rel)
    assert rec["status"] == "healthy"
    steps = {e["step"]: e["result"] for e in rec["journal"]}
    assert steps["preflight"] == "ok" and steps["health"] == "ok" and steps["smoke"] == "ok"
    assert steps["kernels"] == "skipped"
    assert "no role runs a bundled kernel (kernels.<op>)" in next(e["detail"] for e in rec["journal"]
                                             if e["step"] == "kernels")
    assert sorted(rec["restarted_roles"]) == ["decode", "prefill", "router"]
    assert env.serves() and env.lock_free()
    # the release holds the tree, the applyable resolved profile, the plan and the manifest
    for rel_path in ("units/dsv4-itest-decode.service", "bin/launch-decode.sh",
                     "profile.yaml", "plan.json", "manifest.json",
                     "monitoring/plan.rules.yml"):  # the plan's per-GPU memory, for Prometheus
        assert env.fake.exec(f"test -f {ROOT}/releases/{rel}/{rel_path}").returncode == 0
    before = {m: env.starts(m) for m in ("prefill", "decode", "router")}
    capsys.readouterr()
    # no-change apply: restarts nothing, says so, creates no release
    assert env.apply(profile, name="again.json") == 0
    said = capsys.readouterr().out
    # ... and still ends with where clients connect (before: "No changes." alone)
    assert "No changes.\nEndpoints:\n" in said and said.rstrip().endswith("API key)"), said
    assert {m: env.starts(m) for m in before} == before
    assert env.releases() == [rel] and env.current() == rel and env.lock_free()


def decode_knob(env: Env, bs: int) -> Profile:
    """The base profile with only decode's cuda_graph_max_bs changed (decode's files only)."""
    d = profile_dict()
    d["topology"]["decode"]["cuda_graph_max_bs"] = bs
    return load_text(Profile, yaml.safe_dump(d), "profile.yaml")


def rule(argv: str, switches: dict[str, Any]) -> dict[str, Any]:
    """Simulator control: processes whose command line contains ``argv`` get ``switches``."""
    return {"rules": [{"match": {"argv_contains": [argv]}, "set": switches}]}


def journal(rec: dict[str, Any]) -> dict[str, str]:
    return {e["step"]: e["result"] for e in rec["journal"]}


def test_decode_change_restarts_only_decode(env: Env) -> None:
    r1 = first_release(env)
    before = {m: env.starts(m) for m in ("prefill", "decode", "router")}
    # `dsv4ctl apply PROFILE`: planned against live facts, then applied
    assert env.cli("apply", str(env.profile_file(decode_knob(env, 32), "p2.yaml"))) == 0
    r2 = env.current()
    assert r2 != r1 and env.record(r2)["status"] == "healthy"
    assert env.record(r2)["restarted_roles"] == ["decode"]
    after = {m: env.starts(m) for m in before}
    assert after == {**before, "decode": before["decode"] + 1}
    assert env.serves() and env.lock_free()


def test_never_ready_rolls_back_and_old_release_serves(env: Env,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    r1 = first_release(env)
    # only the new decode command line (cuda-graph-max-bs 32) never becomes ready
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 32", {"never_ready": True}))
    plan_path = env.save(env.plan(decode_knob(env, 32)), "p2.json")
    capsys.readouterr()
    assert env.cli("apply", str(plan_path)) == ExitCode.ROLLED_BACK
    out = capsys.readouterr()
    assert "rolled back" in out.out and "To recover:" in out.out
    # the failure names the unit's log and shows its last lines (not only "HTTP 503")
    assert "last " in out.out and f"lines of {ROOT}/logs/decode.log:" in out.out
    assert "    | " in out.out and f"(log: {ROOT}/logs/decode.log)" in out.out + out.err
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    rec = env.record(r2)
    steps = journal(rec)
    assert rec["status"] == "rolled-back" and rec["rollback_target"] == r1
    assert steps["health"] == "failed" and steps["smoke"] == "not-run"
    assert all(steps[f"rollback:{s}"] == "ok" for s in ("stop", "switch", "start", "health"))
    assert "not healthy" in next(e["error"] for e in rec["journal"] if e["step"] == "health")
    assert any(e["kind"] == "rollback-to" for e in env.record(r1)["events"])
    # the same saved plan cannot be applied again, and that is what apply says even when the
    # host's facts changed too (here a GPU gone)
    from tests.sim.nvidia_smi import default_config

    capsys.readouterr()
    assert env.cli("apply", str(plan_path)) == ExitCode.STALE_PLAN
    assert "already applied" in capsys.readouterr().err
    env.fake.set_gpus(default_config(7))
    try:
        assert env.cli("apply", str(plan_path)) == ExitCode.STALE_PLAN
        assert "already applied as release " + r2 in capsys.readouterr().err
    finally:
        env.fake.set_gpus(default_config(8))
    assert env.lock_free()


def test_first_apply_never_ready_stops_its_units(env: Env) -> None:
    """Nothing earlier to restore: the failed release's units are stopped, exit 4, journaled."""
    env.fake.write_sim_control(rule("--disaggregation-mode decode", {"never_ready": True}))
    assert env.apply(env.profile()) == ExitCode.ROLLBACK_FAILED
    (r1,) = env.releases()
    rec = env.record(r1)
    assert rec["status"] == "rollback-failed" and rec["rollback_target"] is None
    assert journal(rec)["health"] == "failed"
    states = env.fake.exec("systemctl --user is-active dsv4-itest-prefill.service "
                           "dsv4-itest-decode.service dsv4-itest-router.service").stdout.split()
    assert states == ["inactive"] * 3
    assert env.lock_free()


def test_crash_after_start_rolls_back(env: Env) -> None:
    r1 = first_release(env)
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 48", {"crash_after_s": 1.0}))
    assert env.apply(decode_knob(env, 48), name="p2.json") == ExitCode.ROLLED_BACK
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    rec = env.record(r2)
    err = next(e["error"] for e in rec["journal"] if e["step"] == "health")
    assert "crashed" in err
    assert rec["status"] == "rolled-back"


def test_unexpected_error_after_switch_rolls_back(env: Env,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.apply import steps

    r1 = first_release(env)

    real_switch = steps.ACTIONS["switch_current"]
    calls: list[str] = []

    def switch_then_bug(ctx: Any, step: Any) -> Any:
        """Switches, then fails like a bug would - only in the apply, not in its rollback."""
        out = real_switch(ctx, step)
        calls.append(ctx.journal_prefix)
        if ctx.journal_prefix == "":
            raise RuntimeError("bug in a step")
        return out

    monkeypatch.setitem(steps.ACTIONS, "switch_current", switch_then_bug)
    assert env.apply(decode_knob(env, 32), name="p2.json") == ExitCode.ROLLED_BACK
    monkeypatch.undo()
    assert calls == ["", "rollback:"]
    env.assert_recovered(r1)
    rec = env.record(next(r for r in env.releases() if r != r1))
    assert journal(rec)["switch"] == "failed" and journal(rec)["rollback:health"] == "ok"
    assert "unexpected RuntimeError: bug in a step" in next(
        e["error"] for e in rec["journal"] if e["step"] == "switch")


def test_connection_dropped_during_upload(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.remote.connection import RemoteHost

    r1 = first_release(env)
    original = RemoteHost.put_bytes

    def dropping(self: RemoteHost, data: bytes, remote_path: str, **kw: Any) -> None:
        if remote_path.endswith(".tar.gz"):
            def cut(done: int, total: int) -> None:
                if done >= total // 2:
                    self.connection.client.get_transport().close()  # the network goes away
            kw["on_progress"], kw["chunk"] = cut, 4096
        original(self, data, remote_path, **kw)

    monkeypatch.setattr(RemoteHost, "put_bytes", dropping)
    assert env.apply(decode_knob(env, 24), name="p2.json") == ExitCode.ERROR
    monkeypatch.setattr(RemoteHost, "put_bytes", original)
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    rec = env.record(r2)
    assert rec["status"] == "failed" and journal(rec)["upload"] == "failed"
    assert journal(rec)["switch"] == "not-run"
    # the record says what happened: nothing restarted (history listed the planned roles)
    assert rec["restarted_roles"] == []
    # no half-uploaded tree is left, and the failed release was never made current
    assert env.fake.exec(f"ls -a {ROOT}/releases | grep -c tmp").stdout.strip() == "0"
    assert env.fake.exec(f"test -e {ROOT}/releases/{r2}/units").returncode != 0


def test_concurrent_apply_refused_with_holder_shown(env: Env,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.remote.connection import connect
    from orchestrator.remote.lock import HostLock

    r1 = first_release(env)
    with connect(env.host_name, env.host) as remote:
        lock = HostLock(remote, ROOT, "dsv4ctl apply other-plan.json")
        lock.acquire()
        assert not env.lock_free()
        capsys.readouterr()
        assert env.apply(decode_knob(env, 32), name="p2.json") == ExitCode.LOCKED
        err = " ".join(capsys.readouterr().err.split())  # human text is fitted to the terminal
        assert "locked by another dsv4ctl run" in err and "dsv4ctl apply other-plan.json" in err
        # unlock without --force only shows the holder
        assert env.cli("unlock", "--host", "h") == ExitCode.LOCKED
        assert "other-plan.json" in capsys.readouterr().out
        assert not env.lock_free()
        # --force ends the holder: the lock is free although our session still exists
        assert env.cli("unlock", "--host", "h", "--force") == 0
        assert env.lock_free()
        lock.release()
    assert env.current() == r1 and env.releases() == [r1]
    # a holder that dies without releasing (SIGKILL) frees the lock with its connection
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, env.host.model_dump_json()], cwd=REPO,
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    assert not env.lock_free()
    holder.kill()
    holder.wait(10)
    deadline = time.monotonic() + 10
    while not env.lock_free():
        assert time.monotonic() < deadline, "lock not released after its holder was killed"
        time.sleep(0.2)



def test_the_fleet_of_one_takes_the_fleet_lock_then_its_host_lock(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30: one lock protocol for one host or many. A one-host profile's apply takes its
    fleet lock (in its host lock's own command), so a run holding that fleet lock refuses it with
    the holder shown, and `unlock -p PROFILE` shows and frees the fleet lock, then the host's."""
    from orchestrator.planner.targets import fleet_lock_name
    from orchestrator.remote.connection import connect
    from orchestrator.remote.lock import HostLock

    r1 = first_release(env)
    prof = decode_knob(env, 32)
    path = env.profile_file(prof, "one-host.yaml")
    name = fleet_lock_name(prof.name)
    with connect(env.host_name, env.host) as remote:
        lock = HostLock(remote, ROOT, "dsv4ctl apply held-fleet.yaml", name=name)
        lock.acquire()
        assert env.lock_free()  # only the fleet lock is held
        capsys.readouterr()
        assert env.cli("apply", str(path)) == ExitCode.LOCKED
        err = " ".join(capsys.readouterr().err.split())
        assert name in err and "held-fleet.yaml" in err, err
        assert env.cli("unlock", "-p", str(path)) == ExitCode.LOCKED
        out = " ".join(capsys.readouterr().out.split())
        assert f"fleet {prof.name} (its lock on host 'h') is locked by" in out, out
        assert "held-fleet.yaml" in out and "host 'h' is not locked" in out, out
        assert env.cli("unlock", "-p", str(path), "--force") == 0
        lock.release()
    assert env.current() == r1 and env.releases() == [r1]  # the refused apply changed nothing
    # once free, the same apply runs, and leaves both locks free
    assert env.cli("apply", str(path)) == 0, capsys.readouterr()
    assert env.current() != r1 and env.lock_free()
    assert env.fake.exec(f"flock -n {ROOT}/{name} true").returncode == 0



def test_a_no_change_apply_reads_drift_and_the_engine_env_once(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: a no-change apply from a profile runs the drift probe (a python3 on the host)
    and the engine env's trust walk once each, in its probe, not again under the lock; a saved
    plan runs each once, in the lock's batch. Still one connection and two commands (one for the
    saved plan). Counted in what dsv4ctl sends over SSH, batches included."""
    from orchestrator.remote.connection import RemoteHost

    first_release(env)
    sent: list[str] = []
    connects: list[str] = []
    for name in ("run", "open_process"):
        orig = getattr(RemoteHost, name)

        def counted(self: Any, command: str, *a: Any, _orig: Any = orig, **k: Any) -> Any:
            sent.append(command)
            return _orig(self, command, *a, **k)

        monkeypatch.setattr(RemoteHost, name, counted)
    orig_connect = RemoteHost.connect

    def counted_connect(self: Any, *a: Any, **k: Any) -> Any:
        connects.append(self.name)
        return orig_connect(self, *a, **k)

    monkeypatch.setattr(RemoteHost, "connect", counted_connect)
    drift = "import hashlib, json, os, subprocess, sys"  # the drift probe's script
    walk = f"dsv4_env {env.profile().engine.env}"  # the trust walk's call

    def reads() -> tuple[int, int, int, int]:
        return (len(connects), len(sent), sum(c.count(drift) for c in sent),
                sum(c.count(walk) for c in sent))

    profile = env.profile_file(env.profile())
    assert env.cli("apply", str(profile)) == 0
    assert reads() == (1, 2, 1, 1), reads()
    plan = env.save(env.plan(env.profile()), "again.json")
    sent.clear()
    connects.clear()
    assert env.cli("apply", str(plan)) == 0
    assert reads() == (1, 1, 1, 1), reads()


HOLD_LOCK = """
import sys, time
from orchestrator.profile.inventory import Host
from orchestrator.remote.connection import connect
from orchestrator.remote.lock import HostLock
remote = connect("h", Host.model_validate_json(sys.argv[1]))
HostLock(remote, "/srv/dsv4", "dsv4ctl apply (killed)").acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_stale_saved_plan_refused(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.sim.nvidia_smi import default_config

    stale = env.save(env.plan(env.profile()), "stale.json")  # made against the empty host
    r1 = first_release(env)
    capsys.readouterr()
    assert env.cli("apply", str(stale)) == ExitCode.STALE_PLAN
    assert "current release is " + r1 in capsys.readouterr().err
    # facts changed: a GPU disappeared after planning
    plan = env.save(env.plan(decode_knob(env, 32)), "p2.json")
    env.fake.set_gpus(default_config(7))
    try:
        assert env.cli("apply", str(plan)) == ExitCode.STALE_PLAN
        assert "facts" in capsys.readouterr().err
    finally:
        env.fake.set_gpus(default_config(8))
    assert env.current() == r1 and env.lock_free() and env.releases() == [r1]


def test_ctrl_c_during_apply(env: Env) -> None:
    r1 = first_release(env)
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 32", {"start_delay_s": 30}))
    plan = env.save(env.plan(decode_knob(env, 32)), "p2.json")
    # Ctrl-C in a terminal: SIGINT at its default action. A process started in the background
    # (`make test &`, nohup) inherits SIGINT ignored, and so would dsv4ctl here, which then never
    # sees the signal: the apply ran into its health timeout and the test failed whenever the
    # suite was started that way.
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from orchestrator.cli import entrypoint; entrypoint()")
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code,
         "apply", str(plan), "--yes", "-i", str(env.inventory_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    lines: list[str] = []
    seen = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "waiting:" in line:
                seen.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert seen.wait(60), "apply never reached the health wait:\n" + "".join(lines)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == ExitCode.INTERRUPTED, "".join(lines)
    t.join(5)
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    rec = env.record(r2)
    steps = journal(rec)
    assert rec["status"] == "interrupted" and steps["health"] == "interrupted"
    assert steps["rollback:health"] == "ok"


def test_explicit_rollback_history_status(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    r1 = first_release(env)
    # the operator's flow: `dsv4ctl plan --host h --live -o plan.json`, review,
    # `dsv4ctl apply plan.json`
    saved = env.tmp / "cli-plan.json"
    prof = env.profile_file(decode_knob(env, 32), "p2.yaml")
    assert env.cli("plan", str(prof), "--host", "h", "--live", "-o", str(saved)) == 0
    assert env.cli("apply", str(saved)) == 0
    r2 = env.current()
    assert r2 != r1
    before = {m: env.starts(m) for m in ("prefill", "decode", "router")}
    assert env.cli("rollback", r1, "--host", "h") == 0
    assert env.current() == r1
    assert {m: env.starts(m) for m in before} == {**before, "decode": before["decode"] + 1}
    env.assert_recovered(r1)
    events = env.record(r1)["events"]
    assert events[-1]["kind"] == "rollback-to" and events[-1]["other"] == r2
    assert any(e["kind"] == "rolled-back-from" for e in env.record(r2)["events"])
    capsys.readouterr()
    assert env.cli("history", "--host", "h") == 0
    out = capsys.readouterr().out
    assert f"* {r1}" in out and f"  {r2}" in out
    # the events read the right way round on each release's row
    assert f"rolled back to this release from {r2}" in out.split(f"  {r2}")[0]
    assert f"rolled back from this release to {r1}" in out.split(f"  {r2}")[1]
    assert env.cli("status", "--host", "h") == 0
    out = capsys.readouterr().out
    assert f"current release {r1} (healthy)" in out and "no drift" in out
    # drift: someone edits a launch script on the host
    env.fake.exec(f"echo '# edited' >> {ROOT}/releases/{r1}/bin/launch-decode.sh")
    assert env.cli("status", "--host", "h") == 1
    assert "drift (files): bin/launch-decode.sh modified" in capsys.readouterr().out
    # default target: the last healthy release before current (none before r1)
    assert env.cli("rollback", "--host", "h") == 1
    assert "no healthy release before" in capsys.readouterr().err
    assert env.cli("rollback", "r9999-20260101T000000Z-deadbeef", "--host", "h") == 1


def test_pruning_keeps_current_and_last_healthy(env: Env) -> None:
    d = profile_dict()
    d["rollout"]["keep_releases"] = 2
    base = load_text(Profile, yaml.safe_dump(d), "p.yaml")
    assert env.apply(base, name="p1.json") == 0
    r1 = env.current()
    # every later decode command line crashes at once, so each apply fails fast and rolls back
    env.fake.write_sim_control({"rules": [{"match": {"argv_contains": ["--cuda-graph-max-bs"]},
                                           "set": {"crash_after_s": 0.2}}]})
    failed = []
    for i, bs in enumerate((16, 24, 40)):
        d["topology"]["decode"]["cuda_graph_max_bs"] = bs
        prof = load_text(Profile, yaml.safe_dump(d), "p.yaml")
        assert env.apply(prof, name=f"f{i}.json") == ExitCode.ROLLED_BACK
        failed.append(next(r for r in env.releases() if r not in (r1, *failed)))
    # keep 2: the two newest stay, the oldest failed one is gone, and r1 - current and the last
    # healthy release - stays although it is the oldest of all
    assert env.releases() == [r1, failed[1], failed[2]]
    env.assert_recovered(r1)


def test_qualification_gate_pass_then_fail_rolls_back(env: Env) -> None:
    d = profile_dict()
    d["health"]["qualify"] = {"min_output_tok_s": 1.0, "load_concurrency": 2,
                              "load_duration_s": 1.0, "on_fail": "rollback"}
    assert env.apply(load_text(Profile, yaml.safe_dump(d), "p.yaml"), name="q1.json") == 0
    r1 = env.current()
    rec = env.record(r1)
    assert journal(rec)["qualify"] == "ok"
    assert "load_output_tok_s" in next(e["detail"] for e in rec["journal"]
                                       if e["step"] == "qualify")
    # an unreachable throughput bar: qualification fails like a failed health check
    d["health"]["qualify"]["min_output_tok_s"] = 1e9
    d["topology"]["decode"]["cuda_graph_max_bs"] = 32  # and decode changes, so it restarts
    assert env.apply(load_text(Profile, yaml.safe_dump(d), "p.yaml"),
                     name="q2.json") == ExitCode.ROLLED_BACK
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    err = next(e["error"] for e in env.record(r2)["journal"] if e["step"] == "qualify")
    assert "qualification failed" in err and "required" in err


def test_topology_change_pd_to_colocated_removes_old_units(env: Env) -> None:
    r1 = first_release(env)
    d = profile_dict()
    d["topology"] = {"mode": "colocated", "engine": {"gpus": list(range(8)), "tp": 8, "ep": 8}}
    assert env.apply(load_text(Profile, yaml.safe_dump(d), "p.yaml"), name="c.json") == 0
    r2 = env.current()
    assert r2 != r1 and env.record(r2)["status"] == "healthy"
    units = env.fake.exec("ls ~/.config/systemd/user").stdout.split()
    assert "dsv4-itest-engine.service" in units
    assert not any(u in units for u in ("dsv4-itest-decode.service", "dsv4-itest-prefill.service",
                                        "dsv4-itest-router.service"))
    active = env.fake.exec("systemctl --user is-active dsv4-itest-decode.service "
                           "dsv4-itest-engine.service").stdout.split()
    assert active == ["inactive", "active"]
    # rolling back to the PD release brings its three units back and removes the engine's
    assert env.cli("rollback", "--host", "h") == 0
    env.assert_recovered(r1)
    assert "dsv4-itest-engine.service" not in env.fake.exec(
        "ls ~/.config/systemd/user").stdout.split()


def test_jump_host_and_connect_errors(env: Env, hosts: list[FakeHost]) -> None:
    """Reach host1 through host2 as a bastion (ProxyJump over real sshd); a wrong key fails at
    once with a clear message, a closed port after the retries."""
    from orchestrator.errors import RemoteError
    from orchestrator.remote.connection import RemoteHost

    jump = hosts[1].inventory_dict()
    via = env.host.model_copy(update={"jump": JumpHost(address=jump["address"],
                                                       user=jump["user"], port=jump["port"])})
    facts = gather_facts("h", via)
    assert len(facts.gpus) == 8 and 22 in facts.ports_in_use
    bad_key = env.tmp / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(bad_key)], check=True)
    sleeps: list[float] = []
    with pytest.raises(RemoteError, match=r"authentication .* failed") as exc:
        RemoteHost("h", env.host.model_copy(update={"key": str(bad_key)}),
                   sleep=sleeps.append).connect()
    assert sleeps == [] and "authorized_keys" in (exc.value.fix or "")
    with pytest.raises(RemoteError, match="after 4 attempts"):
        RemoteHost("h", env.host.model_copy(update={"port": 2}), sleep=sleeps.append).connect()
    assert sleeps == [1.0, 2.0, 4.0]
