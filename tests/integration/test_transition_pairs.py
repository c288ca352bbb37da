"""diff = plan = apply, proven on a real host (issue 21, Deliver 1's acceptance).

For every ordered pair (A, B) of the shipped profiles, on one fake host (real sshd, real
`systemd --user`, the engine simulator) that runs A: the units `dsv4ctl diff A B` says stop, start
and restart are the ones `dsv4ctl plan B --host h --live` says, and the ones an apply of that saved plan
really stops, starts and restarts, as the harness observes them: `systemctl --user show` before
and after (ActiveState and InvocationID: a new invocation is a new process), cross-checked with the
simulator's run log (one line per engine or router process started) and the release record's
journal. The summary line is the same in diff and plan, text, markdown and JSON.

One host, applies in sequence (A -> A, A -> B, B -> B, B -> A covers every ordered pair of the two
shipped profiles), so the whole proof is a few applies long. The shipped profiles are used as they
are except for what points at the real machine (host, engine env path, the kernels step, the
production-length health timeouts and stability window).

Also here: a monitoring-only change is applied as a new release, not "No changes." (issue 20 item
5, which relies on this model).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from tests.harness import FakeHost
from tests.integration.test_apply import ROOT, TOTAL_SIZE, Env, _clean

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SHIPPED = {"default": REPO / "profiles" / "default.yaml",
           "mxfp4-tp8": REPO / "profiles" / "mxfp4-tp8.yaml"}


def shipped(name: str, **monitoring: Any) -> dict[str, Any]:
    """A shipped profile pointed at the fake host; everything that shapes the release kept."""
    d = yaml.safe_load(SHIPPED[name].read_text())
    d["host"] = "h"
    d["engine"]["env"] = "/opt/sglang-env"
    d["kernels"] = {"enabled": False}  # the kernels' self-test needs a GPU
    # test-sized health: the simulator is up in well under a second, and the shipped profiles
    # leave health.stability_window_s to the code default (the router's 60 s x 3 = 180 s), which
    # would idle every apply here for three minutes; the window itself is tested in
    # test_apply_faults.py (test_engine_killed_during_the_stability_window_rolls_back)
    d["health"] = {"startup_timeout_s": 10, "poll_interval_s": 0.3, "stability_window_s": 1.5}
    d["rollout"] = {"keep_releases": 10, "rollback_timeout_s": 20}
    if monitoring:
        d["monitoring"] = monitoring
    return d


@pytest.fixture
def penv(hosts: list[FakeHost], fresh_sim_control: list[FakeHost], tmp_path: Path
         ) -> Iterator[Env]:
    h = hosts[0]
    _clean(h)
    index = json.dumps({"metadata": {"total_size": TOTAL_SIZE}, "weight_map": {}})
    for name in SHIPPED:
        path = yaml.safe_load(SHIPPED[name].read_text())["model"]["path"]
        h.exec(f"mkdir -p {path} && printf '%s' '{index}' > {path}/model.safetensors.index.json",
               check=True)
    yield Env(h, tmp_path)
    _clean(h)


def _write(env: Env, name: str, data: dict[str, Any]) -> Path:
    path = env.tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(capsys: pytest.CaptureFixture[str], env: Env, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main([*args, "-i", str(env.inventory_path)])
    return rc, capsys.readouterr().out


def _units(env: Env) -> dict[str, tuple[str, str]]:
    """unit -> (ActiveState, InvocationID) of every dsv4 unit systemd knows on the host."""
    out = env.fake.exec("cd ~/.config/systemd/user 2>/dev/null && ls dsv4-*.service").stdout.split()
    names = sorted(set(out) | set(_seen))
    res = env.fake.exec("systemctl --user show -p Id -p ActiveState -p InvocationID "
                        + " ".join(names)) if names else None
    states: dict[str, tuple[str, str]] = {}
    if res is not None:
        for block in res.stdout.strip().split("\n\n"):
            kv = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            if kv.get("Id"):
                states[kv["Id"]] = (kv.get("ActiveState", ""), kv.get("InvocationID", ""))
    _seen.update(states)
    return states


_seen: set[str] = set()


def _observed(before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]]
              ) -> dict[str, set[str]]:
    """What the apply did to each unit, as systemd shows it."""
    out: dict[str, set[str]] = {"stop": set(), "start": set(), "restart": set()}
    for unit in set(before) | set(after):
        was, now = before.get(unit, ("inactive", "")), after.get(unit, ("inactive", ""))
        up_before, up_after = was[0] == "active", now[0] == "active"
        if up_before and not up_after:
            out["stop"].add(unit)
        elif up_after and not up_before:
            out["start"].add(unit)
        elif up_before and up_after and was[1] != now[1]:
            out["restart"].add(unit)
    return out


def _by_kind(actions: list[dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {"stop": set(), "start": set(), "restart": set()}
    for a in actions:
        if a["kind"] in out:
            out[a["kind"]].add(a["target"])
    return out


def test_every_pair_of_shipped_profiles_diff_equals_plan_equals_apply(
        penv: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env = penv
    _seen.clear()
    paths = {n: _write(env, n, shipped(n)) for n in SHIPPED}
    assert env.cli("apply", str(paths["default"]), "--yes") == 0
    steps = [("default", "default"), ("default", "mxfp4-tp8"), ("mxfp4-tp8", "mxfp4-tp8"),
             ("mxfp4-tp8", "default")]
    for a, b in steps:
        pair = f"{a} -> {b}"
        rc, out = _run(capsys, env, "diff", str(paths[a]), str(paths[b]), "--format", "json")
        assert rc == 0, pair
        diff = json.loads(out)
        saved = env.tmp / f"plan-{a}-{b}.json"
        rc, out = _run(capsys, env, "plan", str(paths[b]), "--host", "h", "--live", "--format",
                       "json", "-o", str(saved))
        assert rc == 0, (pair, out)
        plan = json.loads(out)
        # diff and plan: the same actions, the same summary, in every format
        assert diff["actions"] == plan["actions"], pair
        assert diff["summary"]["counts"] == plan["summary"]["counts"], pair
        line = plan["summary"]["line"]
        assert diff["summary"]["line"] == line, pair
        for fmt in ("text", "markdown"):
            rc, out = _run(capsys, env, "plan", str(paths[b]), "--host", "h", "--live",
                           "--format", fmt)
            flat = " ".join(out.split())  # lines are folded at 100 columns in a pipe
            assert rc == 0 and line in flat, (pair, fmt, "plan", rc, out)
            rc, out = _run(capsys, env, "diff", str(paths[a]), str(paths[b]), "--format", fmt)
            flat = " ".join(out.split())
            assert rc == 0 and (line in flat if plan["actions"] else "no differences" in
                                flat.lower()), (pair, fmt, "diff", rc, out)
        # apply the reviewed plan and watch what systemd really did
        before_release = env.current()
        runs_before = len(env.fake.sim_runs())
        before = _units(env)
        rc, out = _run(capsys, env, "apply", str(saved), "--yes")
        assert rc == 0, (pair, out)
        after = _units(env)
        seen = _observed(before, after)
        want = _by_kind(plan["actions"])
        assert seen == want, (pair, seen, want)
        # every started or restarted engine/router is one new simulator process
        assert len(env.fake.sim_runs()) - runs_before == len(want["start"] | want["restart"])
        if not plan["actions"]:
            assert "No changes." in out and env.current() == before_release, pair
            continue
        rel = env.current()
        assert rel != before_release, pair
        rec = env.record(rel)
        assert rec["status"] == "healthy", pair
        journal = {e["step"]: e.get("detail") or "" for e in rec["journal"]}
        assert line.removeprefix("Plan: ") in journal["preflight"], pair
        for unit in want["stop"] | want["restart"]:
            assert unit in journal["stop"], (pair, unit)
        for unit in want["start"] | want["restart"]:
            assert unit in journal["start"], (pair, unit)
        # the smoke step is one real generation through the entry point (the router, or the
        # colocated engine, which listens on the host's loopback only)
        assert {e["step"]: e["result"] for e in rec["journal"]}["smoke"] == "ok", pair
    # the four steps covered both directions of the only topology switch, and it was real
    assert env.current() is not None and env.lock_free()


def test_monitoring_only_change_is_applied(penv: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 20 item 5: plan counted the change, apply said "No changes." and kept the old
    prometheus.yml. Now both use the transition: a new release, nothing restarted."""
    env = penv
    _seen.clear()
    base = _write(env, "base", shipped("default"))
    assert env.cli("apply", str(base), "--yes") == 0
    r1 = env.current()
    old = env.fake.read(f"{ROOT}/current/monitoring/prometheus.yml")
    changed = _write(env, "mon", shipped("default", scrape_interval_s=30))
    saved = env.tmp / "mon.json"
    rc, out = _run(capsys, env, "plan", str(changed), "--host", "h", "--live", "--format", "json",
                   "-o", str(saved))
    assert rc == 0
    plan = json.loads(out)
    assert plan["summary"]["counts"]["change"] >= 1
    assert not [a for a in plan["actions"] if a["kind"] in ("start", "stop", "restart")]
    before = _units(env)
    rc, out = _run(capsys, env, "apply", str(saved), "--yes")
    assert rc == 0, out
    assert "No changes." not in out
    r2 = env.current()
    assert r2 != r1 and env.record(r2)["status"] == "healthy"
    new = env.fake.read(f"{ROOT}/current/monitoring/prometheus.yml")
    assert new != old
    assert _observed(before, _units(env)) == {"stop": set(), "start": set(), "restart": set()}
