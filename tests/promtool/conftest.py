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
from orchestrator.planner.build import PlanContext, load_context, resolve_deployment
from orchestrator.profile.loader import load_inventory
from orchestrator.profile.schema import Profile


def shipped_profile_paths() -> list[Path]:
    paths = sorted(p for p in data_dir("profiles").glob("*.yaml") if p.name != "inventory.yaml")
    assert paths, "no shipped profiles found"
    return paths


def resolved(path: Path) -> tuple[Profile, Deployment]:
    """A profile file and its deployment, resolved the way `dsv4ctl plan` does (catalog facts)."""
    ctx = load_context(path, None)
    return ctx.profile, resolve_deployment(ctx)


def resolve_inline(profile: Profile) -> Deployment:
    """A profile built in a test, on the shipped inventory's host."""
    inv_path = data_dir("profiles") / "inventory.yaml"
    host_name = str(profile.host)
    host = load_inventory(inv_path).hosts[host_name]
    ctx = PlanContext(profile, None, "", host_name, host, inv_path)
    return resolve_deployment(ctx)


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
