"""Calibration (issue 22): SGLang 0.5.23's pool reports parsed, the host file, and a plan that
predicts the measured pool from the host's last measurement, showing the term it applies."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from orchestrator import calibration as C
from orchestrator.errors import DsvError
from orchestrator.facts import PoolMeasurement, declared_facts
from orchestrator.paths import data_dir
from orchestrator.planner.build import build_plan, load_context
from orchestrator.planner.explain import render_explain
from orchestrator.planner.report import render_markdown, render_text
from tests.parsers_real.sglang_pool_oracle import sglang_root

PROFILES = data_dir("profiles")
LOG = """\
[2026-12-01 14:02:11 TP0] Load weight end. type=DeepseekV4ForCausalLM, avail mem=55.12 GB
[2026-12-01 14:02:40 TP0] max_total_num_tokens=6068736, chunked_prefill_size=8192, \
max_prefill_tokens=16384, max_running_requests=64, context_len=1048576, available_gpu_mem=11.42 GB
[2026-12-01 15:10:02 TP0] max_total_num_tokens=4247808, chunked_prefill_size=8192, \
max_prefill_tokens=16384, max_running_requests=64, context_len=1048576, available_gpu_mem=12.01 GB
"""


def test_the_log_line_format_is_sglang_0523s() -> None:
    """The regex matches what scheduler.py's f-string produces (read from the installed code)."""
    text = (sglang_root() / "srt/managers/scheduler.py").read_text()
    at = text.index('f"max_total_num_tokens={self.max_total_num_tokens}, "')
    block = text[at:text.index(")\n", at)]
    parts = re.findall(r'f"([^"]*)"', block)
    fmt = "".join(parts)
    # evaluate the f-string pieces with sample values, as sglang does
    values = {"self.max_total_num_tokens": 123, "get_schedule().chunked_prefill_size": 8192,
              "self.max_prefill_tokens": 16384, "self.max_running_requests": 64,
              "self.model_config.context_len": 1048576,
              "'available_cpu_mem' if self.device == 'cpu' else 'available_gpu_mem'":
                  "available_gpu_mem",
              "self.startup_available_gpu_memory_gb:.2f": "11.42"}
    line = fmt
    for k, v in values.items():
        line = line.replace("{" + k + "}", str(v))
    assert "{" not in line, line
    (got,) = C.parse_scheduler_lines("[2026-12-01 14:02:40 TP0] " + line)
    assert (got.max_total_num_tokens, got.chunked_prefill_size, got.max_running_requests,
            got.context_len, got.available_gpu_mem_gib) == (123, 8192, 64, 1048576, 11.42)


def test_last_line_of_an_appended_log_wins_and_a_log_without_one_is_refused() -> None:
    assert C.last_scheduler_line(LOG, where="x.log").max_total_num_tokens == 4247808
    with pytest.raises(DsvError) as exc:
        C.last_scheduler_line("Load weight end.\n", where="x.log")
    assert "x.log" in str(exc.value) and "max_total_num_tokens=N" in str(exc.value)


def test_server_info_fields_are_the_schedulers() -> None:
    """/server_info carries the scheduler's init info (get_init_info) and the version."""
    text = (sglang_root() / "srt/managers/scheduler.py").read_text()
    tree = ast.parse(text)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
              and n.name == "get_init_info")
    assert '"max_total_num_tokens": self.max_total_num_tokens' in ast.get_source_segment(text, fn)
    assert C.server_info_pool({"max_total_num_tokens": 42, "version": "0.5.23"}) == (42, "0.5.23")
    assert C.server_info_pool({"max_total_num_tokens": 0}) == (None, None)
    assert C.server_info_pool(None) == (None, None)


def _meas(role: str, measured: int, model: int, bpt: float, when: str = "2026-12-01T15:00:00Z",
          version: str = "0.5.23") -> PoolMeasurement:
    return PoolMeasurement(role=role, engine_version=version, model_variant="dsv4-flash-nvfp4",
                           measured_tokens=measured, model_tokens=model, predicted_tokens=model,
                           bytes_per_token=bpt, source="server_info", release="r0001",
                           measured_at=when)


def test_file_keeps_the_last_measurement_per_role_version_model() -> None:
    a = _meas("prefill", 100, 200, 7000.0, "2026-12-01T10:00:00Z")
    b = _meas("prefill", 150, 200, 7000.0, "2026-12-01T11:00:00Z")
    c = _meas("prefill", 120, 200, 7000.0, "2026-12-01T12:00:00Z", version="0.5.24")
    text = C.render_file(C.merge([a], [b, c]))
    got = C.parse_file(text, where="calibration.json")
    assert [m.measured_tokens for m in got] == [150, 120]
    assert C.lookup(got, "prefill", "0.5.23", "dsv4-flash-nvfp4") == b
    assert C.lookup(got, "decode", "0.5.23", "dsv4-flash-nvfp4") is None
    with pytest.raises(DsvError) as exc:
        C.parse_file('{"format": 1, "measurements": [{"role": 1}]}', where="c.json")
    assert "calibrate --host HOST --reset" in exc.value.fix


def _plans(measured_factor: float) -> tuple[object, object]:
    ctx = load_context(PROFILES / "default.yaml", None)
    facts = declared_facts(ctx.host_name, ctx.host)
    p0 = build_plan(ctx, facts)
    meas = [_meas(c.role, int(c.max_total_tokens_per_rank * measured_factor) // 256 * 256,
                  c.max_total_tokens_per_rank, c.bytes_per_token) for c in p0.capacity]
    return p0, build_plan(ctx, facts.model_copy(update={"calibration": meas}))


def test_plan_predicts_the_measured_pool_within_one_percent_and_says_so() -> None:
    p0, p1 = _plans(0.7)
    for c0, c1 in zip(p0.capacity, p1.capacity, strict=True):
        measured = int(c0.max_total_tokens_per_rank * 0.7) // 256 * 256
        assert abs(c1.max_total_tokens_per_rank - measured) / measured < 0.01
        assert c1.model_tokens_per_rank == c0.max_total_tokens_per_rank
        assert c1.calibration_bytes == round((c0.max_total_tokens_per_rank - measured)
                                             * c0.bytes_per_token)
        assert c1.calibrated and "calibrated from host gpu-host" in c1.calibrated
    text = render_text(p1)
    assert "prefill: calibrated from host gpu-host's measurement (sglang 0.5.23" in text
    assert "KV pool of decode calibrated" in render_markdown(p1)
    ids = {(c.id, c.subject) for c in p1.checks}
    assert ("capacity.calibrated", "prefill") in ids and ("capacity.calibrated", "decode") in ids
    # the reset it offers is of this host, runnable as printed (not `--host HOST`)
    assert all("`dsv4ctl calibrate --host gpu-host --reset`" in (c.fix or "")
               for c in p1.checks if c.id == "capacity.calibrated")
    # the term is a line of the memory arithmetic, and the rows still add up to the card
    ex = render_explain(p1)
    assert "calibration: measured on the host, not in the model" in ex and "= GPU capacity" in ex


def test_more_room_than_predicted_calibrates_upwards() -> None:
    p0, p1 = _plans(1.1)
    for c0, c1 in zip(p0.capacity, p1.capacity, strict=True):
        measured = int(c0.max_total_tokens_per_rank * 1.1) // 256 * 256
        assert abs(c1.max_total_tokens_per_rank - measured) / measured < 0.01
        assert c1.calibration_bytes < 0 and "more than the model expected" in c1.calibrated


def test_another_engine_version_is_not_used_and_fingerprints_stay_when_uncalibrated() -> None:
    ctx = load_context(PROFILES / "default.yaml", None)
    facts = declared_facts(ctx.host_name, ctx.host)
    other = facts.model_copy(update={"calibration": [_meas("prefill", 1000, 2000, 7000.0,
                                                           version="0.5.24")]})
    p = build_plan(ctx, other)
    assert not any(c.calibrated for c in p.capacity)
    assert other.fingerprint() != facts.fingerprint()
    assert facts.fingerprint() == declared_facts(ctx.host_name, ctx.host).fingerprint()


def test_sim_reports_the_log_line_sglang_writes(tmp_path: Path) -> None:
    from tests.sim import engine as sim

    args, _ = sim.build_parser().parse_known_args(
        ["--model-path", "/m", "--port", "1", "--chunked-prefill-size", "8192"])
    e = sim.Engine(args, [], [], {**sim.control.DEFAULTS, "pool_tokens": 4247808}, tmp_path)
    (line,) = C.parse_scheduler_lines(e.scheduler_line())
    assert line.max_total_num_tokens == 4247808 == e.server_info()["max_total_num_tokens"]


def test_metrics_carry_predicted_and_measured_pool() -> None:
    from orchestrator.monitoring.selfmetrics import ReleaseMetrics, textfile_for

    old = ReleaseMetrics(deployment="d", release_id="r0001", profile="p", finished_at=1.0,
                         apply_duration_s=1.0, result="success",
                         pool_tokens={"prefill": (100, 90)})
    new = ReleaseMetrics(deployment="d", release_id="r0002", profile="p", finished_at=2.0,
                         apply_duration_s=1.0, result="success", active=True,
                         pool_tokens={"prefill": (6068736, 4247808), "decode": (5, 4)})
    text = textfile_for([old, new])
    assert ('dsv4ctl_kv_pool_tokens{deployment="d",kind="predicted",role="prefill"} 6.068736e+06'
            in text)
    assert 'dsv4ctl_kv_pool_tokens{deployment="d",kind="measured",role="prefill"} 4.247808e+06' \
        in text
    assert 'kind="measured",role="decode"} 4.0' in text


def test_the_engines_free_memory_after_start_is_set_beside_the_models() -> None:
    ctx = load_context(PROFILES / "default.yaml", None)
    facts = declared_facts(ctx.host_name, ctx.host)
    p0 = build_plan(ctx, facts)
    c0 = p0.capacity[0]
    m = _meas(c0.role, c0.max_total_tokens_per_rank, c0.max_total_tokens_per_rank,
              c0.bytes_per_token).model_copy(update={"available_gpu_mem_gib": 11.42})
    p1 = build_plan(ctx, facts.model_copy(update={"calibration": [m]}))
    c1 = p1.capacity[0]
    graphs = next(t.bytes for t in c1.headroom_terms if t.id == "cuda_graphs")
    assert c1.calibration_bytes == 0  # measured == predicted: a zero term, still shown
    assert (f"after its start the engine reported 11.42 GiB free where the headroom model expects "
            f"{(c1.headroom_bytes - graphs) / 2**30:.2f} GiB") in (c1.calibrated or "")
