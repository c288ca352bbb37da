"""Issue 31, Deliver 7: paths are normalised before every comparison, on both sides.

Before: install_root ``/srv/.``, ``//etc`` and ``/./etc`` passed the system-directory check as
strings, and an apply with ``/srv/.`` put ``releases/``, ``current`` and the lock into ``/srv``.
The controller side normalises every absolute path of the schema; the host side compares the
real path (``pwd -P``) of the install root with the system directories.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from orchestrator.profile.inventory import Host
from orchestrator.profile.types import AbsPath
from orchestrator.remote import hostfs


@pytest.mark.parametrize("root", ["/srv/.", "//etc", "/./etc", "/srv//", "/etc/./", "///",
                                  "/usr/./local", "//usr//local/"])
def test_install_roots_that_name_a_system_directory_are_refused_however_spelt(root: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Host(address="h", install_root=root, gpus=None)
    assert exc.value.errors()[0]["loc"] == ("install_root",)
    assert "system directory" in str(exc.value) or "operating system" in str(exc.value)


@pytest.mark.parametrize(("raw", "norm"), [("/srv/dsv4/.", "/srv/dsv4"), ("//models//x/", "/models/x"),
                                           ("/./a/./b", "/a/b"), ("/", "/")])
def test_absolute_paths_are_normalised(raw: str, norm: str) -> None:
    assert TypeAdapter(AbsPath).validate_python(raw) == norm


def test_the_host_refuses_a_root_whose_real_path_is_a_system_directory(tmp_path: Path) -> None:
    """A link above the root (/srv/dsv4 -> /etc on a host) is seen on the host: the real path."""
    # check_root refuses a root that is itself a link; a link above it is what dsv4_root
    # resolves: enter through one
    (tmp_path / "via").symlink_to("/")
    res = subprocess.run(["sh", "-c", hostfs.check_root(f"{tmp_path}/via/etc/.")],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == hostfs.REFUSED_RC
    assert "its real path /etc is a system directory" in res.stderr, res.stderr


# ------------------------------------------ inventory discovery refuses others' files (31) ---

def _discover(tmp_path: Path, dir_mode: int, file_mode: int) -> Path:
    from orchestrator.paths import data_dir

    d = tmp_path / "shared"
    d.mkdir()
    (d / "inventory.yaml").write_text((data_dir("profiles") / "inventory.yaml").read_text())
    (d / "p.yaml").write_text((data_dir("profiles") / "default.yaml").read_text())
    os.chmod(d / "inventory.yaml", file_mode)
    os.chmod(d, dir_mode)
    return d / "p.yaml"


@pytest.mark.parametrize(("dir_mode", "file_mode", "why"), [
    (0o777, 0o644, "its directory is writable by group or others (mode 0777)"),
    (0o1777, 0o644, "its directory is writable by group or others (mode 1777)"),
    (0o755, 0o666, "it is writable by group or others (mode 0666)"),
])
def test_a_discovered_inventory_others_can_write_is_refused(
        tmp_path: Path, dir_mode: int, file_mode: int, why: str) -> None:
    from orchestrator.errors import DsvError
    from orchestrator.planner.fleet import plan_from_paths

    profile = _discover(tmp_path, dir_mode, file_mode)
    with pytest.raises(DsvError) as exc:
        plan_from_paths(profile)
    text = " ".join(exc.value.render().split())
    assert why in text and "--inventory" in text


def test_an_inventory_named_on_the_command_line_is_the_operators_choice(tmp_path: Path) -> None:
    from orchestrator.planner.fleet import plan_from_paths

    profile = _discover(tmp_path, 0o777, 0o644)
    assert plan_from_paths(profile, profile.parent / "inventory.yaml").host == "gpu-host"
