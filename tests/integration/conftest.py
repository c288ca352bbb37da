"""Fixtures for integration tests against fake hosts (real sshd, real `systemd --user`).

Owns the session-scoped `hosts` fixture: two fake hosts from `tests.harness.HostCluster`, brought
up once per test session (per xdist worker) and torn down at the end, even after failures.
Tests that change a host (units, files, sim-control) must undo what they did or use names
no other test uses; `fresh_sim_control` resets the simulator control file of every host.
A missing sshd/ip/systemd makes the fixture raise, so the tests fail rather than skip.

Also owns a guard: an apply whose profile leaves ``health.stability_window_s`` to the production
default (the router's detection time, 180 s) fails the test at once instead of idling through
the window (how CI went from 11 to 33 minutes); tests about the default mark themselves
``production_stability_window``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import FakeHost, HostCluster


@pytest.fixture(autouse=True)
def _test_sized_stability_window(request: pytest.FixtureRequest,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail an apply that would watch the production stability window (see module docstring).
    ``pytest.fail`` is a BaseException: the apply's own error handling does not turn it into a
    rollback, it ends the test with this message."""
    if request.node.get_closest_marker("production_stability_window"):
        return
    from orchestrator.apply import steps

    real = steps.stability_window_s

    def refuse(ctx: Any) -> float:
        window = real(ctx)
        if ctx.profile.health.stability_window_s is None:
            pytest.fail(f"{request.node.nodeid} applies a profile without "
                        f"health.stability_window_s: the apply would idle through the production "
                        f"default of {window:g} s. Set a test-sized window (tests/integration/"
                        "test_apply.py profile_dict uses 1.5 s), or mark the test "
                        "production_stability_window if the default is what it tests.")
        return window

    # the planner resolves the window (plan shows it); the apply's wait reads it here
    monkeypatch.setattr(steps, "stability_window_s", refuse)


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[FakeHost]]:
    """Two running fake hosts (host1, host2), reached as the unprivileged user dsv4op (uid 1500),
    whose `systemd --user` runs the engines and the router (issue 19); `exec(..., root=True)` for
    what only root may do on a host."""
    with HostCluster(n=2, workdir=tmp_path_factory.mktemp("fakehosts"), user="dsv4op") as cluster:
        yield cluster


@pytest.fixture
def fresh_sim_control(hosts: list[FakeHost]) -> Iterator[list[FakeHost]]:
    """Empty simulator control files on every host before and after the test."""
    for h in hosts:
        h.write_sim_control({})
    yield hosts
    for h in hosts:
        h.write_sim_control({})
