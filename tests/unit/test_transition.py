"""The transition model (issue 21, Deliver 1): one list of actions that plan, diff and apply share.

The symptoms the issue reported, each as a test: `diff` PD 4+4 -> colocated TP8 said "0 role(s)
restart" while stopping three units and starting one; 45 of its 47 changed fields were
`null -> (absent)`; the plan's text summary said "0 to restart" while its JSON counted 16 changes;
a plan with errors still opened with "Plan: 13 to add"; a monitoring-only change was "No changes."
for apply while plan counted it (issue 20 item 5).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.facts import Facts, GpuFact, UnitFact
from orchestrator.planner.build import build_plan, load_context
from orchestrator.planner.fleet import plan_from_paths
from orchestrator.planner.report import render_json, render_markdown, render_text
from orchestrator.planner.transition import (
    ReleaseFile,
    between,
    release_from_planned,
    transition,
    unit_plan,
)
from orchestrator.planner_model import count_actions
from tests.validate.helpers import INVENTORY, PROFILES

# the single-host shipped profiles (a fleet profile is planned per host by planner.fleet, each
# host with build_plan and so with this same transition)
SHIPPED = sorted(p for p in PROFILES.glob("*.yaml")
                 if p.name != "inventory.yaml" and "host" in yaml.safe_load(p.read_text()))
PAIRS = list(itertools.product(SHIPPED, SHIPPED))


def _ids(pair: tuple[Path, Path]) -> str:
    return f"{pair[0].stem}->{pair[1].stem}"


def _probed(plan_files: list, units: list[str]) -> Facts:
    """Facts of a host whose current release is ``plan_files`` and whose ``units`` run."""
    return Facts(source="probed", host="gpu-host",
                 gpus=[GpuFact(index=i, name="rtx-pro-6000-se") for i in range(8)],
                 current_release="r0001",
                 current_files={f.path: f.sha256 for f in plan_files},
                 current_roles={f.path: list(f.roles) for f in plan_files if f.roles},
                 units=[UnitFact(name=u, active="active") for u in units])


def _unfold(text: str) -> str:
    """Output with the terminal folding undone (lines fit 100 columns when piped)."""
    return " ".join(text.split())


def _counts_in(line: str) -> dict[str, int]:
    return {w: int(n) for n, w in re.findall(r"(\d+) to (\w+)", line)}


# --------------------------------------------------------------------------------- the model ---

def test_unit_changes_follow_the_files_roles() -> None:
    a = {"units/u-d.service": ReleaseFile("1", ("decode",)),
         "units/u-p.service": ReleaseFile("2", ("prefill",)),
         "bin/launch-decode.sh": ReleaseFile("3", ("decode",)),
         "monitoring/prometheus.yml": ReleaseFile("4")}
    assert transition(a, a, None) == []
    b = {**a, "monitoring/prometheus.yml": ReleaseFile("5")}
    acts = transition(a, b, None)  # monitoring only: a change, no restart
    assert [(x.kind, x.target) for x in acts] == [("change", "monitoring/prometheus.yml")]
    b = {**a, "bin/launch-decode.sh": ReleaseFile("9", ("decode",))}
    acts = transition(a, b, None)
    assert [(x.kind, x.target, x.downtime) for x in acts] == [
        ("change", "bin/launch-decode.sh", "none"), ("restart", "u-d.service", "minutes")]
    # a unit that does not run is started (it was down), not restarted
    acts = transition(a, a, {"u-d.service": "active", "u-p.service": "failed"})
    assert [(x.kind, x.target, x.reason) for x in acts] == [("start", "u-p.service", "not running")]
    # a changed unit in a crash loop (activating/auto-restart) is stopped and started, so its old
    # process cannot come back under the new files
    b = {**a, "bin/launch-decode.sh": ReleaseFile("9", ("decode",))}
    acts = transition(a, b, {"u-d.service": "activating", "u-p.service": "active"})
    assert [(x.kind, x.target, x.downtime) for x in acts][1:] == [("restart", "u-d.service", "none")]
    assert unit_plan(acts) == (["u-d.service"], ["u-d.service"])
    # a removed role stops; its files' removals are listed too
    c = {k: v for k, v in a.items() if k != "units/u-p.service"}
    acts = transition(a, c, None)
    assert [(x.kind, x.target) for x in acts] == [("remove", "units/u-p.service"),
                                                 ("stop", "u-p.service")]
    # no current release: every unit starts
    acts = transition(None, a, {})
    assert unit_plan(acts) == ([], ["u-p.service", "u-d.service"])


# -------------------------------------------------------------------------------- symptoms ---

def test_diff_pd_to_tp8_counts_the_stops_and_the_start(capsys: pytest.CaptureFixture[str]) -> None:
    """Symptom: "0 role(s) restart" while its own consequences stopped three units and started
    one (a full outage). The summary now counts exactly the consequences it lists."""
    assert main(["diff", str(PROFILES / "default.yaml"), str(PROFILES / "mxfp4-tp8.yaml")]) == 0
    out = capsys.readouterr().out
    summary = next(x for x in out.splitlines() if x.startswith("Plan:"))
    counts = _counts_in(summary)
    consequences = out.split("Consequences:")[1].split("Capacity:")[0]
    assert counts["stop"] == consequences.count("  - stop ") == 3
    assert counts["start"] == consequences.count("  + start ") == 1
    assert counts["restart"] == consequences.count("~> restart") == 0
    assert "downtime: a full outage" in consequences


def test_diff_fields_have_no_null_to_absent_noise(capsys: pytest.CaptureFixture[str]) -> None:
    """Symptom: 45 of 47 "changed fields" were `null -> (absent)`."""
    assert main(["diff", str(PROFILES / "default.yaml"), str(PROFILES / "mxfp4-tp8.yaml")]) == 0
    out = capsys.readouterr().out
    section = out.split("Profile changes:")[1].split("Consequences:")[0]
    fields = [x for x in section.splitlines() if re.match(r"  \S", x)]  # not fold continuations
    assert "null -> (absent)" not in _unfold(section) and "(absent) -> null" not in _unfold(section)
    n = int(re.search(r"Diff: (\d+) field", out).group(1))  # type: ignore[union-attr]
    assert n == len(fields)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_plan_summary_agrees_across_text_markdown_json(path: Path) -> None:
    """Symptom: text said "0 to restart" while its JSON counted 16 changes."""
    plan = plan_from_paths(path)
    data = json.loads(render_json(plan))
    text = render_text(plan)
    md = render_markdown(plan)
    line = data["summary"]["line"]
    assert line in text and line in md
    assert _counts_in(line) == data["summary"]["counts"] == count_actions(plan.actions)
    assert sum(data["summary"]["counts"].values()) == data["summary"]["changes"] \
        == len(data["actions"])


def test_plan_with_errors_says_it_will_not_apply(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Symptom: a plan with errors still opened with "Plan: 13 to add"."""
    prof = yaml.safe_load((PROFILES / "default.yaml").read_text())
    prof["attention"]["index_topk"] = 768
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(prof))
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    for fmt in ("text", "markdown", "json"):
        assert main(["plan", str(path), "--format", fmt]) == 1
        out = capsys.readouterr().out
        assert "to add" not in out.split("Changes")[0], fmt
        assert "will not apply" in out, fmt
        if fmt == "json":
            assert json.loads(out)["summary"]["applicable"] is False


def test_monitoring_only_change_is_a_change() -> None:
    """Issue 20 item 5: plan said 5 to change, apply said "No changes." (apply's preflight and
    plan now both call transition(); apply's use is proven in tests/integration)."""
    ctx = load_context(PROFILES / "default.yaml", None)
    base = build_plan(ctx)
    prof = ctx.profile.model_copy(update={"monitoring": ctx.profile.monitoring.model_copy(
        update={"scrape_interval_s": 30})})
    changed = build_plan(type(ctx)(prof, ctx.profile_path, ctx.profile_text, ctx.host_name,
                                   ctx.host, ctx.inventory_path))
    units = [f.path.removeprefix("units/") for f in base.files if f.path.startswith("units/")]
    plan = build_plan(type(ctx)(prof, ctx.profile_path, ctx.profile_text, ctx.host_name,
                                ctx.host, ctx.inventory_path), _probed(base.files, units))
    kinds = {(a.kind, a.target) for a in plan.actions}
    assert ("change", "monitoring/prometheus.yml") in kinds
    assert not [a for a in plan.actions if a.kind in ("start", "stop", "restart")]
    assert plan.has_changes and "no changes" not in render_text(plan).lower()
    assert plan.actions == between(base.files, changed.files)


# ------------------------------------------------------------------- diff = plan, every pair ---

@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_diff_and_plan_compute_the_same_actions(pair: tuple[Path, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """For every ordered pair of shipped profiles: `diff A B` lists the actions (and counts) that
    `plan B` shows against a host whose current release is A with all its units running."""
    a_path, b_path = pair
    a = plan_from_paths(a_path)
    units = [f.path.removeprefix("units/") for f in a.files if f.path.startswith("units/")]
    b = plan_from_paths(b_path, facts=_probed(a.files, units))
    assert main(["diff", str(a_path), str(b_path), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["actions"] == [x.model_dump(mode="json") for x in b.actions]
    assert d["summary"]["counts"] == json.loads(render_json(b))["summary"]["counts"]
    assert d["summary"]["line"] == json.loads(render_json(b))["summary"]["line"]
    assert d["summary"]["restarts"] == b.restarts
    for fmt in ("text", "markdown"):
        assert main(["diff", str(a_path), str(b_path), "--format", fmt]) == 0
        out = capsys.readouterr().out
        if b.actions:
            assert d["summary"]["line"] in _unfold(out), fmt
        else:
            assert "no differences" in out.lower(), fmt
    assert b.actions == between(a.files, b.files)
    assert release_from_planned(b.files)  # the desired release is the plan's files
    # --detailed-exitcode counts the same list: 2 exactly when there is something to do
    assert main(["diff", str(a_path), str(b_path), "--detailed-exitcode"]) == (2 if b.actions else 0)
    capsys.readouterr()


def test_switching_deployments_frees_the_old_releases_ports() -> None:
    """PD 4+4 and colocated TP8 both use engine_info_bootstrap_port 6789: the transition stops
    the old units before the new ones start, so a port they hold is not "in use" for the plan
    (it was an error that blocked every switch between the shipped profiles on a real host)."""
    a = plan_from_paths(PROFILES / "default.yaml")
    units = [f.path.removeprefix("units/") for f in a.files if f.path.startswith("units/")]
    ports = [r.port for r in a.deployment.roles] + [6789, 8000]
    facts = _probed(a.files, units).model_copy(update={"ports_in_use": ports})
    b = plan_from_paths(PROFILES / "mxfp4-tp8.yaml", facts=facts)
    assert "host.port-in-use" not in {c.id for c in b.checks}
    # a port held by something that is not the current release still is an error
    other = facts.model_copy(update={"units": [], "current_files": {}, "current_roles": {}})
    b = plan_from_paths(PROFILES / "mxfp4-tp8.yaml", facts=other)
    assert "host.port-in-use" in {c.id for c in b.errors}


def test_kernel_change_is_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 5, the kernel half: a new kernels package with nothing else changed was
    "No changes." for apply. The release records the package's digest in kernels.json, read by
    every engine role, so plan and apply (one transition) change it and restart the engines."""
    from orchestrator import kernels_package

    monkeypatch.setattr(kernels_package, "digest", lambda: "a" * 64)
    old = plan_from_paths(PROFILES / "default.yaml")
    units = [f.path.removeprefix("units/") for f in old.files if f.path.startswith("units/")]
    monkeypatch.setattr(kernels_package, "digest", lambda: "b" * 64)
    new = plan_from_paths(PROFILES / "default.yaml", facts=_probed(old.files, units))
    assert [(a.kind, a.target) for a in new.actions] == [
        ("change", "kernels.json"),
        ("restart", "dsv4-default-decode.service"), ("restart", "dsv4-default-prefill.service")]
    assert count_actions(new.actions)["restart"] == 2 and new.restarts == ["prefill", "decode"]
    # kernels off: no kernels.json, so a kernels commit changes nothing on such a host
    off = load_context(PROFILES / "default.yaml", None)
    off_prof = off.profile.model_copy(update={"kernels": off.profile.kernels.model_copy(
        update={"attention": "engine", "indexer": "engine", "mhc_pre": "engine"})})
    plan = build_plan(type(off)(off_prof, off.profile_path, off.profile_text, off.host_name,
                                off.host, off.inventory_path))
    assert "kernels.json" not in {f.path for f in plan.files}


def test_the_kernels_digest_follows_the_shipped_files(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    from orchestrator import kernels_package

    monkeypatch.undo()  # the suite pins the digest; this test is about the real one
    src = tmp_path / "kernels"
    (src / "dsv4_kernels").mkdir(parents=True)
    (src / "pyproject.toml").write_text("[project]\nname='dsv4-kernels'\n")
    (src / "dsv4_kernels" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(kernels_package, "source", lambda: src)
    kernels_package.digest.cache_clear()
    first = kernels_package.digest()
    (src / "dsv4_kernels" / "a.py").write_text("x = 2\n")
    kernels_package.digest.cache_clear()
    assert first is not None and kernels_package.digest() not in (None, first)
    kernels_package.digest.cache_clear()


def test_the_fleet_uses_the_same_transition_per_host(tmp_path: Path) -> None:
    """The fleet (issue 23) plans each host with build_plan, so with this transition: a change of
    the engine's settings restarts every engine host's engine and no process on the router host,
    and the fleet's per-host summary counts the same actions."""
    from orchestrator.planner.fleet import load_fleet, plan_fleet

    fleet_path = PROFILES / "fleet-3x.yaml"
    before = plan_fleet(load_fleet(fleet_path, None))
    prof = yaml.safe_load(fleet_path.read_text())
    prof["topology"]["engine"]["cuda_graph_max_bs"] = 32
    changed = tmp_path / "fleet-3x.yaml"
    changed.write_text(yaml.safe_dump(prof))
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    facts = {}
    for p in before.plans:
        units = [f.path.removeprefix("units/") for f in p.files if f.path.startswith("units/")]
        facts[p.host] = _probed(p.files, units).model_copy(update={"host": p.host})
    after = plan_fleet(load_fleet(changed, None), facts)
    rows = {r.host: r for r in after.summary()}
    for old, new in zip(before.plans, after.plans, strict=True):
        assert new.actions == between(old.files, new.files), new.host
        assert rows[new.host].changes == len(new.actions)
        assert rows[new.host].restarts == len(new.restarts)
        if new.deployment.roles:
            assert new.restarts == ["engine"], new.host
        else:  # the router host: only its copy of the resolved profile changes, nothing restarts
            assert [(a.kind, a.target) for a in new.actions] == [("change", "profile.yaml")]
