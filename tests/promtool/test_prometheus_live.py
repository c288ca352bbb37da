"""A real Prometheus server runs the shipped prometheus.yml and rules.yml against the simulator.

promtool proves the files parse and the rules behave on synthetic series; this proves the pieces
fit on the wire: the scrape config reaches the engine's /metrics, the `deployment` and `role`
target labels reach the recorded series, and an alert goes pending on the exposition format
SGLang 0.5.23 uses (via the simulator, which copies its names and labels). Prometheus comes from
the same Debian package as promtool and listens on loopback only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.monitoring import release_files
from orchestrator.paths import data_dir
from orchestrator.profile.loader import load_text
from orchestrator.profile.schema import Profile
from tests.promtool.support import Sims, free_port, resolve_inline


def query(base: str, q: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': q})}"
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def wait_for(base: str, q: str, timeout: float = 40.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            res = query(base, q)
        except OSError:
            res = []
        if res:
            return res
        time.sleep(0.5)
    raise AssertionError(f"no result for {q!r} within {timeout} s")


def test_prometheus_scrapes_and_evaluates_the_shipped_config(tmp_path: Path) -> None:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus is not installed: apt-get install prometheus "
                    "(requirements/apt-monitoring.txt)")
    port = free_port()
    data = yaml.safe_load((data_dir("profiles") / "mxfp4-tp8.yaml").read_text())
    data["name"] = "live"
    data["topology"]["engine"]["port"] = port
    data["monitoring"] = {"scrape_interval_s": 1}
    profile = load_text(Profile, yaml.safe_dump(data), "live.yaml")
    dep = resolve_inline(profile)
    mon = tmp_path / "monitoring"
    mon.mkdir()
    for rel, text in release_files(profile, dep).items():
        (mon / rel).write_text(text)

    (tmp_path / "sim").mkdir()
    sims = Sims(tmp_path / "sim")
    prom = None
    try:
        # Start the engine simulator on the port the profile declares.
        args = ["tests.sim.engine", "serve", "--model-path", str(sims.tmp / "model"),
                "--served-model-name", "deepseek-v4-flash", "--host", "127.0.0.1",
                "--port", str(port), "--enable-metrics"]
        sims._spawn(args, port, {"metrics": {"sglang:full_token_usage": 0.97}}, "/ready")
        web = free_port()
        prom = subprocess.Popen(
            [exe, f"--config.file={mon / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prom.log", "wb"))  # noqa: SIM115
        base = f"http://127.0.0.1:{web}"
        up = wait_for(base, 'up{deployment="live",role="engine"} == 1')
        assert up[0]["metric"]["job"] == "dsv4-live-engine"
        kv = wait_for(base, 'dsv4:kv_full_usage:max{deployment="live"}')
        assert kv[0]["metric"] == {"__name__": "dsv4:kv_full_usage:max", "deployment": "live",
                                   "role": "engine", "instance": f"127.0.0.1:{port}"}
        assert float(kv[0]["value"][1]) == pytest.approx(0.97)
        alert = wait_for(base, 'ALERTS{alertname="DSV4KVCacheFullPoolHigh"}')
        assert alert[0]["metric"]["alertstate"] == "pending"  # `for: 5m` has not elapsed
        assert alert[0]["metric"]["role"] == "engine"
        assert query(base, 'ALERTS{alertname="DSV4EngineDown"}') == []
    finally:
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(timeout=10)
            except subprocess.TimeoutExpired:
                prom.kill()
        sims.stop()
