"""Fixtures for integration tests against fake hosts (real sshd, real `systemd --user`).

Owns the session-scoped `hosts` fixture: two fake hosts from `tests.harness.HostCluster`, brought
up once per test session (per xdist worker) and torn down at the end, even after failures.
Tests that change a host (units, files, sim-control) must undo what they did or use names
no other test uses; `fresh_sim_control` resets the simulator control file of every host.
A missing sshd/ip/systemd makes the fixture raise, so the tests fail rather than skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import FakeHost, HostCluster


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
