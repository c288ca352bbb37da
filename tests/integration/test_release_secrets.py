"""Secrets are part of the release (issues 19, 20), on a real host (sshd + systemd --user + the
engine simulator).

Each release keeps its secrets in its own 0600 ``secrets/<deployment>.<release>.env``; the file
the units read (``secrets/<deployment>.env``) becomes a release's only at its switch: apply,
the automatic restore after a failed apply and ``dsv4ctl rollback`` alike. Before, apply wrote
the new values over the units' file at upload, before the switch: a failed apply left the old,
still-serving release with the new key on disk (its next crash-restart took a key the clients do
not have), and a rollback never put the earlier release's key back.

The engines' key (``DSV4_SECRET_API_KEY``) is the witness: the simulator records the argv each
engine and router process received, where the launch shim puts ``--api-key VALUE``.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from orchestrator.errors import ExitCode
from orchestrator.profile import load_text
from orchestrator.profile.schema import Profile
from tests.integration import test_apply as base
from tests.integration.test_apply import ROOT, Env, journal, rule

pytestmark = pytest.mark.integration
env = base.env  # host1, reset before and after each case

OLD = "sk-OLD-5f0c2d9a7e31b8c4"
NEW = "sk-NEW-a4e9b07c1d6f3e28"
HF = "hf_itest_8c1e4f2b9a"
ACTIVE = f"{ROOT}/secrets/itest.env"
UNITS = {"prefill": "dsv4-itest-prefill.service", "decode": "dsv4-itest-decode.service",
         "router": "dsv4-itest-router.service"}


def profile(*, decode_bs: int | None = None, hf: bool = False) -> Profile:
    """The harness profile with the engines' API key from $ITEST_API (and HF_TOKEN from
    $ITEST_HF), optionally with decode's cuda_graph_max_bs changed (a decode-only file change)."""
    secrets = {"DSV4_SECRET_API_KEY": {"env": "ITEST_API"}}
    if hf:
        secrets["HF_TOKEN"] = {"env": "ITEST_HF"}
    d = base.profile_dict(secrets=secrets)
    if decode_bs is not None:
        d["topology"]["decode"]["cuda_graph_max_bs"] = decode_bs
    return load_text(Profile, yaml.safe_dump(d), "profile.yaml")


def active(env: Env) -> str | None:
    """The units' secrets file as the harness reads it on the host (None: there is none)."""
    r = env.fake.exec(f"cat {ACTIVE}")
    return r.stdout if r.returncode == 0 else None


def running_keys(env: Env) -> dict[str, str | None]:
    """role -> the --api-key value the role's running process received (its unit's MainPID,
    found in the simulator's run log), None when it got none."""
    runs = {r["pid"]: r["argv"] for r in env.fake.sim_runs()}
    out: dict[str, str | None] = {}
    for role, unit in UNITS.items():
        pid = int(env.fake.exec(f"systemctl --user show -p MainPID --value {unit}").stdout)
        argv = runs[pid]
        out[role] = argv[argv.index("--api-key") + 1] if "--api-key" in argv else None
    return out


def first(env: Env, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> str:
    monkeypatch.setenv("ITEST_API", OLD)
    monkeypatch.setenv("ITEST_HF", HF)
    assert env.apply(profile(**kw), name="r1.json") == 0
    r1 = env.current()
    assert r1 is not None and OLD in (active(env) or "")
    assert running_keys(env) == dict.fromkeys(UNITS, OLD)
    return r1


def test_rotated_key_with_failed_health_rolls_the_key_back(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """(1) The new decode crashes during the stability window: the restore puts r1 back, and
    with it r1's key, in the file the units read and in every running process."""
    r1 = first(env, monkeypatch)
    monkeypatch.setenv("ITEST_API", NEW)
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 32", {"crash_after_s": 1.0}))
    assert env.apply(profile(decode_bs=32), name="r2.json") == ExitCode.ROLLED_BACK
    assert env.current() == r1 and env.lock_free()
    text = active(env)
    assert text is not None and OLD in text and NEW not in text
    assert env.fake.exec(f"stat -c %a {ACTIVE}").stdout.strip() == "600"
    assert running_keys(env) == dict.fromkeys(UNITS, OLD)
    assert env.serves(api_key=OLD)
    r2 = next(r for r in env.releases() if r != r1)
    rec = env.record(r2)
    assert rec["status"] == "rolled-back" and journal(rec)["rollback:switch"] == "ok"
    # the rotated key reached the processes of r2 only through its switch: every role restarted
    assert sorted(rec["restarted_roles"]) == ["decode", "prefill", "router"]
    switch = next(e for e in rec["journal"] if e["step"] == "rollback:switch")
    assert "secrets file is now the one the units read" in switch["detail"]
    # r2 keeps its own key for a later rollback to it, private, until pruned
    own = f"{ROOT}/secrets/itest.{r2}.env"
    assert NEW in env.fake.read(own)
    assert env.fake.exec(f"stat -c %a {own}").stdout.strip() == "600"


def test_failure_before_the_switch_leaves_the_active_file(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """(2) A step after upload and before the switch fails: the serving release's file was never
    touched (a crash-restart of its engine in that window would take the old key)."""
    from orchestrator.apply import steps

    r1 = first(env, monkeypatch)
    monkeypatch.setenv("ITEST_API", NEW)
    seen: list[str | None] = []
    real_stop = steps.ACTIONS["stop_changed"]

    def stop_fails(ctx: Any, step: Any) -> Any:
        if ctx.journal_prefix == "":
            seen.append(active(env))
            raise RuntimeError("stop failed")
        return real_stop(ctx, step)

    monkeypatch.setitem(steps.ACTIONS, "stop_changed", stop_fails)
    assert env.apply(profile(decode_bs=32), name="r2.json") == ExitCode.ROLLED_BACK
    monkeypatch.undo()
    assert len(seen) == 1 and seen[0] is not None and OLD in seen[0] and NEW not in seen[0]
    assert env.current() == r1 and OLD in (active(env) or "") and NEW not in (active(env) or "")
    assert running_keys(env) == dict.fromkeys(UNITS, OLD)
    assert env.serves(api_key=OLD) and env.lock_free()


def test_rollback_restores_the_release_key(env: Env, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """(3) r2 rotates the key and is healthy; `dsv4ctl rollback r1` puts r1's key back: the
    file the units read and the key every running process received."""
    r1 = first(env, monkeypatch)
    monkeypatch.setenv("ITEST_API", NEW)
    assert env.apply(profile(decode_bs=32), name="r2.json") == 0
    r2 = env.current()
    assert r2 != r1 and NEW in (active(env) or "")
    assert running_keys(env) == dict.fromkeys(UNITS, NEW)
    assert env.serves(api_key=NEW)
    monkeypatch.delenv("ITEST_API")  # a rollback needs nothing from the controller's secrets
    assert env.cli("rollback", r1, "--host", "h") == 0
    assert env.current() == r1
    text = active(env)
    assert text is not None and OLD in text and NEW not in text
    assert running_keys(env) == dict.fromkeys(UNITS, OLD)
    assert env.serves(api_key=OLD) and env.generate_status(NEW) == 401
    # status agrees: current's secrets are what the units read; an edit on the host is drift
    capsys.readouterr()
    assert env.cli("status", "--host", "h") == 0
    assert "no drift" in capsys.readouterr().out
    env.fake.exec(f"echo 'X=1' >> {ACTIVE}", check=True)
    assert env.cli("status", "--host", "h") == 1
    shown = capsys.readouterr()
    assert "secrets/itest.env (what the units read) differs from " + r1 in " ".join(
        shown.out.split())
    assert OLD not in shown.out + shown.err and NEW not in shown.out + shown.err
    env.fake.exec(f"sed -i '/^X=1$/d' {ACTIVE}", check=True)
    # and forward again: the release's own file brings its key back
    assert env.cli("rollback", r2, "--host", "h") == 0
    assert running_keys(env) == dict.fromkeys(UNITS, NEW) and NEW in (active(env) or "")


def test_removed_secret_leaves_at_the_switch(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """(4) HF_TOKEN removed from the profile: still in the units' file until the switch, gone
    right after it; a release with no secrets at all removes the file at its switch; rolling
    back to r1 brings both back."""
    from orchestrator.apply import steps

    r1 = first(env, monkeypatch, hf=True)
    assert HF in (active(env) or "")
    around: list[tuple[str | None, str | None]] = []
    real_switch = steps.ACTIONS["switch_current"]

    def watched(ctx: Any, step: Any) -> Any:
        before = active(env)
        out = real_switch(ctx, step)
        around.append((before, active(env)))
        return out

    monkeypatch.setitem(steps.ACTIONS, "switch_current", watched)
    assert env.apply(profile(decode_bs=32), name="r2.json") == 0
    (before, after), = around
    assert before is not None and HF in before
    assert after is not None and HF not in after and OLD in after
    # no secrets at all: the file goes at the switch, not at upload
    around.clear()
    assert env.apply(env.profile(), name="r3.json") == 0
    (before, after), = around
    assert before is not None and OLD in before and after is None
    assert running_keys(env) == dict.fromkeys(UNITS, None) and env.serves()
    monkeypatch.undo()
    assert env.cli("rollback", r1, "--host", "h") == 0
    text = active(env)
    assert text is not None and HF in text and OLD in text
    assert running_keys(env) == dict.fromkeys(UNITS, OLD)


def test_rotated_key_alone_restarts_every_role(env: Env, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Only the value changes (same profile, same files): not "No changes."; a new release
    whose switch brings the key, every running role restarted with it, the value never printed."""
    r1 = first(env, monkeypatch)
    monkeypatch.setenv("ITEST_API", NEW)
    capsys.readouterr()
    assert env.apply(profile(), name="r2.json") == 0
    shown = capsys.readouterr()
    said = " ".join(shown.out.split())
    assert "No changes." not in said and "the secrets the units read change" in said
    assert NEW not in shown.out + shown.err and OLD not in shown.out + shown.err
    r2 = env.current()
    assert r2 != r1 and NEW in (active(env) or "")
    assert running_keys(env) == dict.fromkeys(UNITS, NEW) and env.serves(api_key=NEW)
    assert sorted(env.record(r2)["restarted_roles"]) == ["decode", "prefill", "router"]


def test_a_rotation_the_plan_cannot_show_is_asked_about_before_apply_changes_anything(
        env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Only a value changes: the plan has no actions (values never enter it), so `apply PROFILE`
    used to go ahead without asking and restart every role (a model reload). It now reads the
    host's active digest before the prompt, says every running role restarts, and asks; with
    stdin not a terminal that refusal changes nothing. The plan itself says it cannot see values."""
    from orchestrator.cli import main

    r1 = first(env, monkeypatch)
    monkeypatch.setenv("ITEST_API", NEW)
    plan = env.plan(profile())
    assert not plan.actions
    assert "secrets.values-not-planned" in [c.id for c in plan.checks]
    capsys.readouterr()
    rc = main(["apply", str(env.profile_file(profile())), "-i", str(env.inventory_path)])
    shown = capsys.readouterr()
    said = " ".join((shown.out + shown.err).split())
    assert rc == ExitCode.ERROR, said
    assert "every running role restarts at the switch" in said and "needs confirmation" in said
    assert NEW not in shown.out + shown.err and OLD not in shown.out + shown.err
    assert env.current() == r1 and OLD in (active(env) or "")
    assert running_keys(env) == dict.fromkeys(UNITS, OLD) and env.lock_free()


def test_router_key_alone_guards_the_router(env: Env, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """DSV4_SECRET_ROUTER_API_KEY alone: the router demands it, the engines (on loopback) have
    none. The health checks sent the engines' key (none) to the router too, so /workers answered
    401 and a correct profile was rolled back; they now send each port its own key, and status
    reads the router with it."""
    from orchestrator.cli import main

    router_key = "sk-router-7d41c9e0b2a35f86"
    monkeypatch.setenv("ITEST_ROUTER", router_key)
    d = base.profile_dict(secrets={"DSV4_SECRET_ROUTER_API_KEY": {"env": "ITEST_ROUTER"}})
    capsys.readouterr()
    assert env.apply(load_text(Profile, yaml.safe_dump(d), "profile.yaml"), name="rk.json") == 0
    assert env.generate_status(router_key) == 200
    assert env.generate_status(None) == 401 and env.generate_status("sk-wrong") == 401
    assert main(["status", "--host", "h", "-i", str(env.inventory_path)]) == 0
    shown = capsys.readouterr()
    assert router_key not in shown.out + shown.err
