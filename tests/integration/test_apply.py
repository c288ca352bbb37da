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
from orchestrator.deployment import resolve
from orchestrator.errors import ExitCode
from orchestrator.facts import Facts
from orchestrator.planner_model import Plan, PlannedFile
from orchestrator.profile import load_text
from orchestrator.profile.inventory import Host, Inventory
from orchestrator.profile.schema import Profile
from orchestrator.remote import gather_facts
from orchestrator.render import render_release
from tests.harness import FakeHost

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
MODEL = "/models/DeepSeek-V4-Flash-NVFP4"
ROOT = "/srv/dsv4"
TOTAL_SIZE = 158_000_000_000


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
                     "router": {"port": 8000, "prometheus_port": 29000}},
        "kernels": {"enabled": False},
        "health": {"startup_timeout_s": 12, "poll_interval_s": 0.3},
        "rollout": {"keep_releases": 3, "rollback_timeout_s": 15},
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
                  "key": inv["key"], "scope": "user", "install_root": ROOT,
                  "connect_timeout_s": 5, "gpus": {"model": "rtx-pro-6000-se", "count": 8}}}}))
        inventory = load_text(Inventory, self.inventory_path.read_text(), "inventory.yaml")
        self.host: Host = inventory.hosts["h"]

    def profile(self, **over: Any) -> Profile:
        return load_text(Profile, yaml.safe_dump(profile_dict(**over)), "profile.yaml")

    def facts(self) -> Facts:
        return gather_facts(self.host_name, self.host, model_paths=[MODEL])

    def plan(self, profile: Profile, facts: Facts | None = None) -> Plan:
        """A plan as `dsv4ctl plan --host h -o` saves it: probed facts, rendered files."""
        facts = facts or self.facts()
        dep = resolve(profile, self.host_name, self.host, default_index_topk=512,
                      max_context_length=1048576)
        tree = render_release(profile, dep)
        files = [PlannedFile(path=p, mode=f.mode, sha256=None if f.sensitive else f.sha256,
                             sensitive=f.sensitive, roles=list(f.roles),
                             content=None if f.sensitive else f.content)
                 for p, f in tree.all_files().items()]
        return Plan(tool_version="test", profile_name=profile.name, profile_path=None,
                    profile_sha256="0" * 64, host=self.host_name, facts_source="probed",
                    facts_fingerprint=facts.fingerprint(),
                    current_release=facts.current_release, deployment=dep, capacity=[],
                    gpus=[], disks=[], checks=[], files=files, actions=[], restarts=[])

    def save(self, plan: Plan, name: str = "plan.json") -> Path:
        path = self.tmp / name
        path.write_text(plan.model_dump_json(indent=2))
        return path

    def cli(self, *args: str) -> int:
        return main([*args, "-i", str(self.inventory_path)])

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

    def serves(self) -> bool:
        """A real generation through the router, from outside the host."""
        import urllib.request

        body = json.dumps({"model": "deepseek-v4-flash", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "say ready"}]}).encode()
        req = urllib.request.Request(self.fake.url(8000, "/v1/chat/completions"), data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status == 200 and bool(json.loads(resp.read())["choices"])
        except OSError:
            return False

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

def test_first_apply_then_no_change(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    rel = first_release(env)
    rec = env.record(rel)
    assert rec["status"] == "healthy"
    steps = {e["step"]: e["result"] for e in rec["journal"]}
    assert steps["preflight"] == "ok" and steps["health"] == "ok" and steps["smoke"] == "ok"
    assert steps["kernels"] == "skipped"
    assert "kernels.enabled is false" in next(e["detail"] for e in rec["journal"]
                                             if e["step"] == "kernels")
    assert sorted(rec["restarted_roles"]) == ["decode", "prefill", "router"]
    assert env.serves() and env.lock_free()
    # the release holds the tree, the applyable resolved profile, the plan and the manifest
    for rel_path in ("units/dsv4-itest-decode.service", "bin/launch-decode.sh",
                     "profile.yaml", "plan.json", "manifest.json"):
        assert env.fake.exec(f"test -f {ROOT}/releases/{rel}/{rel_path}").returncode == 0
    before = {m: env.starts(m) for m in ("prefill", "decode", "router")}
    capsys.readouterr()
    # no-change apply: restarts nothing, says so, creates no release
    assert env.apply(env.profile(), name="again.json") == 0
    assert "No changes." in capsys.readouterr().out
    assert {m: env.starts(m) for m in before} == before
    assert env.releases() == [rel] and env.current() == rel and env.lock_free()
