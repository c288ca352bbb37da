"""Suite-wide pytest options and helpers.

``--update-golden`` rewrites golden files instead of comparing against them; without it a golden test
fails with a diff. Regenerated goldens are reviewed like code before they are committed. The
environment dsv4ctl sees is fixed for the session (no ``COLUMNS``, a state folder of its own).
Every ``dsv4ctl`` command an in-process CLI run prints is checked right after that run
(tests/printed_commands.py); a violation fails the test that made the run.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files from the current output instead of comparing")


class Golden:
    """Compare text with a file under tests/golden/, or rewrite it with --update-golden."""

    def __init__(self, update: bool) -> None:
        self.update = update

    def check(self, relpath: str, actual: str) -> None:
        path = REPO / "tests" / "golden" / relpath
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"golden file {path.relative_to(REPO)} is missing; run pytest --update-golden "
                        "and review it")
        expected = path.read_text(encoding="utf-8")
        if expected != actual:
            diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                                f"golden/{relpath}", "actual"))
            pytest.fail(f"output differs from golden/{relpath} (pytest --update-golden to accept):\n"
                        + diff)


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    import os

    update = bool(request.config.getoption("--update-golden")) or os.environ.get(
        "DSV4_UPDATE_GOLDEN") == "1"
    return Golden(update)


PINNED_KERNELS_DIGEST = "0" * 64


@pytest.fixture(autouse=True)
def _pinned_kernels_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release records the digest of the kernels package it ships (``kernels.json``); in tests
    it is pinned, so goldens and byte-for-byte comparisons do not move with every kernels commit.
    Tests about the digest itself set their own."""
    from orchestrator import kernels_package

    monkeypatch.setattr(kernels_package, "digest", lambda: PINNED_KERNELS_DIGEST)


@pytest.fixture(autouse=True, scope="session")
def _controller_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The environment dsv4ctl runs in during tests, the same however the suite is started.

    - No ``COLUMNS``/``LINES``: output is folded at 100 columns in a pipe unless ``COLUMNS`` says
      otherwise, and tests compare folded text. pytest imports readline (``_readline_workaround``),
      which sets ``COLUMNS=80 LINES=24`` in the C environment; a serial run's ``os.environ`` never
      sees them, but pytest-xdist workers inherit them, so their output was folded at 80 and
      tests comparing it failed only under ``scripts/run-tests.sh``. Tests about ``COLUMNS`` set it.
    - ``$XDG_STATE_HOME`` in a folder of the session (of each xdist worker): a record a host
      cannot take is kept on the controller there (``~/.local/state/dsv4ctl`` by default) until
      the next run, so nothing lands in the home of whoever runs the suite and no run sees another
      run's leftovers. Tests about that folder set their own.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("COLUMNS", raising=False)
        mp.delenv("LINES", raising=False)
        mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
        yield


# Every dsv4ctl command a CLI run prints is checked right after the run (tests/printed_commands.py):
# runnable as printed, acting on that run's deployment. A violation fails the test whose run
# printed it (setup, call or teardown: a fixture's run counts for the test it serves).
def pytest_configure(config: pytest.Config) -> None:
    from tests.printed_commands import COLLECTOR

    COLLECTOR.install()


def _printed_commands_phase() -> Iterator[None]:
    from tests.printed_commands import COLLECTOR

    COLLECTOR.take()  # runs outside any test (collection) are not this test's
    try:
        yield
    finally:
        violations = COLLECTOR.take()
    if violations:
        pytest.fail("a printed dsv4ctl command is not runnable as printed on the run's "
                    "deployment (issue 32):\n" + "\n".join(str(v) for v in violations),
                    pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _printed_commands_phase()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _printed_commands_phase()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _printed_commands_phase()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.printed_commands import COLLECTOR

    if COLLECTOR.commands:
        terminalreporter.write_line(f"printed dsv4ctl commands checked: {COLLECTOR.commands}")
