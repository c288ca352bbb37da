"""Router double of `python -m sglang_router.launch_router` (sglang-router 0.3.2), for router faults.

Owns the PD router stand-in that the fake hosts' router unit starts. It parses the real flag
names (`--pd-disaggregation`, `--prefill URL [BOOTSTRAP_PORT]` (repeatable), `--decode URL`,
`--worker-urls`, `--host`, `--port`, `--prometheus-host`, `--prometheus-port`, health-check
flags; unknown flags are tolerated and recorded) and serves:

- `/liveness`, `/health`: 200 while the process runs;
- `/readiness`: 200 `{"status": "ready", ...}` only when every configured worker is healthy,
  else 503 `{"status": "not ready", ...}` (both carry `healthy_workers`, `total_workers`);
- `/workers`: `{"workers": [{"url", "worker_type" ("prefill"|"decode"|"regular"),
  "is_healthy", "bootstrap_port"}], "total": N, "stats": {"prefill_count", "decode_count",
  "regular_count"}}`; `/list_workers`: `{"urls": [...]}`;
- `/v1/models`: taken from the first healthy decode (or regular) worker;
- `/generate`, `/v1/chat/completions`, `/v1/completions`: in PD mode the request (with
  `bootstrap_host/port/room` added, as the real PD router does) goes first to a healthy prefill
  worker (its failure fails the request with 502), then to a healthy decode worker whose answer
  (SSE included) is passed through; workers are chosen round-robin;
- `/metrics` on `--prometheus-port` with `smg_` names.

Worker health is polled on `--health-check-endpoint` every min(`--health-check-interval-secs`,
1) seconds (faster than the real default of 60 s, to keep tests short) with the real
success/failure thresholds. Control-file mode key: "router" (port = `--port`); honoured switches:
start_delay_s, listen_delay_s, never_ready, crash_after_s, crash_exit_code, fail_generate.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import control
from .httpbase import Handler, Server, serve_forever, start_crash_timer
from .metrics import router_metrics


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang_router.launch_router", allow_abbrev=True)
    a = p.add_argument
    a("--pd-disaggregation", action="store_true")
    a("--prefill", nargs="+", action="append", default=[], metavar=("URL", "BOOTSTRAP_PORT"))
    a("--decode", nargs="+", action="append", default=[], metavar="URL")
    a("--worker-urls", nargs="*", default=[])
    # 0.3.2's --api-key: clients must present it on every route but the public ones (seen on the
    # real binary: 401 on /v1/chat/completions and /workers without it), and it goes to the workers
    a("--api-key")
    a("--host", default="0.0.0.0")
    a("--port", type=int, default=30000)
    a("--prometheus-host", default="0.0.0.0")
    a("--prometheus-port", type=int, default=29000)
    policies = ["random", "round_robin", "cache_aware", "power_of_two", "manual", "bucket"]
    a("--policy", choices=policies[:-1], default="cache_aware")
    a("--prefill-policy", choices=policies)
    a("--decode-policy", choices=policies[:-1])
    a("--health-check-endpoint", default="/health")
    a("--health-check-interval-secs", type=float, default=60)
    a("--health-check-timeout-secs", type=float, default=5)
    a("--health-failure-threshold", type=int, default=3)
    a("--health-success-threshold", type=int, default=2)
    a("--disable-health-check", action="store_true")
    a("--request-timeout-secs", type=float, default=1800)
    a("--log-level", default="info")
    a("--log-dir")
    a("--model-path")
    a("--tokenizer-path")
    return p


class Worker:
    def __init__(self, url: str, wtype: str, bootstrap_port: int | None) -> None:
        self.url = url.rstrip("/")
        self.wtype = wtype
        self.bootstrap_port = bootstrap_port
        self.healthy = False
        self.ok_streak = 0
        self.fail_streak = 0

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "worker_type": self.wtype, "is_healthy": self.healthy,
                "bootstrap_port": self.bootstrap_port}


def _conn(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"worker URL {url!r} must look like http://HOST:PORT")
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout), \
        parts.path.rstrip("/")


class Router:
    def __init__(self, args: argparse.Namespace, workers: list[Worker],
                 switches: dict[str, Any]) -> None:
        self.args = args
        self.workers = workers
        self.sw = switches
        self.start = time.monotonic()
        self.requests: dict[str, int] = {}
        self.lock = threading.Lock()
        self._rr = {t: itertools.count() for t in ("prefill", "decode", "regular")}

    def started(self) -> bool:
        return time.monotonic() - self.start >= float(self.sw["start_delay_s"])

    def ready(self) -> bool:
        if self.sw["never_ready"] or not self.started():
            return False
        return bool(self.workers) and all(w.healthy for w in self.workers)

    def pick(self, wtype: str) -> Worker | None:
        pool = [w for w in self.workers if w.wtype == wtype and w.healthy]
        if not pool:
            return None
        return pool[next(self._rr[wtype]) % len(pool)]

    def check_loop(self) -> None:
        a = self.args
        interval = min(float(a.health_check_interval_secs), 1.0)
        while True:
            for w in self.workers:
                ok = self._probe(w)
                if a.disable_health_check:
                    w.healthy = True
                    continue
                if ok:
                    w.ok_streak += 1
                    w.fail_streak = 0
                    if w.ok_streak >= a.health_success_threshold:
                        w.healthy = True
                else:
                    w.fail_streak += 1
                    w.ok_streak = 0
                    if w.fail_streak >= a.health_failure_threshold or not w.healthy:
                        w.healthy = False
            time.sleep(interval)

    def _probe(self, w: Worker) -> bool:
        try:
            conn, base = _conn(w.url, float(self.args.health_check_timeout_secs))
            conn.request("GET", base + self.args.health_check_endpoint)
            resp = conn.getresponse()
            resp.read()
            conn.close()
            return 200 <= resp.status < 300
        except (OSError, http.client.HTTPException, ValueError):
            return False


# sgl-router/src/server.rs public_routes: reachable without the router's --api-key
PUBLIC = ("/liveness", "/readiness", "/health", "/health_generate", "/v1/models",
          "/get_model_info", "/get_server_info")


class RouterHandler(Handler):
    router: Router

    def _authorized(self, path: str) -> bool:
        key = self.router.args.api_key
        if not key or path in PUBLIC or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self.send_bytes(401, b"", "text/plain")
        return False

    def _bump(self, route: str) -> None:
        with self.router.lock:
            self.router.requests[route] = self.router.requests.get(route, 0) + 1

    def do_GET(self) -> None:
        r = self.router
        path = self.path.split("?", 1)[0]
        self._bump(path)
        if not self._authorized(path):
            return
        healthy = sum(1 for w in r.workers if w.healthy)
        if path in ("/liveness", "/health"):
            self.send_text(200, "OK")
        elif path == "/readiness":
            ok = r.ready()
            self.send_json(200 if ok else 503, {
                "status": "ready" if ok else "not ready",
                "healthy_workers": healthy, "total_workers": len(r.workers)})
        elif path == "/workers":
            stats = {f"{t}_count": sum(1 for w in r.workers if w.wtype == t)
                     for t in ("prefill", "decode", "regular")}
            self.send_json(200, {"workers": [w.as_dict() for w in r.workers],
                                 "total": len(r.workers), "stats": stats})
        elif path == "/list_workers":
            self.send_json(200, {"urls": [w.url for w in r.workers]})
        elif path in ("/v1/models", "/get_model_info", "/get_server_info", "/model_info",
                      "/server_info"):
            w = r.pick("decode") or r.pick("regular")
            if w is None:
                self.send_json(503, {"error": {"message": "no healthy worker"}})
            else:
                self._forward(w, "GET", path, None, passthrough=True)
        else:
            self.send_json(404, {"error": {"message": f"no route {path}"}})

    def do_POST(self) -> None:
        r = self.router
        path = self.path.split("?", 1)[0]
        self._bump(path)
        if not self._authorized(path):
            return
        body = self.read_json()
        if body is None:
            return
        if path not in ("/generate", "/v1/chat/completions", "/v1/completions"):
            self.send_json(404, {"error": {"message": f"no route {path}"}})
            return
        if not r.started():
            self.send_json(503, {"error": {"message": "router is starting"}})
            return
        if r.sw["fail_generate"]:
            self.send_json(500, {"error": {"message": "simulated router failure (fail_generate)"}})
            return
        try:
            if r.args.pd_disaggregation:
                pre, dec = r.pick("prefill"), r.pick("decode")
                if pre is None or dec is None:
                    self.send_json(503, {"error": {"message": "no healthy prefill/decode pair"}})
                    return
                room = random.randint(0, 2**63 - 1)
                host = urlsplit(pre.url).hostname
                body = {**body, "bootstrap_host": host, "bootstrap_port": pre.bootstrap_port,
                        "bootstrap_room": room}
                pre_body = {**body, "stream": False}
                status, text = self._call(pre, path, pre_body)
                if not 200 <= status < 300:
                    self.send_json(502, {"error": {"message": f"prefill worker {pre.url} "
                                                   f"answered {status}: {text[:200]}"}})
                    return
                self._forward(dec, "POST", path, body, passthrough=True)
            else:
                w = r.pick("regular")
                if w is None:
                    self.send_json(503, {"error": {"message": "no healthy worker"}})
                    return
                self._forward(w, "POST", path, body, passthrough=True)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _call(self, w: Worker, path: str, body: dict[str, Any]) -> tuple[int, str]:
        try:
            conn, base = _conn(w.url, float(self.router.args.request_timeout_secs))
            headers = {"Content-Type": "application/json"}
            if self.router.args.api_key:
                headers["Authorization"] = f"Bearer {self.router.args.api_key}"
            conn.request("POST", base + path, json.dumps(body), headers)
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace")
            conn.close()
            return resp.status, text
        except (OSError, http.client.HTTPException) as exc:
            return 599, str(exc)

    def _forward(self, w: Worker, method: str, path: str, body: dict[str, Any] | None,
                 passthrough: bool) -> None:
        try:
            conn, base = _conn(w.url, float(self.router.args.request_timeout_secs))
            headers = {"Content-Type": "application/json"}
            if self.router.args.api_key:  # like 0.3.2: the workers' key, as a bearer token
                headers["Authorization"] = f"Bearer {self.router.args.api_key}"
            conn.request(method, base + path, json.dumps(body) if body is not None else None,
                         headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            self.send_json(502, {"error": {"message": f"worker {w.url} unreachable: {exc}"}})
            return
        ctype = resp.getheader("Content-Type", "application/json")
        if "text/event-stream" in ctype and resp.status == 200:
            self.start_sse()
            while True:
                line = resp.readline()
                if not line:
                    break
                self.send_chunk(line)
            self.end_chunks()
        else:
            self.send_bytes(resp.status, resp.read(), ctype)
        conn.close()


class MetricsHandler(Handler):
    router: Router

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_text(404, "not found")
            return
        r = self.router
        with r.lock:
            reqs = dict(r.requests)
        self.send_text(200, router_metrics(requests=reqs, workers=[w.as_dict() for w in r.workers]),
                       "text/plain; version=0.0.4; charset=utf-8")


def _fail(code: int, msg: str) -> int:
    sys.stderr.write(f"sglang_router (simulator): error: {msg}\n")
    sys.stderr.flush()
    return code


def parse_workers(args: argparse.Namespace) -> list[Worker]:
    """Workers from argv; raises ValueError with a clear message on bad input."""
    workers: list[Worker] = []
    for item in args.prefill:
        if len(item) > 2:
            raise ValueError(f"--prefill takes URL [BOOTSTRAP_PORT], got {item}")
        port: int | None = None
        if len(item) == 2 and item[1].lower() != "none":
            if not item[1].isdigit():
                raise ValueError(f"--prefill bootstrap port must be a number or none: {item[1]!r}")
            port = int(item[1])
        workers.append(Worker(item[0], "prefill", port))
    for item in args.decode:
        if len(item) != 1:
            raise ValueError(f"--decode takes exactly one URL, got {item}")
        workers.append(Worker(item[0], "decode", None))
    for url in args.worker_urls:
        workers.append(Worker(url, "regular", None))
    for w in workers:
        _conn(w.url, 1.0)
    if args.pd_disaggregation and not (any(w.wtype == "prefill" for w in workers)
                                       and any(w.wtype == "decode" for w in workers)):
        raise ValueError("--pd-disaggregation needs at least one --prefill and one --decode")
    return workers


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        sys.stderr.write(f"sglang_router (simulator): warning: unrecognised arguments: {unknown}\n")
    try:
        workers = parse_workers(args)
    except ValueError as exc:
        return _fail(2, str(exc))
    env_dir = Path(os.environ.get("DSV4_SIM_ENV_DIR") or sys.prefix)
    try:
        switches = control.resolve(control.control_path(env_dir), port=args.port, mode="router",
                                   served_model_name="", argv=argv)
    except control.ControlError as exc:
        return _fail(2, str(exc))
    try:
        with open(control.runs_log_path(env_dir), "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "time": time.time(), "argv": argv,
                                 "mode": "router", "impl": "double", "port": args.port,
                                 "switches": switches, "unknown_args": unknown}) + "\n")
    except OSError as exc:
        sys.stderr.write(f"sglang_router (simulator): warning: cannot record run: {exc}\n")
    start_crash_timer(switches["crash_after_s"], switches["crash_exit_code"], "sglang_router")
    if float(switches["listen_delay_s"]) > 0:
        time.sleep(float(switches["listen_delay_s"]))
    router = Router(args, workers, switches)
    try:
        server = Server((args.host, args.port),
                        type("BoundRouterHandler", (RouterHandler,), {"router": router}))
        msrv = Server((args.prometheus_host, args.prometheus_port),
                      type("BoundMetricsHandler", (MetricsHandler,), {"router": router}))
    except OSError as exc:
        return _fail(1, f"cannot listen on {args.host}:{args.port} / prometheus port "
                        f"{args.prometheus_port}: {exc}")
    threading.Thread(target=msrv.serve_forever, daemon=True).start()
    threading.Thread(target=router.check_loop, daemon=True).start()
    sys.stderr.write(f"sglang_router (simulator): {len(workers)} workers, serving on "
                     f"{args.host}:{args.port}, metrics on {args.prometheus_port}\n")
    sys.stderr.flush()
    return serve_forever(server)


if __name__ == "__main__":
    sys.exit(main())
