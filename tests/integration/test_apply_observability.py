"""Issue 6 items 3-4 wired into apply (issue 4), against a fake host (real sshd, `systemd --user`,
the engine simulator behind the units).

Owns the end-to-end proof that: an apply with ``health.qualify`` stores the qualification outcome
in the release record and ``dsv4ctl history`` (text and --json) shows its figures; a qualification
that fails (the new decode's simulator loses recall beyond 2,000 tokens) rolls back and the failed
release's record and history say why; after every apply and rollback the node-exporter textfile
``<monitoring.textfile_dir>/dsv4ctl-<deployment>.prom`` is on the host, passes ``promtool check
metrics`` and names the release and result; ``dsv4ctl status --format prometheus`` does too; and a
textfile that cannot be written is a warning, never a failed operation. Reuses test_apply's fake-host
fixture and helpers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.errors import ExitCode
from orchestrator.profile import load_text
from orchestrator.profile.schema import Profile
from tests.integration import test_apply
from tests.integration.test_apply import ROOT, Env, journal, profile_dict, rule

pytestmark = pytest.mark.integration
TEXTFILE_DIR = f"{ROOT}/node-exporter"  # not there yet: apply creates it
PROM = f"{TEXTFILE_DIR}/dsv4ctl-itest.prom"
NEED_RECALL = 4000
env = test_apply.env  # the clean fake-host fixture of test_apply, registered here under its name


def promtool_check(text: str) -> None:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not installed: apt-get install prometheus "
                    "(listed in requirements/apt-monitoring.txt)")
    res = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def qualified_profile(decode_bs: int | None = None) -> Profile:
    d: dict[str, Any] = profile_dict()
    d["monitoring"] = {"textfile_dir": TEXTFILE_DIR}
    d["health"]["qualify"] = {"min_recall_tokens": NEED_RECALL, "min_output_tok_s": 1.0,
                              "load_concurrency": 2, "load_duration_s": 1.0,
                              "on_fail": "rollback"}
    if decode_bs is not None:  # only decode's files change, so only decode restarts
        d["topology"]["decode"]["cuda_graph_max_bs"] = decode_bs
    return load_text(Profile, yaml.safe_dump(d), "profile.yaml")


def test_qualification_figures_textfile_and_status(env: Env,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # this test reads history's lines whole
    dep = (("deployment", "itest"),)
    # 1. a qualified apply: figures in the record, textfile written
    assert env.apply(qualified_profile(), name="q1.json") == 0
    r1 = env.current()
    assert r1 is not None
    assert f"metrics textfile: {PROM}" in capsys.readouterr().out
    q1 = env.record(r1)["qualification"]
    assert q1["passed"] is True and q1["figures"]["recall_full_tokens"] >= NEED_RECALL
    assert q1["figures"]["load_output_tok_s"] > 1.0 and "load_ttft_s_p50" in q1["figures"]
    text = env.fake.read(PROM)
    promtool_check(text)
    s = samples(text)
    assert s[("dsv4ctl_release_info", (*dep, ("profile", "itest"), ("release", r1),
                                       ("result", "success")))] == 1
    assert s[("dsv4ctl_active_release_info", (*dep, ("profile", "itest"),
                                              ("release", r1)))] == 1
    assert s[("dsv4ctl_last_qualify_passed", dep)] == 1
    assert s[("dsv4ctl_last_qualify_figure", (*dep, ("figure", "recall_full_tokens")))] == \
        q1["figures"]["recall_full_tokens"]
    assert 0 < s[("dsv4ctl_last_health_check_duration_seconds", (*dep, ("role", "all")))] \
        < s[("dsv4ctl_last_apply_duration_seconds", dep)]

    # 2. the new decode loses recall beyond 2,000 tokens: qualification fails, rolled back
    env.fake.write_sim_control(rule("--cuda-graph-max-bs-decode 32",
                                    {"recall_horizon_tokens": 2000}))
    assert env.apply(qualified_profile(decode_bs=32), name="q2.json") == ExitCode.ROLLED_BACK
    env.assert_recovered(r1)
    r2 = next(r for r in env.releases() if r != r1)
    rec2 = env.record(r2)
    assert rec2["status"] == "rolled-back" and journal(rec2)["qualify"] == "failed"
    q2 = rec2["qualification"]
    assert q2["passed"] is False
    assert q2["figures"]["recall_full_tokens"] < NEED_RECALL
    assert "recall: full recall only up to" in q2["reason"]
    assert f"{NEED_RECALL} required" in q2["reason"]
    s = samples(text := env.fake.read(PROM))
    promtool_check(text)
    assert s[("dsv4ctl_release_info", (*dep, ("profile", "itest"), ("release", r2),
                                       ("result", "rolled_back")))] == 1
    assert s[("dsv4ctl_active_release_info", (*dep, ("profile", "itest"),
                                              ("release", r1)))] == 1
    assert s[("dsv4ctl_last_qualify_passed", dep)] == 0
    assert s[("dsv4ctl_rollbacks_total", dep)] == 1
    assert s[("dsv4ctl_applies_total", (*dep, ("result", "success")))] == 1

    # 3. history: the figures per release and why r2 failed; --json carries all figures
    capsys.readouterr()
    assert env.cli("history", "--host", "h") == 0
    out = capsys.readouterr().out.splitlines()
    row1 = out.index(next(line for line in out if line[2:].startswith(r1)))
    row2 = out.index(next(line for line in out if line[2:].startswith(r2)))
    assert out[row1 + 1].strip().startswith(
        f"qualify PASS: recall {q1['figures']['recall_full_tokens']}/{NEED_RECALL} tok, ")
    assert "tok/s" in out[row1 + 1] and "TTFT p50/p99" in out[row1 + 1]
    assert out[row2 + 1].strip().startswith(
        f"qualify FAIL: recall {q2['figures']['recall_full_tokens']}/{NEED_RECALL} tok")
    assert "-- recall: full recall only up to" in out[row2 + 1]
    assert out[row2 + 2].strip() == "failed at qualify (why: the qualify line above)"
    assert env.cli("history", "--host", "h", "--json") == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[r1]["qualification"] == q1 and rows[r2]["qualification"] == q2

    # 4. status --format prometheus: the same metrics plus live role health
    assert env.cli("status", "--host", "h", "--format", "prometheus") == 0
    text = capsys.readouterr().out
    promtool_check(text)
    s = samples(text)
    for role in ("prefill", "decode", "router"):
        assert s[("dsv4ctl_role_healthy", (*dep, ("role", role)))] == 1
    assert s[("dsv4ctl_active_release_info", (*dep, ("profile", "itest"),
                                              ("release", r1)))] == 1
    assert env.cli("status", "--host", "h", "--format", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["current"] == r1 and doc["healthy"] is True and doc["deployment"] == "itest"

    # 5. a textfile that cannot be written is a warning; the rollback itself succeeds
    env.fake.exec(f"rm -rf {TEXTFILE_DIR} && touch {TEXTFILE_DIR}", check=True)
    assert env.cli("rollback", r1, "--host", "h") == 0
    out = capsys.readouterr().out
    assert f"warning: could not write dsv4ctl's metrics textfile {PROM}" in out
    assert "Rolled back:" in out
    env.assert_recovered(r1)
