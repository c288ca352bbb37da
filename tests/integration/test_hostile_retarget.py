"""A saved plan binds its target (issue 31, Deliver 3).

Before: a plan saved against host A, then the inventory pointed the same host name at machine B;
apply re-probed B, found the same facts (same simulated GPUs, disks and an empty install root) and
switched the reviewed release onto B. Now the plan records the target's address and the host key
the probe saw, and apply refuses any other machine, naming both, before it writes anything there.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.harness.hosts import FakeHost
from tests.integration.test_apply import ROOT, Env, env  # noqa: F401  (env is a fixture)

pytestmark = pytest.mark.integration


def _point_at(e: Env, other: FakeHost) -> None:
    """The inventory's host 'h' now names machine B (address, key and known_hosts all B's)."""
    inv = yaml.safe_load(e.inventory_path.read_text())
    b = other.inventory_dict()
    inv["hosts"]["h"].update(address=b["address"], port=b["port"], user=b["user"], key=b["key"],
                             known_hosts=b["known_hosts"])
    e.inventory_path.write_text(yaml.safe_dump(inv))


def test_a_saved_plan_records_its_target_and_host_key(env: Env) -> None:  # noqa: F811
    plan = env.plan(env.profile())
    assert plan.target is not None
    assert plan.target.address == env.fake.address and plan.target.source == "inventory"
    assert plan.target.host_key and plan.target.host_key.split()[1].startswith("SHA256:")
    # the harness host's own key, fingerprinted by OpenSSH
    pub = env.fake.ssh_dir / "host_ed25519.pub"
    fp = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                        check=True).stdout.split()[1]
    assert plan.target.host_key == f"ssh-ed25519 {fp}"


def test_a_plan_for_machine_a_is_refused_on_machine_b_naming_both(
        env: Env, hosts: list[FakeHost], capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    b = hosts[1]
    b.exec(f"rm -rf {ROOT}/* {ROOT}/.[!.]*")
    saved = env.save(env.plan(env.profile()))
    _point_at(env, b)
    capsys.readouterr()
    rc = env.cli("apply", str(saved))
    err = " ".join(capsys.readouterr().err.split())
    assert rc != 0
    assert f"this plan was made for {env.fake.user}@{env.fake.address}:" in err, err
    assert f"host 'h' is now {b.user}@{b.address}:" in err and "a different machine" in err
    assert b.exec(f"ls -A {ROOT}").stdout.split() == [], "apply wrote on machine B"
    assert env.fake.exec(f"ls -A {ROOT}/releases 2>/dev/null").stdout.split() == []
