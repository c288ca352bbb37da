"""A saved plan's staleness: what changes make apply refuse it, and what must not.

Free disk space is not part of the facts' fingerprint (it moves on a live host, and rounding it
to whole GiB still crosses a boundary now and then); apply compares it with what the plan needs.
"""

from __future__ import annotations

from orchestrator.apply.preflight import stale_reason
from orchestrator.facts import DiskFact, Facts, GpuFact, ModelFact, declared_facts
from orchestrator.paths import data_dir
from orchestrator.planner.build import load_context
from orchestrator.planner.fleet import plan_from_paths
from orchestrator.planner_model import Plan
from orchestrator.profile.inventory import Host

GIB = 1 << 30
PROFILES = data_dir("profiles")


def _facts(free: int, *, gpus: int = 8, present: bool = False) -> Facts:
    """The shipped inventory's host as a probe would report it, with ``free`` bytes on /models."""
    ctx = load_context(PROFILES / "default.yaml", PROFILES / "inventory.yaml")
    base = declared_facts(ctx.host_name, ctx.host)
    models = [ModelFact(path=ctx.profile.model.path, size_bytes=168 * 10**9)] if present else []
    return base.model_copy(update={
        "source": "probed",
        "gpus": [GpuFact(index=i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                         memory_mib=97887, compute_cap="12.0") for i in range(gpus)],
        "disks": [DiskFact(path="/models", size_bytes=3840 * 10**9, free_bytes=free)],
        "models": models,
    })


def _plan(facts: Facts) -> Plan:
    plan = plan_from_paths(PROFILES / "default.yaml", PROFILES / "inventory.yaml", facts=facts)
    assert not plan.errors, [c.message for c in plan.errors]
    return plan


def _host() -> Host:
    return load_context(PROFILES / "default.yaml", PROFILES / "inventory.yaml").host


def test_free_space_is_not_in_the_fingerprint() -> None:
    assert _facts(500 * GIB).fingerprint() == _facts(499 * GIB).fingerprint()
    assert _facts(500 * GIB).fingerprint() != _facts(500 * GIB, gpus=7).fingerprint()
    grown = _facts(500 * GIB).model_copy(update={"disks": [
        DiskFact(path="/models", size_bytes=7680 * 10**9, free_bytes=500 * GIB)]})
    assert grown.fingerprint() != _facts(500 * GIB).fingerprint()  # a disk's size still counts


def test_a_gib_less_free_keeps_a_saved_plan_valid() -> None:
    plan = _plan(_facts(500 * GIB))
    assert stale_reason(plan, _facts(499 * GIB), _host(), None) is None


def test_free_space_below_the_checkpoint_makes_it_stale() -> None:
    plan = _plan(_facts(500 * GIB))
    (row,) = plan.disks
    short = row.needed_bytes - GIB
    why = stale_reason(plan, _facts(short), _host(), None)
    assert why is not None and why.startswith("/models has ") and "free now" in why
    assert "the checkpoint needs" in why and "the plan saw 536.9 GB free" in why


def test_free_space_does_not_matter_when_the_checkpoint_is_present() -> None:
    plan = _plan(_facts(500 * GIB, present=True))
    assert plan.disks[0].present
    assert stale_reason(plan, _facts(GIB, present=True), _host(), None) is None


def test_other_facts_still_make_it_stale() -> None:
    plan = _plan(_facts(500 * GIB))
    why = stale_reason(plan, _facts(500 * GIB, gpus=7), _host(), None)
    assert why is not None and "facts" in why



def test_a_new_pool_measurement_makes_it_stale_and_says_so() -> None:
    from orchestrator.facts import PoolMeasurement

    plan = _plan(_facts(500 * GIB))
    cap = plan.capacity[0]
    meas = PoolMeasurement(
        role=cap.role, engine_version="0.5.23", model_variant=plan.deployment.model_variant,
        measured_tokens=cap.max_total_tokens_per_rank // 2 // 256 * 256,
        model_tokens=cap.max_total_tokens_per_rank,
        predicted_tokens=cap.max_total_tokens_per_rank, bytes_per_token=cap.bytes_per_token,
        source="server_info", release="r0001", measured_at="2026-12-01T15:00:00.00Z")
    now = _facts(500 * GIB).model_copy(update={"calibration": [meas]})
    why = stale_reason(plan, now, _host(), None)
    assert why is not None and "calibration" in why and "re-plan" in why


def test_a_plan_of_declared_facts_is_refused_with_a_command_runnable_as_printed(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The reason named `dsv4ctl plan PROFILE --live -o plan.json`: the completion of printed
    commands took PROFILE for the profile given, so the command named a file called PROFILE
    where the run (`apply plan.json`) knew its profile."""
    from orchestrator.cli import _options
    from orchestrator.cli.rerun import Target, complete
    from tests.printed_commands import check, commands_in

    ctx = load_context(PROFILES / "default.yaml", PROFILES / "inventory.yaml")
    declared = declared_facts(ctx.host_name, ctx.host)
    plan = plan_from_paths(PROFILES / "default.yaml", PROFILES / "inventory.yaml", facts=declared)
    reason = stale_reason(plan, _facts(2000 * GIB), ctx.host, ctx.profile.model.path) or ""
    assert "declared facts" in reason
    inv = str(PROFILES / "inventory.yaml")
    run = Target(PROFILES / "default.yaml", PROFILES / "inventory.yaml", "gpu-host")
    [cmd] = commands_in(complete(reason, run, _options(), run_verb="apply"))
    saved = tmp_path / "plan.json"
    argv = ["apply", str(saved), "-i", inv, "--host", "gpu-host"]
    saved.write_text('{"profile_path": "%s"}' % (PROFILES / "default.yaml"))
    assert check(cmd, argv) == [], cmd


def test_a_plan_without_its_profile_is_refused_naming_its_host() -> None:
    import pytest

    from orchestrator.apply.context import profile_from_plan
    from orchestrator.errors import DsvError

    plan = _plan(_facts(2000 * GIB)).model_copy(update={"files": []})
    with pytest.raises(DsvError) as exc:
        profile_from_plan(plan)
    assert "`dsv4ctl plan --host gpu-host --live -o plan.json`" in (exc.value.fix or "")
