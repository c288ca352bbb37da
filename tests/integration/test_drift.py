"""Drift is a change: what was edited on the host outside dsv4ctl shows in `plan --live` as
actions with their reason, and `apply` repairs it with the restarts it implies.

Real sshd, real `systemd --user`, the engine simulator behind the units (the harness of
test_apply.py). The scenario an operator reported: `launch-decode.sh` edited on the host and a
unit changed; `plan --live --detailed-exitcode` said "no changes" (rc 0), `apply` said "No
changes.", and `status` kept exiting 1.
"""

from __future__ import annotations

import pytest

from tests.integration.test_apply import ROOT, Env, env, first_release  # noqa: F401

pytestmark = pytest.mark.integration
UNITS = "~/.config/systemd/user"


def test_plan_lists_drift_apply_repairs_it_status_agrees(env: Env,  # noqa: F811
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    r1 = first_release(env)
    profile = env.profile_file(env.profile(), "p.yaml")
    assert env.cli("status", "--host", "h") == 0
    # by hand on the host: an edited launch script in the release, an edited installed unit
    env.fake.exec(f"printf '# edited by hand\\n' >> {ROOT}/releases/{r1}/bin/launch-decode.sh "
                  f"&& printf '# edited by hand\\n' >> {UNITS}/dsv4-itest-prefill.service "
                  "&& systemctl --user daemon-reload", check=True)
    capsys.readouterr()
    assert env.cli("status", "--host", "h") == 1  # status sees the drift
    capsys.readouterr()

    rc = env.cli("plan", str(profile), "--host", "h", "--live", "--detailed-exitcode")
    out = capsys.readouterr().out
    assert rc == 2, out  # a drift-only plan has changes
    lines = [ln for ln in out.splitlines() if "changed outside dsv4ctl" in ln]
    assert any("bin/launch-decode.sh" in ln for ln in lines), out
    assert any("units/dsv4-itest-prefill.service" in ln for ln in lines), out
    assert "to restart" in out and "Plan: no changes" not in out

    before = {m: env.starts(m) for m in ("prefill", "decode", "router")}
    assert env.cli("apply", str(profile)) == 0
    r2 = env.current()
    assert r2 != r1
    rec = env.record(r2)
    assert rec["status"] == "healthy"
    assert sorted(rec["restarted_roles"]) == ["decode", "prefill"]  # the record says so
    after = {m: env.starts(m) for m in before}
    assert after == {**before, "decode": before["decode"] + 1, "prefill": before["prefill"] + 1}
    # the installed unit is the release's again, and the release's launch script is whole
    applied = capsys.readouterr().out
    # apply ends with where clients connect: the router on every interface (the harness profile
    # sets it, acknowledged), no key
    router_line = f"http://{env.host.address}:8000/v1  (router; every interface; no API key)"
    tail = applied.split("Apply complete:", 1)[1]
    assert tail.splitlines()[1] == "Endpoints:" and router_line in tail, applied[-600:]
    assert env.fake.exec(f"cmp -s {ROOT}/releases/{r2}/units/dsv4-itest-prefill.service "
                         f"{UNITS}/dsv4-itest-prefill.service").returncode == 0
    assert "edited by hand" not in env.fake.read(f"{ROOT}/releases/{r2}/bin/launch-decode.sh")
    capsys.readouterr()
    assert env.cli("status", "--host", "h") == 0
    status_out = capsys.readouterr().out
    assert router_line in status_out.split("\nEndpoints:\n", 1)[1], status_out
    assert env.cli("plan", str(profile), "--host", "h", "--live", "--detailed-exitcode") == 0


def test_replace_restarts_one_role_through_the_plan(env: Env,  # noqa: F811
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    first_release(env)
    profile = env.profile_file(env.profile(), "p.yaml")
    capsys.readouterr()
    rc = env.cli("plan", str(profile), "--host", "h", "--live", "--detailed-exitcode",
                 "--replace", "decode")
    out = capsys.readouterr().out
    assert rc == 2 and "replaced on request" in out, out
    assert "1 to restart" in out
    # saved and applied, the replace restarts decode and nothing else, and says so
    saved = env.tmp / "replace.json"
    assert env.cli("plan", str(profile), "--host", "h", "--live", "--replace", "decode",
                   "-o", str(saved)) == 0
    before = {m: env.starts(m) for m in ("prefill", "decode", "router")}
    assert env.cli("apply", str(saved)) == 0
    assert {m: env.starts(m) for m in before} == {**before, "decode": before["decode"] + 1}
    assert env.record(env.current())["restarted_roles"] == ["decode"]


def _second_release(env: Env) -> tuple[str, str]:  # noqa: F811
    from tests.integration.test_apply import decode_knob

    r1 = first_release(env)
    assert env.cli("apply", str(env.profile_file(decode_knob(env, 32), "p2.yaml"))) == 0
    r2 = env.current()
    assert r2 is not None and r2 != r1
    return r1, r2


def test_a_removed_release_directory_is_drift_that_apply_repairs(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    from tests.integration.test_apply import decode_knob

    _, r2 = _second_release(env)
    env.fake.exec(f"rm -rf {ROOT}/releases/{r2}", check=True)
    profile = env.profile_file(decode_knob(env, 32), "p2.yaml")
    capsys.readouterr()
    rc = env.cli("plan", str(profile), "--host", "h", "--live", "--detailed-exitcode")
    out = capsys.readouterr().out
    assert rc == 2 and "changed outside dsv4ctl" in out, out
    assert env.cli("apply", str(profile)) == 0  # the release is uploaded again
    r3 = env.current()
    assert r3 not in (None, r2) and env.record(r3)["status"] == "healthy"
    assert env.serves() and env.lock_free()


def test_rollback_works_when_the_current_release_directory_is_gone(
        env: Env) -> None:  # noqa: F811
    r1, r2 = _second_release(env)
    env.fake.exec(f"rm -rf {ROOT}/releases/{r2}", check=True)
    assert env.cli("rollback", r1, "--host", "h") == 0
    env.assert_recovered(r1)


def test_rollback_and_a_saved_plan_show_their_transition_before_they_start(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """The prompt said `Roll host 'box' back ... (restarts the roles that differ)? [y/N]` and
    only after `y` printed `3 to restart`: the transition is shown first (here with --yes, the
    same lines the prompt follows)."""
    from tests.integration.test_apply import decode_knob

    r1, _ = _second_release(env)
    capsys.readouterr()
    assert env.cli("rollback", r1, "--host", "h") == 0
    out = capsys.readouterr().out
    shown = out.index(f"Rollback of host 'h' to {r1}:")
    assert out.index("1 to restart", shown) < out.index("preflight"), out
    assert "~> dsv4-itest-decode.service" in out[shown:out.index("preflight")]
    # a saved plan: its actions before "Applying"
    saved = env.save(env.plan(decode_knob(env, 32)), "again.json")
    capsys.readouterr()
    assert env.cli("apply", str(saved)) == 0
    out = capsys.readouterr().out
    assert out.index("1 to restart") < out.index("Applying"), out


def test_apply_and_rollback_answer_one_json_document(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """`--format json` on apply and rollback: stdout is one document at the end (the progress
    went to stderr), with each host's result and the run's exit code."""
    import json

    from tests.integration.test_apply import decode_knob, rule

    r1 = first_release(env)
    capsys.readouterr()
    prof = env.profile_file(decode_knob(env, 32), "p2.yaml")
    assert env.cli("apply", str(prof), "--format", "json") == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    h = doc["hosts"]["h"]
    assert doc["ok"] and doc["exit_code"] == 0 and h["status"] == "healthy"
    assert h["release"] == env.current() != r1 and "Endpoints:" in h["message"]
    router = {"name": "router", "host": None, "url": f"http://{env.host.address}:8000/v1",
              "exposure": "all", "key": None, "client_facing": True}
    assert doc["endpoints"][0] == router, doc["endpoints"]  # where clients connect, as data
    assert "preflight" in out.err  # the progress, for humans, on stderr
    assert env.cli("rollback", r1, "--host", "h", "--format", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "rollback" and doc["hosts"]["h"]["status"] == "healthy"
    # a rollback ends with the endpoints of the release it went back to, as an apply does
    assert doc["endpoints"][0] == router and "Endpoints:" in doc["hosts"]["h"]["message"]
    # a failed apply: the same document, its exit code (3: rolled back) and how to recover
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 16", {"never_ready": True}))
    prof3 = env.profile_file(decode_knob(env, 16), "p3.yaml")
    rc = env.cli("apply", str(prof3), "--format", "json")
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3 == doc["exit_code"] and not doc["ok"]
    assert doc["hosts"]["h"]["status"] == "rolled-back" and doc["hosts"]["h"]["recovery"]


def test_a_running_command_line_that_differs_is_drift_that_apply_repairs(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """The files agree, the process does not: launch-decode.sh edited (watchdog 1800 -> 1900),
    decode restarted, the file restored by hand without a restart. `status` saw it (exit 1),
    `plan --live` said "no changes"."""
    r1 = first_release(env)
    profile = env.profile_file(env.profile(), "p.yaml")
    launch = f"{ROOT}/releases/{r1}/bin/launch-decode.sh"
    env.fake.exec(f"cp -p {launch} /tmp/launch-decode.orig "
                  f"&& sed -i 's/--watchdog-timeout 1800/--watchdog-timeout 1900/' {launch} "
                  f"&& grep -q -- '--watchdog-timeout 1900' {launch} "
                  "&& systemctl --user restart dsv4-itest-decode.service", check=True)
    # bash reads the script as it runs it: restore the file only once the engine runs 1900
    env.fake.exec("for i in $(seq 100); do "
                  "p=$(systemctl --user show -p MainPID --value dsv4-itest-decode.service); "
                  "tr '\\0' ' ' < /proc/$p/cmdline | grep -q -- '--watchdog-timeout 1900' "
                  "&& exit 0; sleep 0.1; done; exit 1", check=True)
    env.fake.exec(f"cp /tmp/launch-decode.orig {launch} && rm /tmp/launch-decode.orig",
                  check=True)
    capsys.readouterr()
    # the restarted engine answers before status reads it (/server_info)
    env.fake.exec("for i in $(seq 100); do python3 -c 'import urllib.request as u; "
                  "u.urlopen(\"http://127.0.0.1:30002/server_info\", timeout=2)' 2>/dev/null "
                  "&& exit 0; sleep 0.1; done; exit 1", check=True)
    assert env.cli("status", "--host", "h") == 1  # status sees it
    assert "running command line differs" in capsys.readouterr().out

    rc = env.cli("plan", str(profile), "--host", "h", "--live", "--detailed-exitcode")
    out = capsys.readouterr().out
    assert rc == 2, out  # a drift-only plan has changes
    flat = " ".join(out.split())  # the reason wraps
    assert ("~> dsv4-itest-decode.service (running command line differs from the release "
            "(changed outside dsv4ctl): only running: ['1900']; only in release: ['1800']"
            ) in flat, out
    assert "1 to restart" in out and "Plan: no changes" not in out

    before = {m: env.starts(m) for m in ("prefill", "decode", "router")}
    assert env.cli("apply", str(profile)) == 0
    rec = env.record(env.current())
    assert rec["status"] == "healthy" and rec["restarted_roles"] == ["decode"]  # recorded
    assert {m: env.starts(m) for m in before} == {**before, "decode": before["decode"] + 1}
    capsys.readouterr()
    assert env.cli("status", "--host", "h") == 0, capsys.readouterr().out
    assert env.cli("plan", str(profile), "--host", "h", "--live", "--detailed-exitcode") == 0
