"""Fixtures for the promtool tests: the shipped profiles resolved, and promtool itself.

promtool comes from the Debian package `prometheus` (requirements/apt-monitoring.txt). When it is
missing the fixture fails the test instead of skipping: CI must run these checks.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.deployment import Deployment
from orchestrator.paths import data_dir
from orchestrator.profile.loader import load_profile
from orchestrator.profile.schema import Profile
from orchestrator.render.resolve import load_inventory_for, resolve_profile


def shipped_profile_paths() -> list[Path]:
    paths = sorted(p for p in data_dir("profiles").glob("*.yaml") if p.name != "inventory.yaml")
    assert paths, "no shipped profiles found"
    return paths


def resolved(path: Path) -> tuple[Profile, Deployment]:
    profile = load_profile(path)
    return profile, resolve_profile(profile, load_inventory_for(path, None))


@pytest.fixture(scope="session")
def promtool() -> Callable[..., subprocess.CompletedProcess[str]]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not installed: apt-get install prometheus "
                    "(listed in requirements/apt-monitoring.txt)")

    def run(*args: str, cwd: Path | None = None, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], cwd=cwd, input=stdin, capture_output=True,
                              text=True, timeout=120)

    return run
