"""dsv4ctl's own metrics (orchestrator.monitoring.selfmetrics): values, determinism, validation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.errors import DsvError
from orchestrator.monitoring import selfmetrics
from orchestrator.monitoring.selfmetrics import ReleaseMetrics, status_text, textfile_for

OLD = ReleaseMetrics("default", "r1", "profiles/default.yaml", 1000.0, 600.0, "success",
                     {"prefill": 300.0, "decode": 280.0}, active=True, qualify_passed=True,
                     qualify_figures={"load_output_tok_s": 512.5, "chat_reasoning": "pass",
                                      "recall_full_tokens": 8000})
NEW = ReleaseMetrics("default", "r2", "profiles/default.yaml", 2000.0, 90.0, "rolled_back",
                     {"prefill": 45.0}, rollbacks=1, qualify_passed=False,
                     qualify_figures={"load_output_tok_s": 120.0})
OTHER = ReleaseMetrics("tp8", "x1", "profiles/mxfp4-tp8.yaml", 1500.0, 700.0, "success",
                       {"engine": 650.0}, active=True)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(s: dict, name: str, **labels: str) -> float:
    return s[(name, tuple(sorted(labels.items())))]


def test_latest_record_drives_last_metrics() -> None:
    s = samples(textfile_for([NEW, OLD, OTHER]))
    assert get(s, "dsv4ctl_release_info", deployment="default", release="r2",
               profile="profiles/default.yaml", result="rolled_back") == 1
    assert get(s, "dsv4ctl_active_release_info", deployment="default", release="r1",
               profile="profiles/default.yaml") == 1
    assert get(s, "dsv4ctl_last_apply_timestamp_seconds", deployment="default") == 2000.0
    assert get(s, "dsv4ctl_last_apply_duration_seconds", deployment="default") == 90.0
    assert get(s, "dsv4ctl_last_apply_success", deployment="default") == 0
    assert get(s, "dsv4ctl_last_apply_success", deployment="tp8") == 1
    assert get(s, "dsv4ctl_last_apply_result", deployment="default", result="rolled_back") == 1
    assert get(s, "dsv4ctl_last_apply_result", deployment="default", result="success") == 0
    assert get(s, "dsv4ctl_last_health_check_duration_seconds", deployment="default",
               role="prefill") == 45.0
    assert ("dsv4ctl_last_health_check_duration_seconds",
            (("deployment", "default"), ("role", "decode"))) not in s  # from the older record
    assert get(s, "dsv4ctl_last_qualify_passed", deployment="default") == 0
    assert get(s, "dsv4ctl_last_qualify_figure", deployment="default",
               figure="load_output_tok_s") == 120.0
    assert get(s, "dsv4ctl_applies_total", deployment="default", result="success") == 1
    assert get(s, "dsv4ctl_applies_total", deployment="default", result="rolled_back") == 1
    assert get(s, "dsv4ctl_rollbacks_total", deployment="default") == 1
    assert get(s, "dsv4ctl_rollbacks_total", deployment="tp8") == 0


def test_non_numeric_figures_are_left_out() -> None:
    s = samples(textfile_for([OLD]))
    figs = {dict(k[1])["figure"] for k in s if k[0] == "dsv4ctl_last_qualify_figure"}
    assert figs == {"load_output_tok_s", "recall_full_tokens"}


def test_output_is_deterministic_and_order_free() -> None:
    a = textfile_for([OLD, NEW, OTHER])
    assert a == textfile_for([OTHER, NEW, OLD])
    assert "_created" not in a  # no creation timestamps: same records, same bytes


def test_textfile_matches_write_to_textfile(tmp_path: Path) -> None:
    """Same encoder as prometheus_client.write_to_textfile (what node-exporter reads)."""
    fams = selfmetrics._families([OLD, NEW])
    reg = CollectorRegistry(auto_describe=False)
    reg.register(selfmetrics._Families(fams))
    path = tmp_path / "dsv4ctl-default.prom"
    write_to_textfile(str(path), reg)
    assert path.read_text() == textfile_for([OLD, NEW])
    assert not [p for p in os.listdir(tmp_path) if p != path.name]


def test_status_adds_live_role_health() -> None:
    s = samples(status_text([OLD], {"default": {"prefill": True, "decode": False}}))
    assert get(s, "dsv4ctl_role_healthy", deployment="default", role="prefill") == 1
    assert get(s, "dsv4ctl_role_healthy", deployment="default", role="decode") == 0
    assert get(s, "dsv4ctl_last_apply_success", deployment="default") == 1


def test_empty_history_is_valid_text() -> None:
    text = textfile_for([])
    assert samples(text) == {}
    assert "# TYPE dsv4ctl_last_apply_success gauge" in text


@pytest.mark.parametrize("kw", [{"apply_duration_s": -1.0}, {"finished_at": float("nan")},
                                {"result": "exploded"}, {"release_id": ""},
                                {"health_check_durations_s": {"decode": float("inf")}},
                                {"rollbacks": -2}])
def test_bad_records_are_refused_with_a_clear_error(kw: dict) -> None:
    base = {"deployment": "d", "release_id": "r", "profile": "p", "finished_at": 1.0,
            "apply_duration_s": 1.0, "result": "success"}
    with pytest.raises(DsvError) as exc:
        ReleaseMetrics(**{**base, **kw})
    assert "cannot be exported as metrics" in exc.value.message
