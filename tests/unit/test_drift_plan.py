"""Drift is a change (the planner half): what the host holds outside dsv4ctl is a fact, and the
one transition model turns it into actions with the reason "changed outside dsv4ctl".

The symptoms: `status` reported `bin/launch-decode.sh modified` and exited 1 while
`plan --live --detailed-exitcode` said `Plan: no changes.` (rc 0); there was no way to force a
role's restart; a release directory removed by hand made every command fail.
"""

from __future__ import annotations

import pytest

from orchestrator.errors import RemoteError
from orchestrator.facts import Facts, GpuFact, UnitFact
from orchestrator.planner.build import build_plan, host_transition, load_context
from orchestrator.planner.transition import OUTSIDE, RUNNING, ReleaseFile, transition
from orchestrator.planner_model import count_actions
from orchestrator.remote.drift import RELEASE_DIR, parse_drift, parse_running
from tests.validate.helpers import PROFILES

UNITS = {"units/dsv4-x-decode.service": ("u1", ("decode",)),
         "units/dsv4-x-prefill.service": ("u2", ("prefill",)),
         "bin/launch-decode.sh": ("l1", ("decode",)),
         "bin/launch-prefill.sh": ("l2", ("prefill",)),
         "profile.yaml": ("p", ())}
RELEASE = {p: ReleaseFile(h, r) for p, (h, r) in UNITS.items()}
ACTIVE = {"dsv4-x-decode.service": "active", "dsv4-x-prefill.service": "active"}


def test_no_drift_no_actions() -> None:
    assert transition(RELEASE, RELEASE, ACTIVE) == []


def test_an_edited_launch_file_is_a_change_that_restarts_its_role() -> None:
    acts = transition(RELEASE, RELEASE, ACTIVE, outside={"bin/launch-decode.sh": "modified"})
    [f] = [a for a in acts if a.kind == "change"]
    assert f.target == "bin/launch-decode.sh" and f.reason.startswith(f"{OUTSIDE} (modified)")
    [r] = [a for a in acts if a.kind == "restart"]
    assert r.target == "dsv4-x-decode.service" and OUTSIDE in r.reason
    assert r.downtime == "minutes"


def test_an_edited_installed_unit_restarts_its_role() -> None:
    acts = transition(RELEASE, RELEASE, ACTIVE,
                      outside={"units/dsv4-x-prefill.service": "installed unit modified"})
    assert [(a.kind, a.target) for a in acts] == [
        ("change", "units/dsv4-x-prefill.service"), ("restart", "dsv4-x-prefill.service")]
    assert "installed unit modified" in acts[0].reason


def test_replace_restarts_a_role_nothing_changed_for() -> None:
    acts = transition(RELEASE, RELEASE, ACTIVE, replace=["prefill"])
    assert [(a.kind, a.target, a.reason) for a in acts] == [
        ("restart", "dsv4-x-prefill.service", "replaced on request (--replace)")]
    # a role that restarts anyway is restarted once
    both = transition(RELEASE, RELEASE, ACTIVE, outside={"bin/launch-prefill.sh": "modified"},
                      replace=["prefill"])
    assert [a.kind for a in both].count("restart") == 1


def test_a_missing_release_directory_recreates_every_file() -> None:
    acts = transition({}, RELEASE, ACTIVE, outside={RELEASE_DIR: "missing"})
    creates = [a for a in acts if a.kind == "create"]
    assert len(creates) == len(RELEASE) and all(OUTSIDE in a.reason for a in creates)
    assert {a.target for a in acts if a.kind == "restart"} == set(ACTIVE)


def _facts(**over: object) -> Facts:
    base = dict(source="probed", host="gpu-host",
                gpus=[GpuFact(index=i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                              memory_mib=97887) for i in range(8)])
    return Facts(**{**base, **over})  # type: ignore[arg-type]


def test_plan_lists_drift_of_a_live_host_and_counts_it_as_changes() -> None:
    ctx = load_context(PROFILES / "mxfp4-tp8.yaml", PROFILES / "inventory.yaml")
    empty = build_plan(ctx, _facts())
    files = {f.path: f.sha256 for f in empty.files}
    roles = {f.path: list(f.roles) for f in empty.files if f.roles}
    units = [UnitFact(name=a.target, active="active") for a in empty.actions if a.kind == "start"]
    clean = _facts(current_release="r0001", current_files=files, current_roles=roles, units=units)
    assert build_plan(ctx, clean).actions == []
    drifted = clean.model_copy(update={"drift": {"bin/launch-engine.sh": "modified"}})
    plan = build_plan(ctx, drifted)
    assert plan.has_changes and count_actions(plan.actions)["restart"] == 1
    assert all(OUTSIDE in a.reason for a in plan.actions)
    assert drifted.fingerprint() != clean.fingerprint()  # a saved plan goes stale with drift
    assert host_transition(empty.files, drifted, ["engine"]) == plan.actions  # restarts once


def test_parse_drift_reads_the_probe_and_refuses_what_it_does_not_know() -> None:
    out = ("file\tbin/launch-decode.sh\tmodified\n"
           "file\tunits/u.service\tmodified\nunit\tunits/u.service\tmissing\n")
    assert parse_drift(out) == {"bin/launch-decode.sh": "modified",
                                "units/u.service": "modified; installed unit missing"}
    assert parse_drift("release\t.\tmissing\n") == {RELEASE_DIR: "missing"}
    assert parse_drift("") == {}
    for bad in ("file\t../../etc/passwd\tmodified", "nonsense", "file\tx\tgone"):
        with pytest.raises(RemoteError):
            parse_drift(bad + "\n")


def test_a_running_command_line_that_differs_restarts_its_role_once() -> None:
    running = {"dsv4-x-decode.service": "only running: ['1900']; only in release: ['1800']"}
    acts = transition(RELEASE, RELEASE, ACTIVE, running=running)
    assert [(a.kind, a.target) for a in acts] == [("restart", "dsv4-x-decode.service")]
    assert acts[0].reason == f"{RUNNING}: only running: ['1900']; only in release: ['1800']"
    assert OUTSIDE in acts[0].reason and acts[0].downtime == "minutes"
    # files that change restart it anyway, once, for them; a unit not running is started
    both = transition(RELEASE, RELEASE, ACTIVE, running=running,
                      outside={"bin/launch-decode.sh": "modified"})
    assert [a.kind for a in both].count("restart") == 1 and RUNNING not in both[-1].reason
    down = transition(RELEASE, RELEASE, {**ACTIVE, "dsv4-x-decode.service": "inactive"},
                      running=running)
    assert [(a.kind, a.reason) for a in down] == [("start", "not running")]


def test_plan_compares_the_running_command_line_with_the_release() -> None:
    import shlex

    ctx = load_context(PROFILES / "mxfp4-tp8.yaml", PROFILES / "inventory.yaml")
    empty = build_plan(ctx, _facts())
    files = {f.path: f.sha256 for f in empty.files}
    roles = {f.path: list(f.roles) for f in empty.files if f.roles}
    units = [UnitFact(name=a.target, active="active") for a in empty.actions if a.kind == "start"]
    [unit] = [u.name for u in units if u.name.endswith("-engine.service")]
    launch = next(f.content for f in empty.files if f.path == "bin/launch-engine.sh")
    # what the process runs: the launch script's exec line as bash passes it (line continuations
    # joined), from the probe's first ``--`` flag
    words = shlex.split(launch.split("\nexec ", 1)[1].replace("\\\n", " "))
    words = words[next(i for i, w in enumerate(words) if w.startswith("--")):]
    clean = _facts(current_release="r0001", current_files=files, current_roles=roles,
                   units=units, running={unit: words})
    assert build_plan(ctx, clean).actions == []  # the release's own command line
    i = words.index("--watchdog-timeout")
    other = clean.model_copy(update={"running": {unit: [*words[:i + 1], "1900",
                                                        *words[i + 2:]]}})
    plan = build_plan(ctx, other)
    assert plan.has_changes and [(a.kind, a.target) for a in plan.actions] == [("restart", unit)]
    assert plan.actions[0].reason.startswith(RUNNING) and "'1900'" in plan.actions[0].reason
    assert other.fingerprint() != clean.fingerprint()  # a saved plan goes stale with it


def test_parse_running_reads_the_probe_and_refuses_what_it_does_not_know() -> None:
    out = ('file\tbin/launch-decode.sh\tmodified\n'
           'cmdline\tunits/dsv4-x-decode.service\t["--port", "30002"]\n')
    assert parse_running(out) == {"dsv4-x-decode.service": ["--port", "30002"]}
    assert parse_drift(out) == {"bin/launch-decode.sh": "modified"}
    for bad in ('cmdline\tunits/../x\t[]', 'cmdline\tbin/x\t[]', 'cmdline\tunits/u\t{"a": 1}',
                'cmdline\tunits/u\t[1]', 'cmdline\tunits/u\tnot json', 'cmdline\tunits/u'):
        with pytest.raises(RemoteError):
            parse_running(bad + "\n")
