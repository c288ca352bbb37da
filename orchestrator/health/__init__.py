"""Model-aware health of a deployment: startup, ready, registered with the router, and generating.

A port that answers is not a healthy LLM server (llm-d#330, kserve#5062; shared research anchors A.2
#9). A deployment is healthy here only when, for every engine role, ``/ready`` and ``/health``
answer 200 (SGLang's ``/health`` runs a one-token generation, sglang#8444) and ``/v1/models`` lists
the served name; when there is a router, its ``/readiness`` answers 200 and its ``/workers`` list
shows the expected number of healthy prefill and decode workers (srtctl
``check_sglang_router_health``); and the units are still running without restarts. Then one real
generation through the entry point must succeed (:func:`smoke_generate`).

The checks are pure functions over responses, so they are unit-tested without a host; the waiting
loop takes the HTTP and unit-state functions as arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.deployment import Deployment


class Response(Protocol):
    status: int
    body: bytes

    def json(self) -> Any: ...


# http(method, port, path, body=..., timeout=...) -> Response; raises OSError (refused, reset,
# timeout) when nothing useful answered.
Http = Callable[..., Response]


@dataclass(frozen=True)
class CheckResult:
    subject: str  # role name or "router"
    check: str  # ready, health, models, readiness, workers, unit
    ok: bool
    message: str


@dataclass
class HealthReport:
    results: list[CheckResult] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    def failing(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def summary(self) -> str:
        bad = self.failing()
        if not bad:
            return "all checks pass"
        return "; ".join(f"{r.subject} {r.check}: {r.message}" for r in bad)


def _get(http: Http, port: int, path: str, timeout: float) -> tuple[int | None, Any, str]:
    """(status, parsed JSON or None, error text)."""
    try:
        resp = http("GET", port, path, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        kind = "refused" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__
        return None, None, f"no answer ({kind})"
    try:
        data = resp.json()
    except (ValueError, UnicodeDecodeError):
        data = None
    return resp.status, data, ""


def check_role(http: Http, name: str, port: int, served_name: str,
               timeout: float = 10.0) -> list[CheckResult]:
    """/ready → /health → /v1/models for one engine; stops at the first failure."""
    out: list[CheckResult] = []
    for check, path in (("ready", "/ready"), ("health", "/health")):
        status, _, err = _get(http, port, path, timeout)
        ok = status == 200
        out.append(CheckResult(name, check, ok,
                               "200" if ok else (err or f"HTTP {status} (starting or unhealthy)")))
        if not ok:
            return out
    out.append(check_models(name, *_get(http, port, "/v1/models", timeout), served_name))
    return out


def check_models(subject: str, status: int | None, data: Any, err: str,
                 served_name: str) -> CheckResult:
    if status != 200:
        # err names a dead port ("no answer (refused)"): an engine that died between /health and
        # /v1/models must not read as a server that answered something odd.
        return CheckResult(subject, "models", False,
                           err or f"/v1/models answered HTTP {status}")
    ids = []
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        ids = [m.get("id") for m in data["data"] if isinstance(m, dict)]
    if served_name in ids:
        return CheckResult(subject, "models", True, f"serves {served_name}")
    return CheckResult(subject, "models", False,
                       f"/v1/models lists {ids or 'nothing'}, expected {served_name!r}")


def count_workers(data: Any) -> tuple[int, int, int]:
    """Healthy (prefill, decode, regular) workers from the router's ``/workers`` answer
    (``{"workers": [{"worker_type", "is_healthy"}...], "stats": {...}}``, sgl-router 0.3.x)."""
    if not isinstance(data, dict):
        return 0, 0, 0
    workers = data.get("workers")
    if isinstance(workers, list):
        def n(kind: str) -> int:
            return sum(1 for w in workers if isinstance(w, dict) and w.get("worker_type") == kind
                       and w.get("is_healthy", True) is not False)
        return n("prefill"), n("decode"), n("regular")
    stats = data.get("stats") if isinstance(data.get("stats"), dict) else {}
    return (int(stats.get("prefill_count", 0)), int(stats.get("decode_count", 0)),
            int(stats.get("regular_count", 0)))


def check_router(http: Http, port: int, prefill: int, decode: int,
                 timeout: float = 10.0) -> list[CheckResult]:
    status, data, err = _get(http, port, "/readiness", timeout)
    out = [CheckResult("router", "readiness", status == 200,
                       "200" if status == 200 else (err or f"HTTP {status}"))]
    if status != 200:
        return out
    status, data, err = _get(http, port, "/workers", timeout)
    if status != 200:
        out.append(CheckResult("router", "workers", False, err or f"/workers answered {status}"))
        return out
    p, d, _ = count_workers(data)
    ok = p >= prefill and d >= decode
    out.append(CheckResult("router", "workers", ok,
                           f"{p}/{prefill} prefill, {d}/{decode} decode healthy"))
    return out


def check_units(states: dict[str, Any], expected: dict[str, str],
                baseline_restarts: dict[str, int]) -> list[CheckResult]:
    """Each expected unit (unit name -> role) must be active/running and must not have restarted
    since it was started (a crash loop under ``Restart=on-failure`` looks "activating" between
    tries)."""
    out = []
    for unit, role in expected.items():
        s = states.get(unit)
        if s is None:
            out.append(CheckResult(role, "unit", False, f"{unit} unknown to systemd"))
            continue
        restarted = s.restarts > baseline_restarts.get(unit, 0)
        # "auto-restart": the process exited and systemd waits RestartSec before the next try
        if s.active == "failed" or restarted or s.sub == "auto-restart":
            why = f"{unit} {s.active}/{s.sub}" + (f", restarted {s.restarts}x" if restarted else "")
            out.append(CheckResult(role, "unit", False, why + " (crashed)"))
        elif not s.running:
            out.append(CheckResult(role, "unit", False, f"{unit} {s.active}/{s.sub}"))
        else:
            out.append(CheckResult(role, "unit", True, f"{unit} running (pid {s.main_pid})"))
    return out


def crashed(results: list[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.check == "unit" and "crashed" in r.message]


def evaluate(http: Http, dep: Deployment, unit_states: dict[str, Any],
             baseline_restarts: dict[str, int], timeout: float = 10.0) -> HealthReport:
    """One round of every check."""
    expected = {r.unit: r.name for r in dep.roles}
    if dep.router is not None:
        expected[dep.router.unit] = "router"
    results = check_units(unit_states, expected, baseline_restarts)
    for role in dep.roles:
        results += check_role(http, role.name, role.port, dep.served_name, timeout)
    if dep.router is not None:
        results += check_router(http, dep.router.port, len(dep.router.prefill),
                                len(dep.router.decode), timeout)
    return HealthReport(results)


def wait_healthy(http: Http, dep: Deployment, unit_states: Callable[[], dict[str, Any]], *,
                 timeout_s: float, poll_s: float, baseline_restarts: dict[str, int],
                 progress: Callable[[str], None] = lambda s: None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 settle_s: float | None = None) -> HealthReport:
    """Poll until every check passes (then once more after ``settle_s`` to catch a crash right
    after start), a unit crashes, or ``timeout_s`` runs out. Reports progress when the picture
    changes and at least every 30 s while waiting."""
    start = clock()
    settle = poll_s if settle_s is None else settle_s
    last_line = ""
    last_print = -1e9
    passed_once = False
    while True:
        report = evaluate(http, dep, unit_states(), baseline_restarts)
        report.elapsed_s = clock() - start
        dead = crashed(report.results)
        if dead:
            return report
        if report.ok:
            if passed_once:
                return report
            passed_once = True
            progress(f"  all checks pass after {report.elapsed_s:.0f}s; confirming in {settle:g}s")
            sleep(settle)
            continue
        passed_once = False
        line = report.summary()
        now = clock()
        if line != last_line or now - last_print >= 30:
            progress(f"  [{report.elapsed_s:4.0f}s/{timeout_s:.0f}s] waiting: {line}")
            last_line, last_print = line, now
        if report.elapsed_s >= timeout_s:
            return report
        sleep(min(poll_s, max(0.0, timeout_s - report.elapsed_s)))


def watch_stable(http: Http, dep: Deployment, unit_states: Callable[[], dict[str, Any]], *,
                 window_s: float, poll_s: float, baseline_restarts: dict[str, int],
                 progress: Callable[[str], None] = lambda s: None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 interrupt_note: str = "", heartbeat_s: float = 30.0) -> HealthReport:
    """The stability window after the checks first pass: keep evaluating every ``poll_s`` for
    ``window_s``; the first round with a crashed or restarted unit or a failing check ends it
    (``report.ok`` false). A crash seconds after "healthy" is a failure, not a healthy release
    with a dead engine. It says what Ctrl-C does now (``interrupt_note``) before it starts, and
    how far it is every ``heartbeat_s``: a 180 s window is not three silent minutes."""
    start = clock()
    progress(f"  stability window: watching {window_s:g}s for crashes and failing checks"
             + (f"; {interrupt_note}" if interrupt_note else ""))
    shown = 0.0
    while True:
        report = evaluate(http, dep, unit_states(), baseline_restarts)
        report.elapsed_s = clock() - start
        if not report.ok or report.elapsed_s >= window_s:
            return report
        if report.elapsed_s - shown >= heartbeat_s:
            shown = report.elapsed_s
            progress(f"  stability window: {report.elapsed_s:.0f}s of {window_s:g}s, all checks "
                     "pass")
        sleep(min(poll_s, max(0.0, window_s - report.elapsed_s)))


def default_stability_window_s(router_defaults: dict[str, Any]) -> float:
    """The router's health-check interval x failure threshold (catalog values, with sources)."""
    interval = float(router_defaults["health_check_interval_secs"].value)
    threshold = float(router_defaults["health_failure_threshold"].value)
    return interval * threshold


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    message: str
    text: str = ""


def smoke_generate(http: Http, dep: Deployment, prompt: str, max_tokens: int,
                   timeout: float = 120.0) -> SmokeResult:
    """One real chat completion through the router (or the engine when colocated)."""
    port = dep.router.port if dep.router is not None else dep.roles[0].port
    body = {"model": dep.served_name, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": False}
    try:
        resp = http("POST", port, "/v1/chat/completions", body=body, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        return SmokeResult(False, f"no answer from port {port}: {exc}")
    if resp.status != 200:
        return SmokeResult(False, f"HTTP {resp.status}: {resp.body[:200]!r}")
    try:
        data = resp.json()
        msg = data["choices"][0]["message"]
        text = (msg.get("content") or "") + (msg.get("reasoning_content") or "")
        tokens = int(data.get("usage", {}).get("completion_tokens", 0))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return SmokeResult(False, f"malformed completion: {exc}")
    if not text.strip() or tokens <= 0:
        return SmokeResult(False, f"empty completion ({tokens} tokens)")
    return SmokeResult(True, f"{tokens} tokens via port {port}", text[:200])
