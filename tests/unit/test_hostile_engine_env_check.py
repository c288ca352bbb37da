"""Issue 31, Deliver 2 (offline half): the engine environment is checked like install_root.

Before: a local user who could write the engine environment's ``bin/`` (mode 0777) replaced
``bin/python``, and dsv4ctl ran it over SSH as the deploying user during the kernels step; plan said
nothing, although install_root with the same mode is refused. ``hostfs.check_engine_env`` runs here
with this machine's sh on a scratch env under the user's home (pytest's temp dirs live under the
world-writable /tmp, which the check refuses as an ancestor, rightly); the harness twin,
tests/integration/test_hostile_engine_env.py, runs it over SSH through apply and plan.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.remote import hostfs


def sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


@pytest.fixture
def env() -> Iterator[Path]:
    home = Path.home()
    if os.stat(home).st_mode & 0o022 or os.stat(home).st_uid not in (0, os.getuid()):
        pytest.skip("the home directory is not a trusted place for a scratch env")
    d = Path(tempfile.mkdtemp(prefix=".dsv4-envtest-", dir=home))
    try:
        os.chmod(d, 0o755)
        (d / "bin").mkdir(mode=0o755)
        (d / "lib").mkdir(mode=0o755)
        (d / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
        yield d
    finally:
        shutil.rmtree(d)


def test_a_trusted_env_passes(env: Path) -> None:
    res = sh(hostfs.check_engine_env(str(env)))
    assert res.returncode == 0, res.stderr


def test_a_world_writable_bin_is_refused(env: Path) -> None:
    os.chmod(env / "bin", 0o777)
    res = sh(hostfs.check_engine_env(str(env)))
    assert res.returncode == hostfs.REFUSED_RC
    assert f"dsv4ctl refuses {env}/bin: it is writable by group or others (mode 777)" in res.stderr
    assert "engine environment (engine.env)" in res.stderr


def test_an_interpreter_that_is_not_a_link_and_others_can_write_is_refused(env: Path) -> None:
    (env / "bin" / "python").unlink()
    shutil.copy(os.path.realpath(sys.executable), env / "bin" / "python")
    os.chmod(env / "bin" / "python", 0o757)
    res = sh(hostfs.check_engine_env(str(env)))
    assert res.returncode == hostfs.REFUSED_RC
    assert f"{env}/bin/python: it is writable by group or others" in res.stderr


def test_an_interpreter_link_to_a_file_others_can_write_is_refused(env: Path) -> None:
    (env / "bin" / "python").unlink()
    target = env / "lib" / "python3"
    target.write_text("#!/bin/sh\n")
    os.chmod(target, 0o777)
    (env / "bin" / "python").symlink_to("../lib/python3")
    res = sh(hostfs.check_engine_env(str(env)))
    assert res.returncode == hostfs.REFUSED_RC
    assert "lib/python3: it is writable by group or others" in res.stderr


def test_a_writable_file_deep_in_the_env_is_refused(env: Path) -> None:
    pkg = env / "lib" / "site-packages" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    os.chmod(pkg / "__init__.py", 0o666)
    res = sh(hostfs.check_engine_env(str(env)))
    assert res.returncode == hostfs.REFUSED_RC
    assert f"{pkg}/__init__.py: it is inside the engine environment" in res.stderr


def test_an_env_under_a_world_writable_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    res = sh(hostfs.check_engine_env(str(tmp_path / "env")))
    assert res.returncode == hostfs.REFUSED_RC
    assert "dsv4ctl refuses /tmp: it is writable by group or others" in res.stderr


def test_a_missing_env_or_interpreter_is_named(env: Path) -> None:
    res = sh(hostfs.check_engine_env(str(env) + "-missing"))
    assert res.returncode == hostfs.REFUSED_RC and "not a directory" in res.stderr
    (env / "bin" / "python").unlink()
    res = sh(hostfs.check_engine_env(str(env)))
    assert res.returncode == hostfs.REFUSED_RC and "has no interpreter" in res.stderr
