"""End to end on a host whose SSH user, `systemd --user` manager, engine simulators and router are
an unprivileged user (uid 1500), not root (issue 19, Deliver 2): apply, health, an automatic
rollback, an explicit rollback.

The session's hosts (tests/integration/conftest.py) are `HostCluster(user="dsv4op")`: each host has
a user that exists only in its own mount namespace, owning the install root, the engine env and its
cgroup subtree, and nothing else. Every process dsv4ctl starts must run as it.
"""

from __future__ import annotations

import pytest

from orchestrator.errors import ExitCode
from tests.integration.test_apply import (  # noqa: F401  (env is a fixture)
    ROOT,
    Env,
    decode_knob,
    env,
    first_release,
    rule,
)

pytestmark = pytest.mark.integration

USER = "dsv4op"
UNITS = ("dsv4-itest-prefill.service", "dsv4-itest-decode.service", "dsv4-itest-router.service")


def uids_of_units(e: Env) -> dict[str, int]:
    out = {}
    for unit in UNITS:
        pid = e.fake.systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip()
        assert pid.isdigit() and pid != "0", (unit, pid)
        out[unit] = int(e.fake.exec(f"stat -c %u /proc/{pid}").stdout.strip())
    return out


def assert_sandboxed(e: Env) -> None:
    """Each unit's main process runs in a user namespace of its own (PrivateUsers=yes), mapping only
    uid 1500, with a read-only root (ProtectSystem=strict) and only the logs writable: the
    sandbox the user manager really applied, not only what the unit file asks for."""
    manager_ns = e.fake.exec("readlink /proc/self/ns/user").stdout.strip()
    for unit in UNITS:
        pid = e.fake.systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip()
        ns = e.fake.exec(f"readlink /proc/{pid}/ns/user").stdout.strip()
        assert ns.startswith("user:[") and ns != manager_ns, (unit, ns, manager_ns)
        assert e.fake.exec(f"cat /proc/{pid}/uid_map").stdout.split() == ["1500", "1500", "1"]
        mounts = {f[4]: f[5].split(",") for f in (line.split() for line in e.fake.exec(
            f"cat /proc/{pid}/mountinfo").stdout.splitlines())}
        assert "ro" in mounts["/"], (unit, mounts["/"])
        assert "ro" in mounts[f"/home/{USER}"], (unit, mounts[f"/home/{USER}"])  # ProtectHome
        assert "rw" in mounts[f"{ROOT}/logs"], (unit, sorted(mounts))


def test_apply_health_and_rollbacks_as_an_unprivileged_user(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    fake = env.fake
    assert fake.user == USER and fake.uid == 1500
    assert fake.exec("id -u").stdout.strip() == "1500"
    manager = fake.exec("pgrep -u 1500 -x systemd").stdout.split()
    assert manager, "the user's systemd --user manager does not run as uid 1500"
    assert fake.exec(f"stat -c %U {ROOT}").stdout.strip() == USER

    r1 = first_release(env)  # apply + health + smoke through the router
    assert env.serves()
    assert set(uids_of_units(env).values()) == {1500}
    assert_sandboxed(env)
    # nothing dsv4ctl wrote under the install root belongs to root
    assert fake.exec(f"find {ROOT} -uid 0 | head -5").stdout == ""

    # a change that never becomes ready is rolled back by itself; the old release serves
    fake.write_sim_control(rule("--cuda-graph-max-bs-decode 32", {"never_ready": True}))
    capsys.readouterr()
    assert env.apply(decode_knob(env, 32), name="p2.json") == ExitCode.ROLLED_BACK
    env.assert_recovered(r1)
    fake.write_sim_control({})

    # a healthy change, then an explicit rollback to r1
    assert env.apply(decode_knob(env, 16), name="p3.json") == 0
    r3 = env.current()
    assert r3 not in (None, r1)
    assert env.cli("rollback", r1, "--host", "h") == 0
    env.assert_recovered(r1)
    assert set(uids_of_units(env).values()) == {1500}
