"""What the checks tell the operator: fixes they can apply with this tool, no files outside the
repository, one finding per mistake, a did-you-mean instead of a list printed twice, no Python reprs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from orchestrator.cli import main
from orchestrator.errors import DsvError
from orchestrator.paths import data_dir
from orchestrator.planner.build import build_plan, load_context
from tests.unit.test_planner_fuzz import profiles

PROFILES = data_dir("profiles")
TP8 = yaml.safe_load((PROFILES / "mxfp4-tp8.yaml").read_text())
OUTSIDE = re.compile(r"design\.md|research/\w")
REPR = re.compile(r"\bNone\b|\['|\{'|<[a-z_.]+ object")


def _plan(tmp_path: Path, profile: dict, inventory: str | None = None):
    (tmp_path / "inventory.yaml").write_text(inventory or (PROFILES / "inventory.yaml").read_text())
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    return build_plan(load_context(tmp_path / "p.yaml", None))


def _tp8_no_attn_dp(kernels: bool) -> dict:
    p = yaml.safe_load(yaml.safe_dump(TP8))
    p["topology"]["engine"]["attn_dp"] = 1
    p["kernels"] = {**p.get("kernels", {}), "enabled": kernels}
    return p


def test_tp8_warning_only_when_the_engine_really_gets_the_crashing_backend(tmp_path: Path) -> None:
    # kernels on: render sets SGLANG_SM120_FLASHMLA_BACKEND=triton itself, so no warning
    on = _plan(tmp_path, _tp8_no_attn_dp(True))
    assert not [c for c in on.checks if c.id == "known-bad.tp8-sparse-mla-prefill-crash-sm120"]
    off = _plan(tmp_path, _tp8_no_attn_dp(False))
    (warn,) = [c for c in off.checks if c.id == "known-bad.tp8-sparse-mla-prefill-crash-sm120"]
    # the fix is something a profile can say (the env var is reserved while kernels are enabled)
    assert "kernels.enabled: true" in warn.fix and "attn_dp" in warn.fix
    assert not warn.fix.startswith("set SGLANG_SM120_FLASHMLA_BACKEND")


def test_an_inventory_typo_is_reported_once(tmp_path: Path) -> None:
    inv = (PROFILES / "inventory.yaml").read_text().replace("rtx-pro-6000-se", "rtx-pro-6000-sx")
    plan = _plan(tmp_path, yaml.safe_load((PROFILES / "default.yaml").read_text()), inv)
    (c,) = [c for c in plan.checks if c.id == "host.gpu-unknown"]
    assert "GPUs 0, 1, 2, 3, 4, 5, 6, 7" in c.message and "did you mean 'rtx-pro-6000-se'?" in c.fix


def test_a_runner_typo_gets_a_did_you_mean_not_22_choices_twice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (PROFILES / "default.yaml").read_text().replace(
        "runner_backend: flashinfer_cutlass", "runner_backend: flashinfer_cutlas")
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    (tmp_path / "p.yaml").write_text(text)
    assert main(["plan", str(tmp_path / "p.yaml")]) == 1
    out = capsys.readouterr().out
    assert "did you mean 'flashinfer_cutlass'?" in out
    assert out.count("triton_kernel") == 0 and out.count("flashinfer_cutlas'") == 1
    assert "engine.moe-runner-unknown" not in out  # the same typo, not a second finding


@pytest.mark.parametrize("old,new,said", [
    ("mode: pd", "mode: pdd", "did you mean 'pd'?"),
    ("transfer_backend: mooncake_tcp", "transfer_backend: mooncak_tcp",
     "did you mean 'mooncake_tcp'?"),
])
def test_schema_enum_errors_say_did_you_mean_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 old: str, new: str, said: str) -> None:
    text = (PROFILES / "default.yaml").read_text().replace(old, new)
    (tmp_path / "p.yaml").write_text(text)
    assert main(["validate", str(tmp_path / "p.yaml")]) == 1
    err = capsys.readouterr().err
    line = next(i + 1 for i, ln in enumerate(text.splitlines()) if new in ln)
    assert f"p.yaml:{line}:" in err and said in err
    assert "Input should be" not in err and "Input tag" not in err and not REPR.search(err)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(profiles())
def test_no_check_points_outside_the_repository_or_prints_a_repr(tmp_path_factory,
                                                                 profile: dict) -> None:
    d: Path = tmp_path_factory.mktemp("msg")
    try:
        plan = _plan(d, profile)
    except DsvError as exc:
        text = exc.render()
        assert not OUTSIDE.search(text), text
        assert not REPR.search(text), text
        return
    for c in plan.checks:
        for text in (c.message, c.fix or "", c.source or ""):
            assert not OUTSIDE.search(text), (c.id, text)
        for text in (c.message, c.fix or ""):
            assert not REPR.search(text), (c.id, text)


def test_every_known_bad_fix_is_said_in_profile_terms() -> None:
    """A fix names what to write in the profile (or inventory), not an engine flag or environment
    variable the operator has no way to set through dsv4ctl."""
    from orchestrator.catalog import load_catalog

    fields = ("moe.", "attention.", "model.", "topology.", "kernels.", "serving.", "extra_args",
              "attn_dp", "inventory", "none known")
    for engine in load_catalog().engines:
        for kb in engine.known_bad:
            assert any(f in kb.fix for f in fields), (kb.id, kb.fix)
            assert not kb.fix.startswith(("use --", "render --", "leave --", "set SGLANG_")), kb.id
