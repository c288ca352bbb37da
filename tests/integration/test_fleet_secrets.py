"""A fleet whose engines require an API key (issue 23 with issue 19's secrets): the real
sglang-router 0.3.2 in front of three engine hosts, every host's key read from the controller's
environment at apply time. The router presents that key to the engines and demands it from
clients; the rollout drives the router's worker API with it (drain, re-add). A rolling update
under a load loop that sends the key drops no request, and no key reaches the output.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import HostCluster
from tests.integration.test_fleet_rollout import ENGINES, MODEL, ROOT, Fleet, Load, profile

pytestmark = pytest.mark.integration
KEY = "sk-fleet-3b9e51c07d2a64f8"


class KeyedFleet(Fleet):
    def chat(self) -> int:
        return self.chat_with(KEY)

    def chat_with(self, key: str | None) -> int:
        body = json.dumps({"model": "deepseek-v4-flash", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "What is 6 * 7?"}]}).encode()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.router_url + "/v1/chat/completions", data=body,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 599

    def workers(self) -> list[dict[str, Any]]:
        req = urllib.request.Request(self.router_url + "/workers",
                                     headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["workers"]


def keyed(**serving: Any) -> dict[str, Any]:
    return {**profile(**serving), "secrets": {"DSV4_SECRET_API_KEY": {"env": "ITEST_FLEET_KEY"}}}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedFleet]:
    tmp = tmp_path_factory.mktemp("fleet-keyed")
    with HostCluster(n=4, workdir=tmp / "hosts") as hosts:
        for h in hosts[:3]:
            h.exec(f"mkdir -p {MODEL} && printf '%s' '{{\"metadata\": {{\"total_size\": "
                   f"158000000000}}, \"weight_map\": {{}}}}' > {MODEL}/model.safetensors.index.json",
                   check=True)
            h.write_sim_control({"by_mode": {"unified": {"ttft_s": 0.3}}})
        yield KeyedFleet(hosts, tmp)


def test_keyed_fleet_rolls_out_under_load_and_never_shows_the_key(
        fleet: KeyedFleet, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ITEST_FLEET_KEY", KEY)
    assert fleet.apply(keyed()) == 0
    assert fleet.chat_with(KEY) == 200
    assert fleet.chat_with(None) == 401 and fleet.chat_with("sk-wrong") == 401
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
