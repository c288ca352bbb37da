"""Issue 19, Deliver 5 on a real host: a saved plan edited to name a unit
``dsv4-x$(touch …).service`` is refused as stale (exit 6) before anything runs on the host, and a
host-side release record naming such a unit cannot make the service manager run it either."""

from __future__ import annotations

import json

import pytest

from orchestrator.errors import RemoteError
from tests.integration import test_apply
from tests.integration.test_apply import ROOT, Env

env = test_apply.env  # the clean fake-host fixture of test_apply, registered here under its name


def test_saved_plan_with_a_hostile_unit_name_never_reaches_the_shell(env: Env) -> None:
    canary = f"{ROOT}/pwned-by-plan"
    plan = env.plan(env.profile())
    data = json.loads(plan.model_dump_json())
    data["deployment"]["roles"][0]["unit"] = f"dsv4-x$(touch {canary}).service"
    path = env.tmp / "hostile.json"
    path.write_text(json.dumps(data))
    assert env.cli("apply", str(path)) == 6
    assert env.fake.exec(f"test -e {canary}").returncode != 0
    assert env.current() is None  # nothing was applied


def test_service_manager_refuses_a_hostile_name_on_the_host(env: Env) -> None:
    from orchestrator.remote.connection import connect
    from orchestrator.remote.systemd import ServiceManager

    canary = f"{ROOT}/pwned-by-unit"
    with connect("h", env.host) as remote:
        svc = ServiceManager(remote, "user")
        for call in (lambda u: svc.stop([u]), lambda u: svc.remove_units([u]),
                     lambda u: svc.install_units(f"{ROOT}/current/units", [u])):
            with pytest.raises(RemoteError, match="refusing unit name"):
                call(f"dsv4-x$(touch {canary}).service")
    assert env.fake.exec(f"test -e {canary}").returncode != 0
