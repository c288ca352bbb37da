"""Every shipped profile's rendered output through the real tools.

``systemd-analyze verify`` (system and user scope), ``promtool check config``, and the real SGLang
0.5.23 and sglang-router 0.3.2 argument parsers. Any complaint fails; a missing tool fails too (CI
installs them: apt ``systemd``, ``prometheus``; the parsers via requirements/parsers.txt).

``systemd-analyze verify`` exits 0 on parse warnings, so stderr is the signal (env-probe §5). It
also requires ExecStart= to exist and be executable, so each tree is rendered with a temporary
install root and laid out as apply would (releases/1, current link).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.render.argv import engine_argv, router_argv
from tests.validate.helpers import materialize, render_path, shipped_profiles


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; CI must install it (scripts/setup.sh full)")
    return path


def verify_units(unit_dir: Path, scope: str, runtime_dir: Path) -> subprocess.CompletedProcess:
    cmd = [_tool("systemd-analyze"), "verify"]
    env = dict(os.environ)
    if scope == "user":
        # the user manager needs a runtime dir to initialise, even for verify
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
        cmd.append("--user")
    cmd += sorted(str(p) for p in unit_dir.glob("*.service"))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("scope", ["system", "user"])
@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_systemd_analyze_verify(path: Path, scope: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    _, dep, tree = render_path(path, install_root=str(root), scope=scope)
    current = materialize(tree, root)
    units = list((current / "units").glob("*.service"))
    assert len(units) == len(dep.roles) + (dep.router is not None)
    res = verify_units(current / "units", scope, tmp_path / "xdg")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert res.stdout == "", res.stdout


def test_verify_harness_catches_a_bad_unit(tmp_path: Path) -> None:
    """Control: the same call reports a misspelled key and a bad value."""
    root = tmp_path / "root"
    _, _, tree = render_path(shipped_profiles()[0], install_root=str(root))
    current = materialize(tree, root)
    unit = next((current / "units").glob("*.service"))
    text = unit.read_text().replace("Restart=on-failure", "Restart=sometimes\nEnviroment=X=1")
    bad = tmp_path / "bad" / unit.name
    bad.parent.mkdir()
    bad.write_text(text)
    res = verify_units(bad.parent, "system", tmp_path / "xdg")
    assert "restart specifier" in res.stderr and "Enviroment" in res.stderr


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_promtool_check_config(path: Path, tmp_path: Path) -> None:
    _, _, tree = render_path(path)
    tree.write(tmp_path)
    config = tmp_path / "monitoring" / "prometheus.yml"
    assert config.is_file()
    res = subprocess.run([_tool("promtool"), "check", "config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout and "WARNING" not in (res.stdout + res.stderr).upper()


def test_promtool_harness_catches_a_bad_config(tmp_path: Path) -> None:
    _, _, tree = render_path(shipped_profiles()[0])
    tree.write(tmp_path)
    config = tmp_path / "monitoring" / "prometheus.yml"
    config.write_text(config.read_text().replace("scrape_configs:", "scrape_cnofigs:"))
    res = subprocess.run([_tool("promtool"), "check", "config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_real_sglang_parser_accepts_every_engine_argv(path: Path) -> None:
    from tests.parsers import check_sglang_argv

    _, dep, _ = render_path(path)
    for role in dep.roles:
        assert check_sglang_argv(engine_argv(dep, role)) == [], role.name


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_real_router_parser_accepts_the_router_argv(path: Path) -> None:
    from tests.parsers import check_router_argv

    profile, dep, _ = render_path(path)
    if dep.router is None:
        assert profile.topology.mode == "colocated"
        return
    argv = router_argv(dep, worker_startup_timeout_s=profile.health.startup_timeout_s)
    assert check_router_argv(argv) == []


def test_real_parsers_catch_a_bad_argv() -> None:
    """Control: the same parsers reject an abbreviation and a bad choice."""
    from tests.parsers import check_router_argv, check_sglang_argv

    _, dep, _ = render_path(shipped_profiles()[0])
    argv = engine_argv(dep, dep.roles[0])
    argv[argv.index("--tp-size")] = "--tp"
    assert check_sglang_argv(argv)
    assert check_router_argv(["--pd-disaggregation", "--policy", "bogus"])
