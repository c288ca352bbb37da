"""Calibration end to end (issue 22): an engine whose KV pool lands 30% below the prediction.

Real sshd + `systemd --user` + the engine simulator, told (control switch `pool_factor`) to
allocate 70% of the pool the release's plan predicts, as a real engine can. Apply measures it
(`/server_info` and the scheduler's startup line in the role's log): the record and `history`
show predicted and measured side by side, dsv4ctl's metrics carry both, `status` flags the
drift, and the next `plan --live` predicts the measured pool within 1% and says it is
calibrated. `calibrate --reset` returns the plan to the model alone; `calibrate --from-log` feeds
a measurement by hand.
"""

from __future__ import annotations

import re

import pytest

from tests.integration.test_apply import ROOT, Env, env  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_pool_30pct_below_is_recorded_flagged_and_calibrated(
        env: Env, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # the assertions read whole lines of status output
    prof = env.profile()
    plan0 = env.plan(prof)
    predicted = {c.role: c.max_total_tokens_per_rank for c in plan0.capacity}
    assert set(predicted) == {"prefill", "decode"} and all(predicted.values())
    assert not any(c.calibrated for c in plan0.capacity)
    env.fake.write_sim_control({"by_mode": {"prefill": {"pool_factor": 0.7},
                                            "decode": {"pool_factor": 0.7}}})
    assert env.cli("apply", str(env.save(plan0))) == 0
    rel = env.current()
    assert rel is not None
    measured = {r: int(t * 0.7) // 256 * 256 for r, t in predicted.items()}

    # the record: predicted and measured side by side, from /server_info and the log line
    rec = env.record(rel)
    assert rec["status"] == "healthy"
    pool = {m["role"]: m for m in rec["pool"]}
    for role in ("prefill", "decode"):
        assert pool[role]["predicted_tokens"] == predicted[role]
        assert pool[role]["measured_tokens"] == measured[role]
        assert pool[role]["source"] == "server_info + log"
        assert pool[role]["available_gpu_mem_gib"] == 11.42
        assert pool[role]["release"] == rel
    step = next(e for e in rec["journal"] if e["step"] == "measure")
    assert step["result"] == "ok" and "(-30.0%)" in step["detail"]

    capsys.readouterr()
    assert env.cli("history", "--host", "h") == 0
    out = capsys.readouterr().out
    for role in ("prefill", "decode"):
        assert (f"pool {role}: predicted {predicted[role]:,}, measured {measured[role]:,} "
                "tokens per rank (-30.0%") in out

    # status flags the drift (exit 1), in text, json and dsv4ctl's own metrics
    assert env.cli("status", "--host", "h") == 1
    out = capsys.readouterr().out
    assert (f"drift (pool): prefill: the engine's KV pool is {measured['prefill']:,} tokens per "
            f"rank, the plan predicted {predicted['prefill']:,} (-30.0%, threshold 5%)") in out
    assert "drift (pool): decode:" in out and "no drift" not in out
    assert env.cli("status", "--host", "h", "--format", "prometheus") == 1
    out = capsys.readouterr().out
    for role in ("prefill", "decode"):
        for kind, value in (("predicted", predicted[role]), ("measured", measured[role])):
            sample = f'dsv4ctl_kv_pool_tokens{{deployment="itest",kind="{kind}",role="{role}"}} '
            m = re.search(re.escape(sample) + r"(\S+)", out)
            assert m and float(m.group(1)) == value, (kind, role)

    # the next plan for the host is calibrated: within 1% of the measured pool, and says so
    prof_file = env.profile_file(prof, "p.yaml")
    assert env.cli("plan", str(prof_file), "--host", "h", "--live") == 0
    out = capsys.readouterr().out
    assert "prefill: calibrated from host h's measurement (sglang 0.5.23" in out
    assert "decode: calibrated from host h's measurement" in out
    plan1 = env.plan(prof)
    for c in plan1.capacity:
        assert abs(c.max_total_tokens_per_rank - measured[c.role]) / measured[c.role] < 0.01
        assert c.model_tokens_per_rank == predicted[c.role] and c.calibration_bytes > 0
        assert c.calibrated is not None and f"release {rel}" in c.calibrated

    # reset: back to the model alone
    assert env.cli("calibrate", "--host", "h", "--reset") == 0
    assert "calibration removed" in capsys.readouterr().out
    plan2 = env.plan(prof)
    assert {c.role: c.max_total_tokens_per_rank for c in plan2.capacity} == predicted
    assert not any(c.calibrated for c in plan2.capacity)

    # by hand, from an engine log (a host whose engine dsv4ctl did not start)
    log = env.tmp / "prefill.log"
    log.write_text(env.fake.read(f"{ROOT}/logs/prefill.log"))
    assert env.cli("calibrate", "--host", "h", "--from-log", str(log), "--role", "prefill",
                   "--profile", str(prof_file)) == 0
    out = capsys.readouterr().out
    assert f"measured {measured['prefill']:,} tokens per rank" in out and "(-30.0%)" in out
    plan3 = env.plan(prof)
    by = {c.role: c for c in plan3.capacity}
    assert abs(by["prefill"].max_total_tokens_per_rank - measured["prefill"]) \
        / measured["prefill"] < 0.01
    assert f"log {log}" in (by["prefill"].calibrated or "")
    assert by["decode"].calibrated is None  # only the role the log came from
