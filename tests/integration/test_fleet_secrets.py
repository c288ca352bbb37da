"""A fleet whose engines require an API key (issue 23 with issue 19's secrets): the real
sglang-router 0.3.2 in front of three engine hosts, every host's key read from the controller's
environment at apply time. The router presents that key to the engines and demands it from
clients; the rollout drives the router's worker API with it (drain, re-add). A rolling update
under a load loop that sends the key drops no request, and no key reaches the output.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import HostCluster
from tests.integration.test_fleet_rollout import (
    ENGINES,
    ROOT,
    Fleet,
    Load,
    engine_hosts,
    profile,
)

pytestmark = pytest.mark.integration
KEY = "sk-fleet-3b9e51c07d2a64f8"


class KeyedFleet(Fleet):
    key = KEY


def keyed(**serving: Any) -> dict[str, Any]:
    return {**profile(**serving), "secrets": {"DSV4_SECRET_API_KEY": {"env": "ITEST_FLEET_KEY"}}}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedFleet]:
    tmp = tmp_path_factory.mktemp("fleet-keyed")
    with HostCluster(n=4, workdir=tmp / "hosts") as hosts:
        engine_hosts(hosts)
        yield KeyedFleet(hosts, tmp)


def test_keyed_fleet_rolls_out_under_load_and_never_shows_the_key(
        fleet: KeyedFleet, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ITEST_FLEET_KEY", KEY)
    assert fleet.apply(keyed()) == 0
    assert fleet.chat_as(KEY) == 200
    assert fleet.chat_as(None) == 401 and fleet.chat_as("sk-wrong") == 401
    assert len(fleet.workers()) == 3
    before = {h: fleet.current(h) for h in ENGINES}
    with Load(fleet) as load:
        time.sleep(1.0)
        rc = fleet.apply(keyed(cuda_graph_max_bs=32), "profile-v2.yaml")
        time.sleep(1.0)
    shown = capsys.readouterr()
    assert rc == 0, shown.out[-2000:] + shown.err[-2000:]
    assert load.failed == [], f"{len(load.failed)} failed requests: {load.failed[:10]}"
    assert load.ok > 10
    for h in ENGINES:
        assert fleet.current(h) != before[h], h
    journal = fleet.journals()[-1]
    assert all(o["drained"] for o in journal["outcomes"] if o["host"] in ENGINES)
    assert KEY not in shown.out + shown.err
    for h in (*ENGINES, "router-1"):
        assert KEY not in json.dumps(journal) and KEY not in fleet.fakes[h].exec(
            f"cat {ROOT}/releases/*/record.json").stdout


class _Tty:
    """A person at a terminal who answers ``answer`` to the prompt."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self.answer


def test_secrets_only_rotation_asks_first_and_names_the_restarts(
        fleet: KeyedFleet, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The fleet's profile unchanged, only the key's value rotated on the controller: no plan can
    show it (values never enter one), but every running role on every host restarts for it. The
    apply says so and asks once, naming the hosts; "n" changes nothing. Before: a fleet asked
    only when its plan had changes, so this rotation restarted every host without a prompt."""
    import sys

    monkeypatch.setenv("ITEST_FLEET_KEY", KEY)
    before = {h: fleet.current(h) for h in (*ENGINES, "router-1")}
    monkeypatch.setenv("ITEST_FLEET_KEY", KEY + "-rotated")
    monkeypatch.setattr(sys, "stdin", _Tty("n\n"))
    capsys.readouterr()
    path = fleet.tmp / "profile-v2.yaml"  # the profile the last rollout applied, as it was
    from orchestrator.cli import main

    rc = main(["apply", str(path), "-i", str(fleet.inventory)])
    shown = capsys.readouterr()
    text = " ".join((shown.out + shown.err).split())
    assert rc == 1, text[-2000:]
    assert ("Secrets: a value differs from the one the running roles read on gpu-a, gpu-b, "
            "gpu-c, router-1") in text, text
    assert "restarts every running role on gpu-a, gpu-b, gpu-c, router-1" in text
    assert "cancelled at the prompt; nothing was changed" in text
    assert {h: fleet.current(h) for h in before} == before
    assert KEY not in text
    assert fleet.chat_as(KEY) == 200  # still the old key: nothing restarted
