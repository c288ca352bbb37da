"""The host-side filesystem rules of orchestrator.remote.hostfs, run by this machine's sh on a
scratch tree (the integration twin, tests/integration/test_hostile_fs.py, runs them over SSH).

Covers what the harness host cannot stage: an install root that is itself a symbolic link, and one
under a world-writable directory such as /tmp (pytest's temp dirs live there).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator.remote import hostfs


def sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)


def test_root_under_tmp_is_refused_naming_the_world_writable_ancestor(tmp_path: Path) -> None:
    res = sh(hostfs.check_root(str(tmp_path / "root")))
    assert res.returncode == hostfs.REFUSED_RC
    assert "dsv4ctl refuses /tmp: it is writable by group or others (mode 1777)" in res.stderr


def test_root_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "root").symlink_to(tmp_path / "real")
    res = sh(hostfs.check_root(str(tmp_path / "root")))
    assert res.returncode == hostfs.REFUSED_RC
    assert f"dsv4ctl refuses {tmp_path}/root: it is a symbolic link" in res.stderr


def test_dirs_are_created_with_their_mode_and_links_below_the_root_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    res = sh(hostfs.ensure_dirs(str(root), "releases/r1", "secrets", mode="0700"))
    assert res.returncode == 0, res.stderr
    assert (root / "releases" / "r1").is_dir() and oct((root / "secrets").stat().st_mode)[-3:] == "700"
    victim = tmp_path / "victim"
    victim.mkdir()
    (root / "releases" / "r2").symlink_to(victim)
    res = sh(hostfs.ensure_dirs(str(root), "releases/r2/deeper"))
    assert res.returncode == hostfs.REFUSED_RC
    assert f"dsv4ctl refuses {root}/releases/r2: it is a symbolic link" in res.stderr
    assert list(victim.iterdir()) == []
    (root / "shared").mkdir()
    (root / "shared").chmod(0o777)
    res = sh(hostfs.ensure_dirs(str(root), "shared"))
    assert res.returncode == hostfs.REFUSED_RC and "(mode 777)" in res.stderr
