"""Fixtures for the promtool tests: promtool itself.

promtool comes from the Debian package `prometheus` (requirements/apt-monitoring.txt). When it is
missing the fixture fails the test instead of skipping: CI must run these checks. Shared helpers
live in `tests/promtool/support.py`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


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
