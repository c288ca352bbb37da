"""The kernels step of apply: ship the bundled `kernels/` package inside the target release
(`releases/<id>/kernels/`, imported by the engine through `current`), install the .pth hook, run the
self-test, and map the self-test's exit code to the journal.

Runs the step's real shell commands (tar) on this machine through a local shell; the engine env's
`python` is a small script that records its calls (with the PYTHONPATH they see) and plays the
self-test's documented contract (one JSON document; exit 0 pass, 1 mismatch).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.apply.steps import Context, StepFailed, install_kernels, kernels_source
from orchestrator.catalog import load_catalog
from orchestrator.deployment import resolve
from orchestrator.kernel_paths import decide
from orchestrator.profile import load_text
from orchestrator.profile.inventory import Host
from orchestrator.profile.schema import Profile
from tests.unit.test_release import LocalShell

FAKE_PYTHON = """#!/bin/sh
case "$*" in
  *"-m pip "*) echo "$*" >> "$(dirname "$0")/../pip.log"; exit 0;;
  *"-m dsv4_kernels.sglang_hook install"*) d="$(dirname "$0")/.."
                                           echo "PYTHONPATH=$PYTHONPATH $*" >> "$d/hook.log"
                                           [ -f "$d/hook.rc" ] && exit "$(cat "$d/hook.rc")"; exit 0;;
  *"-m dsv4_kernels.selftest"*) d="$(dirname "$0")/.."; echo "$*" >> "$d/selftest.log"
                                cat "$d/selftest.out"
                                exit "$(cat "$d/selftest.rc")";;
esac
exit 99
"""


@pytest.fixture(autouse=True)
def env_checked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The step checks the engine env before running its python (issue 31); the check itself
    (tests/unit/test_hostile_engine_env_check.py) rightly refuses an env under pytest's /tmp, so here it
    only records that it was asked, and the fake python records that it ran after."""
    asked: list[str] = []
    monkeypatch.setattr("orchestrator.remote.probes.require_engine_env",
                        lambda shell, env, host: asked.append(env))
    return asked


def make_ctx(tmp: Path, selftest: bool) -> Context:
    env = tmp / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text(FAKE_PYTHON)
    (env / "bin" / "python").chmod(0o755)
    prof = load_text(Profile, yaml.safe_dump({
        "name": "k", "host": "h", "engine": {"env": str(env)},
        "model": {"variant": "dsv4-flash-nvfp4", "path": "/models/x"},
        "topology": {"mode": "colocated", "engine": {"gpus": [0], "tp": 1}},
        "kernels": {"enabled": True, "selftest": selftest}}), "p.yaml")
    # the inventory refuses an install_root under /tmp; this test's LocalShell writes under tmp
    host = Host(address="h", gpus={"model": "x", "count": 1}).model_copy(
        update={"install_root": str(tmp / "root")})
    (tmp / "root").mkdir()
    lines: list[str] = []
    ctx = Context(remote=LocalShell(), host_name="h", host=host,  # type: ignore[arg-type]
                  out=lines.append, now=lambda: datetime.now(UTC), command="t")
    dep = resolve(prof, "h", host, default_index_topk=512, max_context_length=1024)
    # the kernel paths as plan decides them on an sm_120 host (kernels.enabled: true is auto:
    # only the mHC pre GEMM is bundled there)
    ctx.deployment = decide(load_catalog().engine("sglang", "0.5.23"), dep, "sm_120", 64,
                            dict(dep.kernel_choices))
    ctx.profile = prof
    ctx.target = "r1"
    return ctx


def outcome(tmp: Path, rc: int, report: dict[str, Any], selftest: bool = True) -> Any:
    ctx = make_ctx(tmp, selftest)
    (tmp / "env" / "selftest.out").write_text(json.dumps(report, indent=2) + "\n")
    (tmp / "env" / "selftest.rc").write_text(str(rc))
    return install_kernels(ctx, None), ctx


def test_kernels_installed_and_selftest_passes(tmp_path: Path, env_checked: list[str]) -> None:
    res, _ = outcome(tmp_path, 0, {"passed": True, "gpus": ["NVIDIA H200"]})
    assert "self-test passed" in res.detail and '"passed":true' in res.detail
    # issue 20 item 6: the package lives in the release, nothing is pip-installed into the env
    pkg = tmp_path / "root" / "releases" / "r1" / "kernels"
    assert (pkg / "pyproject.toml").is_file()
    assert (pkg / "dsv4_kernels" / "selftest.py").is_file()
    assert not list(pkg.rglob("__pycache__")) and not (pkg / "tests").exists()
    assert json.loads((pkg / "selftest.json").read_text())["passed"] is True
    assert not (tmp_path / "env" / "pip.log").exists()
    assert not (tmp_path / "root" / "kernels").exists()
    hook = (tmp_path / "env" / "hook.log").read_text()
    assert f"PYTHONPATH={pkg} " in hook and "sglang_hook install" in hook
    assert kernels_source().name == "kernels"
    assert env_checked == [str(tmp_path / "env")]
    # the self-test checks only what the release runs bundled
    assert (tmp_path / "env" / "selftest.log").read_text().split() == [
        "-m", "dsv4_kernels.selftest", "--ops", "mhc_pre"]


def test_kernels_hook_refusal_fails_the_step(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir(parents=True, exist_ok=True)
    (tmp_path / "env" / "hook.rc").write_text("1")
    with pytest.raises(Exception, match="activation hook"):
        outcome(tmp_path, 0, {"passed": True})


def test_kernels_selftest_mismatch_fails_the_step(tmp_path: Path) -> None:
    with pytest.raises(StepFailed, match=r"self-test failed \(exit 1\)") as exc:
        outcome(tmp_path, 1, {"passed": False, "failures": ["decode case 2: max err 0.3"]})
    assert "decode case 2" in exc.value.message and "kernels.<op> to engine" in exc.value.fix


def test_kernels_selftest_disabled(tmp_path: Path) -> None:
    res, _ = outcome(tmp_path, 1, {}, selftest=False)
    assert "self-test disabled" in res.detail


def _git(repo: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def test_kernels_step_ships_only_the_tracked_package(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: the host gets pyproject.toml and the tracked dsv4_kernels modules; an untracked
    build/, an untracked module, tests, tools and experiments stay behind."""
    from orchestrator.apply import steps

    src = tmp_path / "repo" / "kernels"
    for rel, text in {"pyproject.toml": "[project]\n", "dsv4_kernels/__init__.py": "",
                      "dsv4_kernels/selftest.py": "", "tests/test_x.py": "",
                      "tools/bench.py": "", "experimental/x/y.py": "",
                      "README.md": "#\n"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    _git(src.parent, "init", "-q")
    _git(src.parent, "add", ".")
    _git(src.parent, "commit", "-qm", "k")
    for rel in ("build/lib/dsv4_kernels/__init__.py", "dsv4_kernels/scratch.py",
                "dsv4_kernels/__pycache__/selftest.cpython-311.pyc", "dsv4_kernels.egg-info/PKG"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("x")
    want = ["dsv4_kernels/__init__.py", "dsv4_kernels/selftest.py", "pyproject.toml"]
    assert steps.kernels_package_files(src) == want
    monkeypatch.setattr(steps, "kernels_source", lambda: src)
    host = tmp_path / "host"
    host.mkdir()
    res, _ = outcome(host, 0, {"passed": True})
    assert "self-test passed" in res.detail
    pkg = host / "root" / "releases" / "r1" / "kernels"
    got = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*")
                 if p.is_file() and p.name != "selftest.json")
    assert got == want


def test_kernels_package_files_outside_a_checkout(tmp_path: Path) -> None:
    from orchestrator.apply.steps import kernels_package_files

    src = tmp_path / "kernels"
    (src / "dsv4_kernels" / "__pycache__").mkdir(parents=True)
    (src / "pyproject.toml").write_text("")
    (src / "dsv4_kernels" / "a.py").write_text("")
    (src / "dsv4_kernels" / "__pycache__" / "a.pyc").write_text("")
    (src / "NOTES.md").write_text("")
    assert kernels_package_files(src) == ["dsv4_kernels/a.py", "pyproject.toml"]


def test_engine_imports_the_kernels_of_the_release_current_points_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 6: r1 and r2 ship different kernels; with the engine env's .pth hook line and
    the PYTHONPATH render gives the engine, a Python started after `current` -> r2 imports r2's
    kernels, and after the switch back to r1 (a rollback) r1's, not the newest install's."""
    import shutil
    import subprocess
    import sys

    from dsv4_kernels import sglang_hook

    from orchestrator.apply import steps
    from orchestrator.render import kernels_path

    real = kernels_source()
    srcs = []
    for n in ("1", "2"):
        src = tmp_path / f"src{n}"
        for rel in steps.kernels_package_files(real):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(real / rel, src / rel)
        with (src / "dsv4_kernels" / "__init__.py").open("a") as f:
            f.write(f"RELEASE_MARK = {n!r}\n")
        srcs.append(src)
    host = tmp_path / "host"
    host.mkdir()
    ctx = make_ctx(host, selftest=False)
    for rid, src in zip(("r1", "r2"), srcs, strict=True):
        monkeypatch.setattr(steps, "kernels_source", lambda src=src: src)
        ctx.target = rid
        install_kernels(ctx, None)
    site = tmp_path / "site"  # the engine env's site-packages, holding the hook's .pth line
    site.mkdir()
    (site / sglang_hook.PTH_NAME).write_text(sglang_hook.PTH_LINE)
    root = host / "root"
    assert ctx.deployment is not None
    probe = ("import site, sys; site.addsitedir(sys.argv[1]); "
             "assert 'dsv4_kernels.sglang_hook' in sys.modules, 'the .pth line did not run'; "
             "import dsv4_kernels as k; from dsv4_kernels import sglang_hook as h; "
             "print(k.RELEASE_MARK, h.loaded_from())")

    def engine_start(release: str) -> str:
        (root / "current").unlink(missing_ok=True)
        (root / "current").symlink_to(f"releases/{release}")
        env = {"PATH": "/usr/bin:/bin", "DSV4_KERNELS_SGLANG": "1",
               "PYTHONPATH": kernels_path(ctx.deployment.install_root)}
        res = subprocess.run([sys.executable, "-c", probe, str(site)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60, check=True)
        return res.stdout.strip()

    assert engine_start("r2") == f"2 {root / 'releases' / 'r2' / 'kernels'}"
    assert engine_start("r1") == f"1 {root / 'releases' / 'r1' / 'kernels'}"  # the rollback


def test_status_reads_the_line_the_hook_logs() -> None:
    # two packages spell the line (the core may not import the kernels); this pins that they agree
    from dsv4_kernels import sglang_hook

    from orchestrator.apply.kernels_seen import KERNELS_LOG, kernels_loaded

    assert sglang_hook.ACTIVE_LOG == KERNELS_LOG
    log = (f"{KERNELS_LOG} (pid 7): kernels from /srv/dsv4/releases/r2/kernels\n"
           "noise\n"
           f"{KERNELS_LOG} (pid 71): kernels from /srv/dsv4/releases/r9/kernels\n"
           f"{KERNELS_LOG} (pid 7): kernels from /srv/dsv4/releases/r1/kernels\n")
    assert kernels_loaded(log, 7) == "/srv/dsv4/releases/r1/kernels"  # the last start of pid 7
    assert kernels_loaded(log, 71) == "/srv/dsv4/releases/r9/kernels"
    assert kernels_loaded(log, 8) is None
