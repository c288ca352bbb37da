"""A router that is really back (issue 30, Deliver 5): one PD host behind its own real
sglang-router 0.3.2, a load loop through that router while an apply fails and its restore fails
too. The failed requests open the router's circuit breakers (10 failures, 60 s in 0.3.2's
defaults) for the host's workers, the prefill's included.

- `status` counts a role healthy only if a generation through the router works: with every
  engine healthy again but the circuits open, it says not healthy and why (before: healthy, while
  generation through the router answered 503).
- The printed `dsv4ctl rollback r1 --host h` resets the router's view of the workers it touched
  (removed and re-added, said in the journal) and then serves (before: exit 4 at smoke, "No
  available prefill workers (all circuits open or unhealthy)").
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from orchestrator.errors import ExitCode
from tests.integration import test_apply
from tests.integration.test_apply import ROOT, Env, decode_knob, first_release, rule

pytestmark = pytest.mark.integration
env = test_apply.env  # the clean fake-host fixture of test_apply, registered here under its name
DECODE = "dsv4-itest-decode.service"


class Load:
    """Two clients generating through the host's router until stopped."""

    def __init__(self, env: Env) -> None:
        self.env, self.stop = env, threading.Event()
        self.codes: list[int | None] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]

    def _loop(self) -> None:
        while not self.stop.is_set() and len(self.codes) < 5000:
            self.codes.append(self.env.generate_status())
            time.sleep(0.05)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def _status(env: Env, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    rc = env.cli("status", "--host", "h", "--format", "json")
    return rc, json.loads(capsys.readouterr().out)


def test_a_restore_resets_the_router_and_status_asks_the_router(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    r1 = first_release(env)
    env.fake.write_sim_control(rule("--disaggregation-mode decode", {"never_ready": True}))
    with Load(env) as load:
        time.sleep(0.5)
        assert env.apply(decode_knob(env, 32), name="p2.json") == ExitCode.ROLLBACK_FAILED
    assert any(c != 200 for c in load.codes), "the failure never reached the load loop"
    assert env.current() == r1
    # the cause is fixed and the decode restarted by hand: every engine answers its own checks
    env.fake.write_sim_control({})
    env.fake.systemctl("restart", DECODE, check=True)
    def settled(st: dict[str, Any]) -> bool:  # every engine answers its own checks again
        return all(r["ok"] or "generation through the router fails" in r["message"]
                   for r in st["roles"])

    deadline = time.monotonic() + 30
    rc, st = _status(env, capsys)
    while not settled(st) and time.monotonic() < deadline:
        time.sleep(0.5)
        rc, st = _status(env, capsys)
    through = env.generate_status()
    if through == 200:
        pytest.fail("the router serves again on its own: the circuits did not stay open, the "
                    "case does not reproduce")
    # the engines are ready, the router refuses: status says not healthy, and why
    assert rc == 1 and st["healthy"] is False, st
    assert all("generation through the router fails" in r["message"] for r in st["roles"]), st
    # the printed recovery works under load: the router's view of the workers is reset first
    capsys.readouterr()
    with Load(env) as load:
        rc = env.cli("rollback", r1, "--host", "h")
        time.sleep(1.0)
    said = " ".join(capsys.readouterr().out.split())
    assert rc == 0, said[-3000:]
    assert "removed and re-added" in said
    rec = json.loads(env.fake.read(f"{ROOT}/releases/{r1}/record.json"))
    steps = {e["step"]: e for e in rec["journal"]}
    assert steps["rollback:router"]["result"] == "ok"
    assert "circuit" in steps["rollback:router"]["detail"]
    assert steps["rollback:smoke"]["result"] == "ok"
    assert env.serves()
    assert load.codes[-5:] == [200] * 5, load.codes[-20:]
    rc, st = _status(env, capsys)
    assert rc == 0 and st["healthy"], st
