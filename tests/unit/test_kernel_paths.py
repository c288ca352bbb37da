"""The kernel-path decision from a stored host measurement (``dsv4ctl qualify kernels``).

A plan from probed facts holding a measurement of this engine version, GPU and role shape
follows it and cites it; one from another version, GPU or shape is ignored and the plan says
why; a measurement without the engine's contender (FlashInfer unavailable) cannot decide.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import DsvError
from orchestrator.facts import DiskFact, Facts, GpuFact, KernelQualification, KernelTiming
from orchestrator.kernel_paths import role_shape
from orchestrator.kernel_qualification import merge, parse_file, parse_measurement, render_file
from orchestrator.planner.build import build_plan, load_context, resolve_deployment
from orchestrator.planner.report import render_text

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
GPU = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def _ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    (tmp_path / "p.yaml").write_text((PROFILES / "default.yaml").read_text())
    return load_context(tmp_path / "p.yaml", None)


def _measurement(ctx, role: str, *, fi: float | None, ours: float, version: str = "0.5.23",
                 gpu: str = GPU, shape: dict[str, int] | None = None) -> KernelQualification:
    dep = resolve_deployment(ctx)
    r = dep.role(role)
    rows = []
    for label in ("decode B=1", "decode B=64"):
        rows.append(KernelTiming(op="attention", contender="flashinfer", shape=label,
                                 status="ok" if fi is not None else "unavailable", us=fi,
                                 detail=None if fi is not None else "built for sm_120 only"))
        rows.append(KernelTiming(op="attention", contender="bundled", shape=label, status="ok",
                                 us=ours))
    rows.append(KernelTiming(op="indexer", contender="tilelang", shape="indexer", status="ok",
                             us=10.0))
    rows.append(KernelTiming(op="indexer", contender="bundled", shape="indexer", status="ok",
                             us=12.0))
    return KernelQualification(role=role, host="gpu-host", measured_at="2026-12-03T10:00:00Z",
                               engine_version=version, gpu=gpu, compute_cap="12.0",
                               shape=shape or role_shape(dep, r, 64), timings=rows,
                               runner="test")


def _facts(measured: list[KernelQualification]) -> Facts:
    return Facts(source="probed", host="gpu-host",
                 gpus=[GpuFact(index=i, name=GPU, memory_mib=97887, compute_cap="12.0")
                       for i in range(8)],
                 disks=[DiskFact(path="/models", size_bytes=4 * 10**12, free_bytes=2 * 10**12)],
                 kernel_qualification=measured)


def _paths(plan):  # type: ignore[no-untyped-def]
    return {(r.name, p.op): p for r in plan.deployment.roles for p in r.kernels}


def test_plan_follows_a_measurement_and_cites_it(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    faster = _measurement(ctx, "decode", fi=24.1, ours=20.0)
    slower = _measurement(ctx, "prefill", fi=24.1, ours=31.0)
    plan = build_plan(ctx, _facts([faster, slower]))
    p = _paths(plan)
    assert p[("decode", "attention")].path == "bundled"
    assert p[("decode", "attention")].why == (
        "measured on gpu-host 2026-12-03: flashinfer 24.1 us, bundled 20.0 us at decode B=64; "
        "bundled faster at 2 of 2 shapes, so bundled")
    assert p[("prefill", "attention")].path == "engine"
    assert "flashinfer 24.1 us, bundled 31.0 us at decode B=64; bundled faster at 0 of 2 " \
           "shapes, so engine" in \
        p[("prefill", "attention")].why
    assert p[("decode", "indexer")].path == "engine"  # TileLang measured faster
    env = next(f.content for f in plan.files if f.path == "env/decode.env")
    assert 'SGLANG_SM120_FLASHMLA_BACKEND="triton"' in env
    assert "FLASHMLA" not in next(f.content for f in plan.files if f.path == "env/prefill.env")
    assert "so bundled" in render_text(plan)
    # the plan from declared facts knows no measurement
    assert _paths(build_plan(ctx))[("decode", "attention")].path == "engine"


def test_bundled_must_win_at_every_shape(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    m = _measurement(ctx, "decode", fi=24.1, ours=20.0)
    slow_b1 = [t.model_copy(update={"us": 30.0}) if t.contender == "bundled"
               and t.shape == "decode B=1" else t for t in m.timings]
    plan = build_plan(ctx, _facts([m.model_copy(update={"timings": slow_b1})]))
    att = _paths(plan)[("decode", "attention")]
    assert att.path == "engine" and "bundled faster at 1 of 2 shapes" in att.why


@pytest.mark.parametrize(("change", "said"), [
    ({"version": "0.5.22"}, "is for sglang 0.5.22, this profile runs 0.5.23"),
    ({"gpu": "NVIDIA H200"}, "was taken on NVIDIA H200"),
    ({"shape": {"heads_per_attn_rank": 8}}, "heads_per_attn_rank 8 -> 16"),
])
def test_a_mismatched_measurement_is_ignored_and_the_plan_says_so(
        tmp_path: Path, change: dict, said: str) -> None:
    ctx = _ctx(tmp_path)
    m = _measurement(ctx, "decode", fi=24.1, ours=20.0, **{
        k: v for k, v in change.items() if k != "shape"})
    if "shape" in change:
        m = m.model_copy(update={"shape": {**m.shape, **change["shape"]}})
    plan = build_plan(ctx, _facts([m]))
    assert _paths(plan)[("decode", "attention")].path == "engine"
    (warn,) = [c for c in plan.checks if c.id == "kernels.measurement-ignored"]
    assert warn.severity == "warning" and said in warn.message and "ignored" in warn.message
    assert f"`dsv4ctl qualify kernels --host {ctx.host_name}`" in (warn.fix or "")  # not HOST


def test_flashinfer_unavailable_cannot_decide(tmp_path: Path) -> None:
    # a measurement from a GPU where FlashInfer's kernel cannot run says nothing against it
    ctx = _ctx(tmp_path)
    plan = build_plan(ctx, _facts([_measurement(ctx, "decode", fi=None, ours=20.0)]))
    att = _paths(plan)[("decode", "attention")]
    assert att.path == "engine" and att.why.startswith("default")
    assert "flashinfer unavailable at decode B=1: built for sm_120 only, so the measurement " \
           "cannot decide" in (att.measured or "")


def test_the_measurement_is_part_of_the_facts_fingerprint(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    assert _facts([]).fingerprint() != _facts([_measurement(ctx, "decode", fi=1.0, ours=2.0)]
                                              ).fingerprint()
    # hosts never qualified keep the fingerprint they had
    assert "kernel_qualification" not in _facts([]).model_dump_json(exclude_defaults=True)


def test_the_host_file_round_trips_and_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    a = _measurement(ctx, "decode", fi=1.0, ours=2.0)
    b = a.model_copy(update={"measured_at": "2026-12-04T00:00:00Z"})
    assert parse_file(render_file(merge([a], [b])), where="f") == [b]
    assert parse_file("", where="f") == []
    with pytest.raises(DsvError, match="is not a dsv4ctl kernel measurement file"):
        parse_file('{"format": 1, "measurements": [{"role": 1}]}', where="f")
    with pytest.raises(DsvError, match="has format 9"):
        parse_file('{"format": 9, "measurements": []}', where="f")
    with pytest.raises(DsvError, match=r"x\.json is not a kernel measurement: timings"):
        parse_measurement(json.dumps({**a.model_dump(mode="json"), "timings": "no"}),
                          where="x.json")


DATA = Path(__file__).resolve().parents[1] / "data" / "qualify"


def test_the_h200_run_names_flashinfer_unavailable_and_times_the_others(tmp_path: Path) -> None:
    # `python kernels/tools/qualify_sm120_proxy.py` on the lent H200 (device run of 2026-12-02
    # 06:21 UTC, stored unchanged): FlashInfer's sm_120 kernel cannot run there and says why;
    # SGLang's Triton backend and the bundled kernel are checked and timed at every decode batch
    # size, both on the call SGLang makes (16 heads a rank padded to 64), the bundled one
    # computing the 16 real heads as the hook does in the engine
    m = parse_measurement((DATA / "h200-proxy-decode.json").read_text(), where="decode.json")
    assert m.gpu == "NVIDIA H200" and m.compute_cap == "9.0"
    att = [t for t in m.timings if t.op == "attention"]
    fi = [t for t in att if t.contender == "flashinfer"]
    assert fi and all(t.status == "unavailable" and "sm_120a/120f only" in (t.detail or "")
                      for t in fi)
    for who in ("sglang-triton", "bundled"):
        rows = [t for t in att if t.contender == who]
        assert {t.shape for t in rows} == {f"decode B={b}" for b in (1, 8, 16, 32, 64)}
        assert all(t.status == "ok" and t.us and t.error is not None and t.error < 2e-2
                   for t in rows)
        tag = " H=64 (16 real)" if who == "bundled" else " H=64"
        assert all((t.detail or "").endswith(t.shape + tag) for t in rows), who
    pre = parse_measurement((DATA / "h200-proxy-prefill.json").read_text(), where="prefill.json")
    assert {t.shape for t in pre.timings if t.op == "attention"} == {"prefill T=8192"}
    # stored on an sm_120 host it is ignored: no engine installed there, another GPU
    ctx = _ctx(tmp_path)
    plan = build_plan(ctx, _facts([m.model_copy(update={"role": "decode"})]))
    (warn,) = [c for c in plan.checks if c.id == "kernels.measurement-ignored"]
    assert "is for sglang none" in warn.message
    assert _paths(plan)[("decode", "attention")].path == "engine"


def test_a_role_env_that_steers_sglang_is_what_the_plan_names(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    data = ctx.profile.model_dump(mode="json", by_alias=True)
    data["kernels"] = {"attention": "engine"}
    data["topology"]["decode"]["env"] = {"SGLANG_SM120_FLASHMLA_BACKEND": "torch"}
    (tmp_path / "p.yaml").write_text(json.dumps(data))
    plan = build_plan(load_context(tmp_path / "p.yaml", None))
    att = _paths(plan)[("decode", "attention")]
    assert att.path == "engine"
    assert att.runs == "SGLang as the role's env sets it (SGLANG_SM120_FLASHMLA_BACKEND=torch)"
    assert _paths(plan)[("prefill", "attention")].runs == "FlashInfer sparse MLA"


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plan" / "default.json"


def test_a_release_planned_before_per_op_choices_still_reads_back() -> None:
    # rollback and status read an older release's plan.json: its deployment had the single
    # switch; it reads as the paths that release ran (attention and indexer bundled, mhc_pre
    # with bf16_gemms), so kernels_enabled and history stay true to it
    from orchestrator.planner_model import Plan

    data = json.loads(GOLDEN.read_text())
    data.pop("summary")  # render_json's addition, not part of a saved plan
    dep = data["deployment"]
    del dep["kernel_choices"]
    for r in dep["roles"]:
        del r["kernels"]
    dep.update(kernels_enabled=True, kernels_bf16_gemms=False)
    old = Plan.model_validate(data).deployment
    assert old.kernels_enabled
    assert {(r.name, p.op): p.path for r in old.roles for p in r.kernels} == {
        (role, op): "engine" if op == "mhc_pre" else "bundled"
        for role in ("prefill", "decode") for op in ("attention", "indexer", "mhc_pre")}
    dep.update(kernels_enabled=False)
    assert not Plan.model_validate(data).deployment.kernels_enabled


def test_the_old_keys_map_and_conflict_only_with_an_explicit_other_choice() -> None:
    from pydantic import ValidationError

    from orchestrator.profile.schema import Kernels

    k = Kernels.model_validate({"enabled": False, "attention": "auto"})  # auto: the old key stands
    assert (k.attention, k.indexer, k.mhc_pre) == ("engine", "engine", "engine")
    assert k.legacy_keys == {"enabled": False} and "enabled" not in k.model_dump()
    assert Kernels.model_validate({"bf16_gemms": False}).mhc_pre == "engine"
    assert Kernels.model_validate({"enabled": True}).attention == "auto"
    with pytest.raises(ValidationError, match=r"kernels\.enabled: false means kernels\.attention: "
                                              r"engine, and kernels\.attention is 'bundled'"):
        Kernels.model_validate({"enabled": False, "attention": "bundled"})
    with pytest.raises(ValidationError, match=r"kernels\.enabled = 'yes': must be true or false"):
        Kernels.model_validate({"enabled": "yes"})
