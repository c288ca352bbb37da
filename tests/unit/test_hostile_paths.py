"""Issue 31, Deliver 7: paths are normalised before every comparison, on both sides.

Before: install_root ``/srv/.``, ``//etc`` and ``/./etc`` passed the system-directory check as
strings, and an apply with ``/srv/.`` put ``releases/``, ``current`` and the lock into ``/srv``.
The controller side normalises every absolute path of the schema; the host side compares the
real path (``pwd -P``) of the install root with the system directories.
"""

from __future__ import annotations

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
