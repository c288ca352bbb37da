"""`dsv4ctl diff`: fields, consequences (restarts, per-GPU memory, KV capacity, checks), file diffs,
formats, exit codes, and `--git REV`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli import cli, main
from orchestrator.planner.fleet import plan_from_paths
from tests.validate.helpers import INVENTORY, PROFILES


def _run(*args: str) -> tuple[int, str, str]:
    """main() with captured stdout/stderr (the CLI's error boundary included)."""
    runner = CliRunner()
    out: dict[str, object] = {}

    def target() -> None:
        out["rc"] = main(list(args))

    result = runner.invoke(_wrap(target), [], catch_exceptions=False)
    return int(out["rc"]), result.stdout, result.stderr  # type: ignore[arg-type]


def _wrap(fn):  # type: ignore[no-untyped-def]
    import click

    @click.command()
    def _cmd() -> None:
        fn()

    return _cmd


def _write(tmp: Path, name: str, data: dict) -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp / "inventory.yaml").write_text(INVENTORY.read_text())
    return path


def _default() -> dict:
    return yaml.safe_load((PROFILES / "default.yaml").read_text())


@pytest.fixture
def acceptance_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The issue's acceptance case: index_topk 512 -> 1024 and decode TP 4 -> 2."""
    old = _default()
    old["attention"]["index_topk"] = 512
    new = _default()
    new["attention"]["index_topk"] = 1024
    new["topology"]["decode"].update(gpus=[4, 5], tp=2, ep=2)
    return _write(tmp_path, "old.yaml", old), _write(tmp_path, "new.yaml", new)


def test_acceptance_restarts_memory_and_unit_diffs(acceptance_pair: tuple[Path, Path]) -> None:
    a, b = acceptance_pair
    rc, out, err = _run("diff", str(a), str(b), "--detailed-exitcode")
    assert rc == 2, err
    assert "attention.index_topk: 512 -> 1024" in out
    assert "topology.decode.tp: 4 -> 2" in out
    flat = " ".join(out.split())  # lines are folded at 100 columns in a pipe
    for role in ("prefill", "decode"):
        line = flat.split(f"~> restart {role} (dsv4-default-{role}.service):")[1].split("~>")[0]
        assert "the model reloads" in line
    assert "0 to start, 2 to restart, 0 to stop." in out
    assert "downtime" in out and "router" not in out.split("Capacity")[0].split("Consequences")[1]
    # per-GPU memory change, with the numbers of the two plans
    pa, pb = plan_from_paths(a), plan_from_paths(b)
    ga = {g.index: g for g in pa.gpus}
    gb = {g.index: g for g in pb.gpus}
    assert ga[4].weights_bytes != gb[4].weights_bytes
    line = next(x for x in out.splitlines() if x.strip().startswith("GPU 4 (decode):"))
    wa, wb = ga[4].weights_bytes / 2**30, gb[4].weights_bytes / 2**30
    assert f"weights {wa:.1f} GiB -> {wb:.1f} GiB" in line
    assert "GPU 6 (idle): role decode -> idle" in out
    cap_a = next(c for c in pa.capacity if c.role == "decode").token_capacity
    cap_b = next(c for c in pb.capacity if c.role == "decode").token_capacity
    assert f"KV capacity {cap_a:,} -> {cap_b:,} tokens" in out
    # a check about index_topk 512 clears
    cleared = {c.id for c in pa.checks} - {c.id for c in pb.checks}
    assert "known-bad.index-topk-512-long-context-recall" in cleared
    checks = out.split("Checks:")[1].split("Files:")[0]
    for cid in cleared:
        assert any(ln.startswith("  - ") and f" {cid}" in ln for ln in checks.splitlines()), cid
    # unit diffs of the restarted roles
    assert "--- a/units/dsv4-default-decode.service" in out
    assert "-  --json-model-override-args '{\"index_topk\": 512}' \\" in out
    assert "+  --json-model-override-args '{\"index_topk\": 1024}' \\" in out
    # concise: profile.yaml's diff hidden, named
    assert "--- a/profile.yaml" not in out and "changed  profile.yaml" in out
    rc, out_v, _ = _run("diff", str(a), str(b), "-v")
    assert rc == 0 and "--- a/profile.yaml" in out_v


def test_identical_profiles(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.yaml", _default())
    rc, out, _ = _run("diff", str(a), str(PROFILES / "default.yaml"), "--detailed-exitcode")
    assert rc == 0 and out == "No differences.\n"


def test_router_only_change_restarts_only_the_router(tmp_path: Path) -> None:
    new = _default()
    new["topology"]["router"]["port"] = 8080
    b = _write(tmp_path, "b.yaml", new)
    rc, out, _ = _run("diff", str(PROFILES / "default.yaml"), str(b))
    assert rc == 0
    assert "~> restart router (dsv4-default-router.service)" in out
    assert "restart prefill" not in out and "restart decode" not in out
    assert "model reloads" not in out


def test_comment_only_change_restarts_nothing(tmp_path: Path) -> None:
    new = _default()
    new["description"] = "reworded"
    b = _write(tmp_path, "b.yaml", new)
    _, out, _ = _run("diff", str(PROFILES / "default.yaml"), str(b))
    assert "no restart" in out and "~> restart" not in out


def test_topology_change_starts_and_stops_roles() -> None:
    rc, out, _ = _run("diff", str(PROFILES / "default.yaml"), str(PROFILES / "mxfp4-tp8.yaml"))
    assert rc == 0
    assert "+ start engine (dsv4-mxfp4-tp8-engine.service)" in out
    assert "- stop prefill (dsv4-default-prefill.service)" in out
    assert "- stop router (dsv4-default-router.service)" in out


def test_context_lines(acceptance_pair: tuple[Path, Path]) -> None:
    a, b = acceptance_pair
    _, out0, _ = _run("diff", str(a), str(b), "--context", "0")
    _, out5, _ = _run("diff", str(a), str(b), "--context", "5")
    hunk0 = out0.split("--- a/bin/launch-prefill.sh")[1].split("\n\n")[0]
    hunk5 = out5.split("--- a/bin/launch-prefill.sh")[1].split("\n\n")[0]
    assert not [ln for ln in hunk0.splitlines()[2:] if ln.startswith(" ")]
    assert len([ln for ln in hunk5.splitlines()[2:] if ln.startswith(" ")]) == 10


def test_markdown(acceptance_pair: tuple[Path, Path]) -> None:
    a, b = acceptance_pair
    rc, out, _ = _run("diff", str(a), str(b), "--format", "markdown")
    assert rc == 0
    assert out.startswith("### dsv4ctl diff")
    assert "| `attention.index_topk` | `512` | `1024` |" in out
    assert "#### Consequences" in out and "#### Capacity" in out and "#### Checks" in out
    assert "```diff\n--- a/units/dsv4-default-decode.service" in out


def test_usage_errors() -> None:
    rc, _, err = _run("diff", str(PROFILES / "default.yaml"))
    assert rc == 1 and "two profiles" in err
    rc, _, err = _run("diff", "--git", "HEAD", str(PROFILES / "default.yaml"),
                      str(PROFILES / "mxfp4-tp8.yaml"))
    assert rc == 1 and "exactly one PROFILE" in err


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")
    (repo / "profiles" / "default.yaml").write_text((PROFILES / "default.yaml").read_text())
    (repo / "profiles" / "inventory.yaml").write_text(INVENTORY.read_text())
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")
    return repo


def test_git_revision(repo: Path) -> None:
    prof = repo / "profiles" / "default.yaml"
    prof.write_text(prof.read_text().replace("index_topk: 1024", "index_topk: 512"))
    rc, out, err = _run("diff", "--git", "HEAD", str(prof), "--detailed-exitcode")
    assert rc == 2, err
    assert "attention.index_topk: 1024 -> 512" in out
    rc, _, err = _run("diff", "--git", "no-such-rev", str(prof))
    assert rc == 1 and "no-such-rev" in err


def test_git_textconv_shows_rendered_change(repo: Path) -> None:
    """The documented setup (docs/git-textconv.md): `git diff` of a profile shows the launch
    lines it changes."""
    import shutil
    import sys

    dsv4ctl = Path(sys.executable).parent / "dsv4ctl"
    assert dsv4ctl.is_file() or shutil.which("dsv4ctl"), "dsv4ctl console script not installed"
    exe = str(dsv4ctl) if dsv4ctl.is_file() else "dsv4ctl"
    (repo / ".gitattributes").write_text(
        "profiles/*.yaml diff=dsv4\nprofiles/inventory.yaml diff\n")
    _git(repo, "config", "diff.dsv4.textconv",
         f"{exe} render --textconv --inventory profiles/inventory.yaml")
    prof = repo / "profiles" / "default.yaml"
    prof.write_text(prof.read_text().replace("index_topk: 1024", "index_topk: 512"))
    out = _git(repo, "diff", "--", "profiles/default.yaml")
    assert "-  --json-model-override-args '{\"index_topk\": 1024}' \\" in out
    assert "+  --json-model-override-args '{\"index_topk\": 512}' \\" in out
    # a broken profile does not break git diff: the error shows instead of the tree
    prof.write_text("name: [\n")
    out = _git(repo, "diff", "--", "profiles/default.yaml")
    assert "rendering failed" in out and "YAML syntax" in out


def test_help_lists_both_commands() -> None:
    assert {"render", "diff"} <= set(cli.commands)


def test_a_kernel_path_change_is_a_consequence(tmp_path: Path) -> None:
    # kernels.attention engine -> bundled: the diff says which role's op moves, from what to what
    # and why, beside the restart it causes
    a = _default()
    a["kernels"] = {"attention": "engine"}
    b = _default()
    b["kernels"] = {"attention": "bundled"}
    rc, out, _ = _run("diff", str(_write(tmp_path, "a.yaml", a)), str(_write(tmp_path, "b.yaml", b)))
    assert rc == 0, out
    cons = out.split("Consequences:")[1].split("\n\n")[0]
    flat = " ".join(cons.split())
    assert ("kernel path: decode attention: engine (FlashInfer sparse MLA) -> bundled "
            "(dsv4_kernels sparse-MLA (as SGLang's Triton backend)): kernels.attention: "
            "bundled") in flat
    assert "restart decode" in flat
