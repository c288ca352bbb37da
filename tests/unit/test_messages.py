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
from orchestrator.planner.report import render_text
from tests.unit.test_planner_fuzz import profiles

PROFILES = data_dir("profiles")
TP8 = yaml.safe_load((PROFILES / "mxfp4-tp8.yaml").read_text())
OUTSIDE = re.compile(r"design\.md|research/\w")
REPR = re.compile(r"\bNone\b|\['|\{'|<[a-z_.]+ object")


def _plan(tmp_path: Path, profile: dict, inventory: str | None = None):
    (tmp_path / "inventory.yaml").write_text(inventory or (PROFILES / "inventory.yaml").read_text())
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    return build_plan(load_context(tmp_path / "p.yaml", None))


def _tp8_no_attn_dp(attention: str) -> dict:
    p = yaml.safe_load(yaml.safe_dump(TP8))
    p["topology"]["engine"]["attn_dp"] = 1
    p["kernels"] = {"attention": attention}
    return p


def test_tp8_without_attention_dp_takes_the_bundled_attention_and_says_why(tmp_path: Path) -> None:
    # auto: FlashInfer's prefill aborts at 8 heads per rank (sglang PR 38969), so the colocated
    # TP8 engine renders the bundled attention path, and the plan gives the limit and its source
    plan = _plan(tmp_path, _tp8_no_attn_dp("auto"))
    (att,) = [p for r in plan.deployment.roles for p in r.kernels if p.op == "attention"]
    assert att.path == "bundled" and "8 heads per rank" in att.why
    assert "https://github.com/sgl-project/sglang/pull/38969" in att.why
    assert "deepseek_v4_backend.py" in att.source
    env = next(f.content for f in plan.files if f.path == "env/engine.env")
    assert 'SGLANG_SM120_FLASHMLA_BACKEND="triton"' in env and "attention" in env
    assert not [c for c in plan.checks if c.id == "kernels.engine-path-unsupported"]
    text = render_text(plan)
    assert "engine attention: the engine's path cannot serve this role" in text
    # kept on the engine on purpose: a warning whose fix a profile can say
    forced = _plan(tmp_path, _tp8_no_attn_dp("engine"))
    (warn,) = [c for c in forced.checks if c.id == "kernels.engine-path-unsupported"]
    assert "kernels.attention: auto" in warn.fix and "attn_dp" in warn.fix
    assert "FLASHMLA" not in next(f.content for f in forced.files if f.path == "env/engine.env")


def test_tp8_with_attention_dp_keeps_flashinfer(tmp_path: Path) -> None:
    p = _tp8_no_attn_dp("auto")
    p["topology"]["engine"]["attn_dp"] = 8  # 64 heads per rank
    plan = _plan(tmp_path, p)
    (att,) = [p for r in plan.deployment.roles for p in r.kernels if p.op == "attention"]
    assert att.path == "engine"


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
    assert "set moe.runner_backend: flashinfer_cutlass (of" in out  # the one meant
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
    from orchestrator.errors import fix_text, set_to

    for engine in load_catalog().engines:
        for kb in engine.known_bad:
            said = fix_text([set_to(k, v) for k, v in kb.change.items()], kb.fix) \
                if kb.change else kb.fix
            assert any(f in said for f in fields), (kb.id, said)
            assert not said.startswith(("use --", "render --", "leave --", "set SGLANG_")), kb.id
