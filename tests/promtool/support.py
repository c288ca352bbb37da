"""Helpers shared by the monitoring and probe tests: shipped profiles resolved like `dsv4ctl plan`
does, profiles built in a test, and engine simulator processes with the real sglang-router 0.3.2
in front of them, on 127.0.0.1.

The simulators (tests/sim, owned by the simulator) are started as plain local processes; each one
gets its behaviour switches through `by_port` in a control file shared by the test's processes.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from orchestrator.deployment import Deployment
from orchestrator.paths import data_dir
from orchestrator.planner.build import PlanContext, load_context, resolve_deployment
from orchestrator.profile.loader import load_inventory
from orchestrator.profile.schema import Profile

REPO = Path(__file__).resolve().parents[2]
MODEL = "deepseek-v4-flash"


def shipped_profile_paths() -> list[Path]:
    paths = sorted(p for p in data_dir("profiles").glob("*.yaml") if p.name != "inventory.yaml")
    assert paths, "no shipped profiles found"
    return paths


def resolved(path: Path) -> tuple[Profile, Deployment]:
    """A profile file and its deployment, resolved the way `dsv4ctl plan` does (catalog facts)."""
    ctx = load_context(path, None)
    return ctx.profile, resolve_deployment(ctx)


def resolve_inline(profile: Profile) -> Deployment:
    """A profile built in a test, on the shipped inventory's host."""
    inv_path = data_dir("profiles") / "inventory.yaml"
    host_name = str(profile.host)
    host = load_inventory(inv_path).hosts[host_name]
    ctx = PlanContext(profile, None, "", host_name, host, inv_path)
    return resolve_deployment(ctx)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"simulator exited with {proc.returncode} before becoming ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout} s")


def wait_workers(url: str, expected: set[str], api_key: str | None,
                 timeout: float = 30.0) -> None:
    """Wait until the router at ``url`` lists every worker of ``expected`` as healthy.

    sglang-router 0.3.2 registers its start-up workers through its job queue, so ``/readiness``
    answers 200 once *one* worker is healthy, and the second can still be missing from
    ``/workers`` (a CI run on 2 cores listed one of two). A test that starts a router in front of
    workers expects all of them behind it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    listed: Any = None
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(url + "/workers", headers=headers)
            with urllib.request.urlopen(req, timeout=1) as r:
                listed = json.loads(r.read())
            if expected <= {w["url"] for w in listed["workers"] if w.get("is_healthy")}:
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url}: workers {sorted(expected)} not all listed healthy after "
                       f"{timeout} s; last /workers answer: {listed!r:.500}")


class Load:
    """Streamed chat requests through the router in a loop (two clients) until stopped; failures
    counted."""

    def __init__(self, router: str) -> None:
        self.router, self.stop_event = router, threading.Event()
        self.ok = self.failed = 0
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        n = 0
        while not self.stop_event.is_set():
            n += 1
            prompt = f"{uuid.uuid4().hex} {n}: what is 6 * 7?"
            body = json.dumps({"model": MODEL, "max_tokens": 8, "stream": True,
                               "messages": [{"role": "user", "content": prompt}]}).encode()
            req = urllib.request.Request(self.router + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    r.read()
                self.ok += 1
            except (OSError, http.client.HTTPException):
                # a response cut off when a test kills its engine mid-stream is an
                # IncompleteRead (an HTTPException, not an OSError); the loop must go on, or the
                # alerts that need traffic after the kill never fire
                self.failed += 1
                time.sleep(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=40)


class Sims:
    """Starts simulator processes; every one shares a control file keyed by port."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.control: dict[str, Any] = {"by_port": {}}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.bootstrap: dict[str, int] = {}  # prefill URL -> its bootstrap port
        self.router_metrics: dict[str, int] = {}  # router URL -> its metrics (prometheus) port
        self.by_url: dict[str, subprocess.Popen[bytes]] = {}
        (tmp / "model").mkdir()

    def _env(self) -> dict[str, str]:
        return {**os.environ, "DSV4_SIM_CONTROL": str(self.tmp / "sim-control.json"),
                "DSV4_SIM_RUNS": str(self.tmp / "sim-runs.jsonl"),
                "PYTHONPATH": str(REPO)}

    def _spawn(self, args: list[str], port: int, switches: dict[str, Any], ready: str
               ) -> str:
        self.control["by_port"][str(port)] = switches
        (self.tmp / "sim-control.json").write_text(json.dumps(self.control))
        log = open(self.tmp / f"sim-{port}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=self._env(),
                                stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        self.by_url[url] = proc
        wait_ready(url + ready, proc)
        return url

    def kill(self, url: str) -> None:
        """Stop the process serving ``url`` (one this object started) at once."""
        proc = self.by_url[url]
        proc.kill()
        proc.wait(timeout=10)

    def dcgm(self, state: Path) -> str:
        """The dcgm-exporter stand-in (tests/sim/dcgm.py) reading its values from ``state``."""
        port = free_port()
        return self._spawn(["tests.sim.dcgm", "--host", "127.0.0.1", "--port", str(port),
                            "--state", str(state)], port, {}, "/metrics")

    def engine(self, *, mode: str | None = None, parsers: bool = True,
               extra: tuple[str, ...] = (), **switches: Any) -> str:
        port = free_port()
        args = ["tests.sim.engine", "serve", "--model-path", str(self.tmp / "model"),
                "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
                "--enable-metrics", "--sampling-defaults", "model",
                "--preferred-sampling-params", '{"temperature": 1.0, "top_p": 0.95}']
        if parsers:
            args += ["--reasoning-parser", "deepseek-v4", "--tool-call-parser", "deepseekv4"]
        boot = free_port()
        if mode is not None:
            args += ["--disaggregation-mode", mode, "--disaggregation-transfer-backend",
                     "mooncake_tcp", "--disaggregation-bootstrap-port", str(boot)]
        url = self._spawn([*args, *extra], port, switches, "/ready")
        self.bootstrap[url] = boot
        return url

    def router(self, prefill: str | None = None, decode: str | None = None, *,
               workers: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> str:
        """The real sglang-router 0.3.2: PD mode in front of `prefill` (from :meth:`engine` with
        ``mode="prefill"``, whose bootstrap port it is given, as the router must be) and
        `decode`, or regular mode in front of `workers`."""
        port = free_port()
        if workers:
            args = ["sglang_router.launch_router", "--worker-urls", *workers]
        else:
            assert prefill is not None and decode is not None
            args = ["sglang_router.launch_router", "--pd-disaggregation", "--prefill", prefill,
                    str(self.bootstrap[prefill]), "--decode", decode]
        metrics = free_port()
        args += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
                 "--prometheus-port", str(metrics), *extra]
        url = self._spawn(args, port, {}, "/readiness")
        self.router_metrics[url] = metrics
        key = extra[extra.index("--api-key") + 1] if "--api-key" in extra else None
        wait_workers(url, set(workers) if workers else {prefill or "", decode or ""}, key)
        return url

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
