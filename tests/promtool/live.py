"""A real Prometheus server for the monitoring tests, and the checks they run through its HTTP API.

Owns starting Prometheus (the Debian package's binary, requirements/apt-monitoring.txt) on a
release's ``monitoring/`` directory with the scrape targets rewritten to where the harness really
listens, and the questions asked of it: are all targets up, does every metric name the rules and
the board use have a live series, does every panel's query return a number, when did an alert
go pending and firing. The checks are functions of (server, documents) so a test can hand them a
document with a planted mistake and see them fail.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.monitoring import dashboard

SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


def rewrite_targets(config: dict[str, Any], where: dict[str, str]) -> dict[str, Any]:
    """The rendered scrape config with each target replaced by where the harness serves it and
    labelled with the rendered address as ``instance``; every target must be in ``where`` (a
    test cannot silently keep one it does not serve)."""
    out = json.loads(json.dumps(config))
    for job in out["scrape_configs"]:
        configs = []
        for sc in job["static_configs"]:
            missing = [t for t in sc["targets"] if t not in where]
            assert not missing, f"{job['job_name']}: no harness address for {missing}"
            # `instance` stays the rendered address: the series look as they do in production
            # (the plan's per-GPU rules name the exporter by it)
            configs += [{"targets": [where[t]], "labels": {**sc.get("labels", {}), "instance": t}}
                        for t in sc["targets"]]
        job["static_configs"] = configs
    return out


class Prometheus:
    """One Prometheus server on 127.0.0.1 over ``mon`` (prometheus.yml + rule files)."""

    def __init__(self, mon: Path, tmp: Path, port: int | None = None) -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            pytest.fail("prometheus is not installed: apt-get install prometheus "
                        "(requirements/apt-monitoring.txt)")
        from tests.promtool.support import free_port

        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [exe, f"--config.file={mon / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))  # noqa: SIM115

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, q: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=q)["result"])

    def wait(self, what: str, check: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except OSError as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(0.5)
        log = self.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})\n{log}")

    def settle(self, what: str, problems: Any, timeout: float) -> None:
        """Wait until ``problems()`` is an empty list; fail naming what is still wrong."""
        deadline = time.monotonic() + timeout
        while True:
            left = problems()
            if not left:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: still wrong after {timeout:g} s:\n" +
                                     "\n".join(map(str, left)))
            time.sleep(1.0)

    def targets_down(self) -> list[str]:
        active = self.api("targets", state="active")["activeTargets"]
        return [f"{t['labels'].get('job')} {t['scrapeUrl']}: {t['health']} {t['lastError']}"
                for t in active if t["health"] != "up"]

    def alert(self, name: str, state: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"]
                if a["labels"]["alertname"] == name and a["state"] == state]


def rule_exprs(rules_doc: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in rules_doc["groups"] for r in g["rules"]]


def panel_exprs(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's variables replaced) of every query on the board."""
    out = []
    for _, title, expr in dashboard.expressions(doc):
        for var, value in dashboard.GRAFANA_VARIABLES.items():
            expr = expr.replace(var, value)
        out.append((title, expr))
    return out


def dead_names(prom: Prometheus, exprs: list[str], deployment: str) -> list[str]:
    """Metric names used in ``exprs`` that have no series of ``deployment`` on the server."""
    names = sorted({m for e in exprs for m in SELECTOR.findall(e)})
    return [n for n in names
            if not prom.query(f'count({{__name__="{n}",deployment="{deployment}"}})')]


def _has_number(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(r["value"][1])) for r in result)


def empty_panels(prom: Prometheus, doc: dict[str, Any]) -> list[str]:
    """Queries of the board that return no series with a number (NaN does not count)."""
    return [f"{title}: {expr}" for title, expr in panel_exprs(doc)
            if not _has_number(prom.query(expr))]


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())
