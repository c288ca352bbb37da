"""A stored kernel measurement steers plan --live, render --live, apply and history.

Real sshd + `systemd --user` + the engine simulator. The harness host has no GPU, so the
measurement is one `python -m dsv4_kernels.qualify` printed elsewhere, stored with
`dsv4ctl qualify kernels --from-file` exactly as a run on the host stores its own (the same merge
into <install_root>/kernels-qualification.json). It says the bundled attention beat FlashInfer at
every decode shape of the decode role, and lost for the prefill role. Then: `plan --live` picks the
bundled attention for decode only and cites the numbers; `render --live` writes the routing env for
decode only; the applied release's record and `history` name the path each role's ops took; a
measurement from another GPU is ignored and the plan says so; `--reset` forgets it.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.kernel_paths import role_shape
from orchestrator.planner.build import load_context, resolve_deployment
from tests.integration.test_apply import ROOT, Env, env  # noqa: F401 - the fixture
from tests.sim.nvidia_smi import DEFAULT_NAME

pytestmark = pytest.mark.integration


def _measurement(host: Env, prof_file, role: str, *, fi: float, ours: float,  # type: ignore[no-untyped-def]
                 gpu: str = DEFAULT_NAME) -> dict:
    ctx = load_context(prof_file, host.inventory_path)
    dep = resolve_deployment(ctx)
    shape = role_shape(dep, dep.role(role), 64)
    timings = []
    labels = ["decode B=1", "decode B=64"] if role == "decode" else ["prefill T=8192"]
    for label in labels:
        timings += [
            {"op": "attention", "contender": "flashinfer", "shape": label, "status": "ok",
             "us": fi},
            {"op": "attention", "contender": "sglang-triton", "shape": label, "status": "ok",
             "us": ours * 1.4},
            {"op": "attention", "contender": "bundled", "shape": label, "status": "ok",
             "us": ours, "error": 0.002}]
    return {"role": role, "host": "h", "measured_at": "2026-12-03T09:00:00Z",
            "engine_version": "0.5.23", "gpu": gpu, "compute_cap": "12.0", "shape": shape,
            "timings": timings, "runner": "dsv4_kernels.qualify (test)"}


def test_a_stored_measurement_steers_plan_render_apply_and_history(
        env: Env, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    prof = env.profile(kernels={"selftest": False})
    prof_file = env.profile_file(prof, "p.yaml")
    plan0 = env.plan(prof)
    assert {(r.name, p.op): p.path for r in plan0.deployment.roles for p in r.kernels} == {
        ("prefill", "attention"): "engine", ("prefill", "indexer"): "engine",
        ("prefill", "mhc_pre"): "bundled", ("decode", "attention"): "engine",
        ("decode", "indexer"): "engine", ("decode", "mhc_pre"): "bundled"}

    capsys.readouterr()
    for role, fi, ours in (("decode", 24.1, 20.5), ("prefill", 900.0, 1300.0)):
        fact = env.tmp / f"{role}.json"
        fact.write_text(json.dumps(_measurement(env, prof_file, role, fi=fi, ours=ours)))
        assert env.cli("qualify", "kernels", "--host", "h", "--profile", str(prof_file),
                       "--from-file", str(fact)) == 0
    out = capsys.readouterr().out
    assert f"stored in {ROOT}/kernels-qualification.json on h" in out
    stored = json.loads(env.fake.read(f"{ROOT}/kernels-qualification.json"))
    assert [m["role"] for m in stored["measurements"]] == ["decode", "prefill"]

    # plan --live follows it, and says so with the numbers
    assert env.cli("plan", str(prof_file), "--host", "h", "--live") == 0
    out = " ".join(capsys.readouterr().out.split())  # the report wraps long lines
    assert ("decode attention: measured on h 2026-12-03: flashinfer 24.1 us, bundled 20.5 us at "
            "decode B=64; bundled faster at 2 of 2 shapes, so bundled") in out
    assert ("prefill attention: measured on h 2026-12-03: flashinfer 900.0 us, bundled 1300.0 us "
            "at prefill T=8192, so engine") in out

    # render --live writes what the plan decided: the routing env for decode only
    assert env.cli("render", str(prof_file), "--host", "h", "--live", "-o",
                   str(env.tmp / "tree")) == 0
    dec = (env.tmp / "tree" / "env" / "decode.env").read_text()
    pre = (env.tmp / "tree" / "env" / "prefill.env").read_text()
    assert 'SGLANG_SM120_FLASHMLA_BACKEND="triton"' in dec
    assert 'DSV4_KERNELS_OPS="attention,mhc_pre"' in dec
    assert "FLASHMLA" not in pre and 'DSV4_KERNELS_OPS="mhc_pre"' in pre
    assert env.cli("render", str(prof_file), "--host", "h", "-o", str(env.tmp / "tree0")) == 0
    assert "FLASHMLA" not in (env.tmp / "tree0" / "env" / "decode.env").read_text()  # declared

    # apply it: the host runs it, the record and history say which path served
    capsys.readouterr()
    assert env.apply(prof) == 0
    rel = env.current()
    assert rel is not None
    assert 'SGLANG_SM120_FLASHMLA_BACKEND="triton"' in env.fake.read(
        f"{ROOT}/current/env/decode.env")
    assert env.record(rel)["kernel_paths"] == {
        "decode": {"attention": "bundled", "indexer": "engine", "mhc_pre": "bundled"},
        "prefill": {"attention": "engine", "indexer": "engine", "mhc_pre": "bundled"}}
    capsys.readouterr()
    assert env.cli("history", "--host", "h") == 0
    out = capsys.readouterr().out
    assert "kernel paths decode: attention bundled, indexer engine, mhc_pre bundled" in out
    assert "kernel paths prefill: attention engine, indexer engine, mhc_pre bundled" in out

    # a measurement from another GPU is ignored, and the plan says why
    other = env.tmp / "other.json"
    other.write_text(json.dumps(_measurement(env, prof_file, "decode", fi=24.1, ours=20.5,
                                             gpu="NVIDIA H200")))
    assert env.cli("qualify", "kernels", "--host", "h", "--profile", str(prof_file),
                   "--from-file", str(other)) == 0
    capsys.readouterr()
    assert env.cli("plan", str(prof_file), "--host", "h", "--live") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "kernels.measurement-ignored" in out and "was taken on NVIDIA H200" in out
    plan = env.plan(prof)
    assert {p.path for r in plan.deployment.roles for p in r.kernels if p.op == "attention"} \
        == {"engine"}

    # reset: the catalog alone decides again
    assert env.cli("qualify", "kernels", "--host", "h", "--reset") == 0
    assert "kernel measurement removed" in capsys.readouterr().out
    assert env.fake.exec(f"test -e {ROOT}/kernels-qualification.json").returncode != 0
