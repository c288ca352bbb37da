"""`dsv4ctl validate` is the static half of `plan`: what needs no host is reported by both, in the
same words, at the YAML location of the field (file:line:col)."""

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
from orchestrator.planner.static import check_profile
from tests.unit.test_planner_fuzz import profiles

PROFILES = data_dir("profiles")
DEFAULT = (PROFILES / "default.yaml").read_text()

# checks that need the host (its GPUs' architecture or count, disks, ports in use, host keys)
HOST_ONLY = {"engine.moe-runner", "engine.moe-runner-unknown", "engine.moe-runner-fallback",
             "engine.moe-runner-unavailable", "topology.gpu-missing",
             "kernels.bf16-gemms", "kernels.fp32-gemms",
             "kernels.sglang-paths",  # the kernels' path depends on the arch
             "profile.ack-unused"}  # an acknowledgement may match a check only the host raises
# in a host family, but needing no GPU: the layout rules (only the shared expert's runtime format,
# checked last, depends on the GPU)
STATIC_IN_HOST_FAMILIES = {"capacity.layout"}


HOST_FAMILIES = ("host.", "disk.", "capacity.", "known-bad.", "fleet.",
                 "exposure.")  # exposure: the engines listen on the host's service_address


def _is_static(check_id: str) -> bool:
    """Every check but those of the host-dependent families: a new profile-level check counts as
    static unless it is listed here as needing the host."""
    return check_id in STATIC_IN_HOST_FAMILIES or (
        not check_id.startswith(HOST_FAMILIES) and check_id not in HOST_ONLY)


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


SYMPTOMS = [  # (edit of the default profile, check id, field, a phrase of the fix)
    (("index_topk: 1024", "index_topk: 768"), "engine.index-topk", "attention.index_topk", "512, 1024"),
    (("kv_cache_dtype: fp8_e4m3", "kv_cache_dtype: fp8_e4m"), "engine.kv-cache-dtype",
     "attention.kv_cache_dtype", "set attention.kv_cache_dtype: fp8_e4m3"),
    (("runner_backend: flashinfer_cutlass", "runner_backend: flashinfer_cutlas"),
     "engine.flag-invalid-choice", "moe.runner_backend", "set moe.runner_backend: flashinfer_cutlass"),
    (("gpus: [4, 5, 6, 7]", "gpus: [3, 4, 5, 6]"), "topology.gpu-overlap", "topology.decode.gpus",
     "disjoint"),
]


@pytest.mark.parametrize("edit,check_id,field,fix", SYMPTOMS, ids=[s[1] for s in SYMPTOMS])
def test_validate_reports_what_plan_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch,
                                            edit: tuple[str, str], check_id: str, field: str,
                                            fix: str) -> None:
    assert edit[0] in DEFAULT
    text = DEFAULT.replace(edit[0], edit[1])
    _write(tmp_path, text)
    monkeypatch.chdir(tmp_path)  # a short path: the location line stays one line in a pipe
    path = Path("p.yaml")
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    line = next(i + 1 for i, ln in enumerate(text.splitlines()) if edit[1] in ln)
    assert re.search(rf"{re.escape(check_id)}: .*\n      at {re.escape(str(path))}:{line}:\d+ "
                     rf"\({re.escape(field)}\)", out), out
    assert fix in out and "valid profile" not in out
    assert out.count(f"{check_id}:") == 1  # once, not once per role
    plan = build_plan(load_context(path, None))
    assert [c.id for c in plan.checks if c.field == field and c.severity == "error"] == [check_id]


def test_unknown_variant_is_located_with_a_did_you_mean(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    text = DEFAULT.replace("variant: dsv4-flash-nvfp4", "variant: dsv4-flash-nvfp5")
    path = _write(tmp_path, text)
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    line = next(i + 1 for i, ln in enumerate(text.splitlines()) if "nvfp5" in ln)
    assert f"{path}:{line}:" in err and "did you mean 'dsv4-flash-nvfp4'?" in err


def test_shipped_profiles_validate(capsys: pytest.CaptureFixture[str]) -> None:
    for p in sorted(PROFILES.glob("*.yaml")):
        if p.name != "inventory.yaml":
            assert main(["validate", str(p)]) == 0, capsys.readouterr().out


def _outcome(fn):
    try:
        return fn(), None
    except DsvError as exc:
        return None, exc.render()


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(profiles())
def test_validate_and_plan_agree_on_every_static_check(tmp_path_factory, profile: dict) -> None:
    d: Path = tmp_path_factory.mktemp("agree")
    path = _write(d, yaml.safe_dump(profile))
    validated, v_err = _outcome(lambda: check_profile(path)[1])
    plan, p_err = _outcome(lambda: build_plan(load_context(path, None)))
    if v_err is not None or p_err is not None:
        assert v_err == p_err  # the same located input errors (schema, unknown ids), or none
        return

    def key(c):
        return (c.id, c.severity, c.subject, c.field, c.location, c.message, c.fix, c.acknowledged)

    v = sorted(map(key, validated))
    p = sorted(key(c) for c in plan.checks if _is_static(c.id))
    assert v == p
    assert all(c.location for c in validated if c.field)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(profiles())
def test_every_profile_check_is_located(tmp_path_factory, profile: dict) -> None:
    """Checks about the profile (not the host's disks or keys) carry the field and its
    file:line:col, host-dependent ones (capacity, known-bad) included."""
    d: Path = tmp_path_factory.mktemp("loc")
    path = _write(d, yaml.safe_dump(profile))
    plan, err = _outcome(lambda: build_plan(load_context(path, None)))
    if err is not None:
        return
    for c in plan.checks:
        if c.id.startswith(("engine.", "topology.", "capacity.", "known-bad.", "model.",
                            "kernels.")):
            # file:line:col, or the file alone for a default the profile does not write at all
            assert c.field and c.location and c.location.startswith(str(path)), c
            assert c.location == str(path) or re.fullmatch(rf"{re.escape(str(path))}:\d+:\d+",
                                                           c.location), c
