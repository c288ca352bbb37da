"""Self-tests of the fake-host harness and the engine simulator, against real sshd and systemd.

Owns the proof that the integration test bed is what it claims: SSH (fabric) reaches every fake
host, their filesystems are private, `systemctl --user` runs the simulator as a unit, every
fault switch of the simulator does what its documentation says, the fake host's router unit runs
the real sglang-router 0.3.2 (PD mode, the simulators accepting its bootstrap fields), and the
router double runs only when a test asks the router for a fault. Each test uses its own unit
names and ports so they do not interfere.
"""

from __future__ import annotations

import http.client as httpclient
import json
import os
import shlex
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import fabric
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import FakeHost, HarnessError, HostCluster
from tests.harness import hosts as hosts_mod
from tests.sim import textgen

pytestmark = pytest.mark.integration
MODEL = "/models/DeepSeek-V4-Flash"
SAMPLING = '{"temperature": 1.0, "top_p": 0.95}'
Q: dict[str, Any] = {"hide": True, "in_stream": False}  # fabric: quiet, no stdin under pytest


# -- helpers -------------------------------------------------------------------------------------
def http(host: FakeHost, port: int, path: str, body: dict[str, Any] | None = None,
         timeout: float = 30) -> tuple[int, Any]:
    req = urllib.request.Request(host.url(port, path), method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    except (urllib.error.URLError, ConnectionError):
        return 0, None
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode()


def sse(host: FakeHost, port: int, path: str, body: dict[str, Any]) -> list[Any]:
    """POST and collect the SSE `data:` payloads (JSON-decoded, `[DONE]` kept as a string)."""
    conn = httpclient.HTTPConnection(host.address, port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    events = []
    for line in resp:
        line = line.strip()
        if line.startswith(b"data: "):
            data = line[6:].decode()
            events.append(data if data == "[DONE]" else json.loads(data))
    conn.close()
    return events


def start_unit(host: FakeHost, name: str, argv: list[str], *, check: bool = True) -> None:
    """Write ~/.config/systemd/user/<name>.service running argv, daemon-reload and start it."""
    unit = "\n".join([
        "[Unit]", f"Description=harness self-test {name}", "[Service]", "Type=simple",
        f"ExecStart={shlex.join(argv)}", "Restart=no",
        f"StandardOutput=append:/srv/dsv4/logs/{name}.log",
        f"StandardError=append:/srv/dsv4/logs/{name}.log", "",
    ])
    host.exec(f"mkdir -p /srv/dsv4/logs ~/.config/systemd/user && cat > "
              f"~/.config/systemd/user/{name}.service <<'EOF'\n{unit}EOF\n"
              f"systemctl --user daemon-reload && systemctl --user start {name}.service",
              check=check)


def stop_unit(host: FakeHost, name: str) -> None:
    host.exec(f"systemctl --user stop {name}.service; systemctl --user reset-failed "
              f"{name}.service; rm -f ~/.config/systemd/user/{name}.service; "
              "systemctl --user daemon-reload")


def engine_argv(port: int, *extra: str) -> list[str]:
    return ["/opt/sglang-env/bin/sglang", "serve", "--model-path", MODEL, "--served-model-name",
            "dsv4-test", "--host", "0.0.0.0", "--port", str(port), "--enable-metrics",
            "--reasoning-parser", "deepseek-v4", "--tool-call-parser", "deepseekv4",
            "--preferred-sampling-params", SAMPLING, *extra]


def wait_for(fn: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        val = fn()
        if val:
            return val
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def ready(host: FakeHost, port: int, path: str = "/ready") -> bool:
    return http(host, port, path)[0] == 200


def chat(host: FakeHost, port: int, content: str, **kw: Any) -> tuple[int, Any]:
    return http(host, port, "/v1/chat/completions",
                {"model": "dsv4-test", "messages": [{"role": "user", "content": content}], **kw})


@pytest.fixture
def engine(request: pytest.FixtureRequest, fresh_sim_control: list[FakeHost]) -> Any:
    """Factory: start the simulator as a unit on host1 with a control section for its port."""
    host = fresh_sim_control[0]
    host.exec(f"mkdir -p {MODEL}", check=True)
    started: list[str] = []

    def _start(port: int, switches: dict[str, Any], *extra: str, wait: bool = True) -> FakeHost:
        host.write_sim_control({"by_port": {str(port): switches}} if switches else {})
        name = f"selftest-{request.node.name.split('[')[0][5:30]}-{port}".replace("_", "-")
        start_unit(host, name, engine_argv(port, *extra))
        started.append(name)
        wait_for(lambda: http(host, port, "/v1/models")[0] != 0, 10, f"port {port} to listen")
        if wait:
            wait_for(lambda: ready(host, port), 10, f"/ready on {port}")
        return host

    yield _start
    for name in started:
        stop_unit(host, name)


# -- SSH, filesystems, service manager --------------------------------------------------------------
def test_ssh_via_fabric_reaches_each_host(hosts: list[FakeHost]) -> None:
    seen = set()
    for h in hosts:
        with fabric.Connection(h.address, **h.connect_kwargs()) as c:
            r = c.run("echo $DSV4_FAKE_HOST $XDG_RUNTIME_DIR; systemctl --user is-system-running; "
                      "nvidia-smi --query-gpu=index,name,memory.total,memory.used,compute_cap,"
                      "driver_version,uuid --format=csv,noheader,nounits", **Q, warn=True)
            lines = r.stdout.splitlines()
            assert lines[0] == f"{h.name} /run/user/{h.uid}"
            assert lines[1] in ("running", "degraded")
            gpus = [ln.split(", ") for ln in lines[2:]]
            assert len(gpus) == 8
            assert gpus[0][1:6] == ["NVIDIA RTX PRO 6000 Blackwell Server Edition", "97887", "0",
                                    "12.0", "580.95.05"]
            c.put(__file__, remote="/srv/dsv4/uploaded.py")
        assert h.read("/srv/dsv4/uploaded.py").startswith('"""Self-tests')
        seen.add(h.address)
    assert len(seen) == len(hosts) == 2
    # known_hosts is usable for strict host key checking.
    assert all(h.address in hosts[0].known_hosts.read_text() for h in hosts)


def test_filesystems_are_private(hosts: list[FakeHost]) -> None:
    h1, h2 = hosts
    # the unit folder exists once something installed a unit: make it, or the test passes only
    # after another test file has applied on these session hosts (it failed run alone or first
    # on an xdist worker)
    h1.exec("echo one > /srv/dsv4/marker && mkdir -p ~/.config/systemd/user && "
            "echo unit > ~/.config/systemd/user/marker", check=True)
    try:
        assert h1.read("/srv/dsv4/marker") == "one\n"
        assert h2.exec("test -e /srv/dsv4/marker").returncode == 1
        assert h2.exec("test -e ~/.config/systemd/user/marker").returncode == 1
        assert h1.path("/srv/dsv4/marker").read_text() == "one\n"
        assert not Path("/srv/dsv4/marker").exists()  # not on the machine itself
        assert h1.exec("test -x /opt/sglang-env/bin/sglang").returncode == 0
        # Each host has its own systemd --user and cgroup tree.
        assert h1.exec("cat /proc/self/cgroup").stdout.strip().endswith("::/")
    finally:
        h1.exec("rm -f /srv/dsv4/marker ~/.config/systemd/user/marker")


def test_install_roots_parent_is_private(hosts: list[FakeHost]) -> None:
    """A test that makes /srv world-writable (test_hostile_fs: an unsafe parent must be refused)
    or plants /srv/victim changes its own host only: on the machine's shared /srv it made a
    concurrent xdist worker's apply fail ("dsv4ctl refuses /srv: it is writable by group or
    others")."""
    h1, h2 = hosts
    machine = os.stat("/srv").st_mode & 0o7777
    before = h2.exec("stat -c %a /srv", check=True).stdout.strip()
    h1.exec("chmod 0777 /srv && touch /srv/planted", check=True, root=True)
    try:
        assert h1.exec("stat -c %a /srv", check=True).stdout.strip() == "777"
        assert h2.exec("stat -c %a /srv", check=True).stdout.strip() == before
        assert h2.exec("test -e /srv/planted").returncode == 1
        assert os.stat("/srv").st_mode & 0o7777 == machine
        assert not Path("/srv/planted").exists()
        assert h1.exec("test -d /srv/dsv4").returncode == 0  # the install root is there
    finally:
        h1.exec("chmod 0755 /srv; rm -f /srv/planted", root=True)


def test_reused_address_answers_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A host that takes over an address (a slot reused by the next cluster, here the same host
    restarted) answers at once although the machine still holds a REACHABLE neighbour entry for
    it with the previous host's MAC. That entry used to black-hole the new host for 15-45 s
    (base_reachable_time) plus 8 s of probes, so the next cluster's sshd bring-up intermittently
    hit its 30 s wait ("nothing answers SSH", seen under xdist and concurrent runs)."""
    waits: list[float] = []

    def short_wait(addr: str, port: int, timeout: float) -> None:
        waits.append(timeout)
        real_wait(addr, port, 5.0)

    real_wait = hosts_mod._wait_port
    with HostCluster(n=1, workdir=tmp_path) as cluster:
        h = cluster[0]
        h.stop()
        # what the previous user of the address leaves behind: a confirmed entry to its MAC
        hosts_mod._run(["ip", "neigh", "replace", h.address, "lladdr", "02:00:5e:00:53:01",
                        "dev", hosts_mod.BRIDGE, "nud", "reachable"])
        monkeypatch.setattr(hosts_mod, "_wait_port", short_wait)
        h.start()
        assert waits, "the restarted host's sshd was not waited for"
        assert h.exec("echo up", check=True).stdout == "up\n"


def test_missing_tools_raise_not_skip(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setattr(hosts_mod, "_sshd_path", lambda: None)
    monkeypatch.setattr(hosts_mod.shutil, "which", lambda _name: None)
    with pytest.raises(HarnessError, match=r"sshd.*openssh-server"):
        HostCluster(n=1, workdir=tmp_path).start()


def test_unit_over_ssh_runs_simulator(hosts: list[FakeHost], fresh_sim_control: Any) -> None:
    h = hosts[1]
    name, port = "selftest-ssh-engine", 30010
    unit = "\n".join([
        "[Unit]", "Description=sim over ssh", "[Service]",
        f"ExecStart={shlex.join(engine_argv(port))}",
        "StandardOutput=append:/srv/dsv4/engine.log", "StandardError=append:/srv/dsv4/engine.log",
        "",
    ])
    with fabric.Connection(h.address, **h.connect_kwargs()) as c:
        c.run(f"mkdir -p {MODEL} ~/.config/systemd/user && cat > "
              f"~/.config/systemd/user/{name}.service <<'EOF'\n{unit}EOF", **Q)
        c.run(f"systemctl --user daemon-reload && systemctl --user start {name}", **Q)
        try:
            wait_for(lambda: ready(h, port), 10, "/ready")
            assert c.run(f"systemctl --user is-active {name}", **Q).stdout.strip() == "active"
            pid = c.run(f"systemctl --user show -p MainPID --value {name}", **Q,
                        ).stdout
            assert int(pid) > 0
            assert http(h, port, "/v1/models")[1]["data"][0]["id"] == "dsv4-test"
            info = http(h, port, "/server_info")[1]
            assert info["launch_command"].startswith("sglang serve --model-path")
            assert info["disaggregation_mode"] == "null" and info["port"] == port
            assert http(h, port, "/model_info")[1]["reasoning_parser"] == "deepseek-v4"
            events = sse(h, port, "/v1/chat/completions", {
                "model": "dsv4-test", "stream": True, "stream_options": {"include_usage": True},
                "chat_template_kwargs": {"thinking": True},
                "messages": [{"role": "user", "content": "What is 20 + 22?"}]})
            assert events[-1] == "[DONE]"
            deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
            content = "".join(d.get("content") or "" for d in deltas)
            reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
            assert content == "20 + 22 = 42." and reasoning and "</think>" not in content
            assert events[-2]["usage"]["completion_tokens"] == textgen.count_tokens(
                content) + textgen.count_tokens(reasoning)
            assert events[0]["sim_sampling"]["top_p"] == 0.95  # --preferred-sampling-params
            status, body = chat(h, port, "Weather in Paris?", tools=[{
                "type": "function", "function": {"name": "get_weather", "parameters": {
                    "type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}}])
            call = body["choices"][0]["message"]["tool_calls"][0]["function"]
            assert (status, call["name"], json.loads(call["arguments"])) == (
                200, "get_weather", {"city": "Paris"})
            metrics = http(h, port, "/metrics")[1]
            names = {f.name for f in text_string_to_metric_families(metrics)}
            assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                    "sglang:swa_token_usage", "sglang:gen_throughput", "sglang:cache_hit_rate",
                    "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                    "sglang:e2e_request_latency_seconds", "sglang:prompt_tokens",
                    "sglang:generation_tokens"} <= names
        finally:
            c.run(f"systemctl --user stop {name}; rm ~/.config/systemd/user/{name}.service; "
                  "systemctl --user daemon-reload", **Q, warn=True)
    runs = [r for r in h.sim_runs() if r["port"] == port]
    assert runs and runs[-1]["mode"] == "unified"
    assert "serving dsv4-test" in h.read("/srv/dsv4/engine.log")


# -- fault switches ---------------------------------------------------------------------------
def test_start_delay(engine: Any) -> None:
    t0 = time.monotonic()
    h = engine(30020, {"start_delay_s": 1.5}, wait=False)
    assert http(h, 30020, "/ready")[0] == 503
    assert chat(h, 30020, "hi")[0] == 503
    wait_for(lambda: ready(h, 30020), 10, "ready after the delay")
    assert time.monotonic() - t0 >= 1.5


def test_never_ready(engine: Any) -> None:
    h = engine(30021, {"never_ready": True}, wait=False)
    time.sleep(1.5)
    assert http(h, 30021, "/ready")[0] == 503
    assert http(h, 30021, "/health")[0] == 503
    assert h.systemctl("is-active", "selftest-never-ready-30021.service").stdout.strip() == "active"


def test_crash_after_start(engine: Any) -> None:
    h = engine(30022, {"crash_after_s": 1.0, "crash_exit_code": 3})
    unit = "selftest-crash-after-start-30022.service"
    wait_for(lambda: h.systemctl("is-active", unit).stdout.strip() == "failed", 10, "failed")
    show = h.systemctl("show", "-p", "ExecMainStatus", "--value", unit).stdout.strip()
    assert show == "3"
    assert http(h, 30022, "/ready")[0] == 0  # nothing listens any more


def test_fail_generate(engine: Any) -> None:
    h = engine(30023, {"fail_generate": True})
    assert http(h, 30023, "/ready")[0] == 200
    assert http(h, 30023, "/health")[0] == 503
    assert chat(h, 30023, "hi")[0] == 500
    assert http(h, 30023, "/generate", {"text": "hi"})[0] == 500


def test_recall_horizon_and_token_rule(engine: Any) -> None:
    h = engine(30024, {"recall_horizon_tokens": 300})

    def ask(filler_tokens: int) -> tuple[str, int]:
        filler = " ".join(["grass"] * filler_tokens)
        prompt = (f"{filler} The secret code for the red gate is K7Q2. {filler} "
                  "What is the secret code for the red gate?")
        status, body = chat(h, 30024, prompt)
        assert status == 200
        assert body["usage"]["prompt_tokens"] == textgen.count_tokens(prompt)
        return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]

    short, n_short = ask(100)
    long, n_long = ask(200)
    assert n_short <= 300 < n_long
    assert short == "The secret code for the red gate is K7Q2."
    assert long.startswith("The secret code for the red gate is ") and "K7Q2" not in long
    _, body = chat(h, 30024, "What is the secret code for the blue gate?")
    assert body["choices"][0]["message"]["content"].startswith("I do not know")


def test_token_rate_under_concurrent_load(engine: Any) -> None:
    rate, workers, per_req = 250.0, 8, 100
    h = engine(30025, {"token_rate": rate})
    counts: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        events = sse(h, 30025, "/v1/chat/completions", {
            "model": "dsv4-test", "stream": True, "max_tokens": per_req, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me a story."}]})
        n = sum(1 for e in events if e != "[DONE]" and e["choices"]
                and e["choices"][0]["delta"].get("content"))
        with lock:
            counts.append(n)

    t0 = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    assert counts == [per_req] * workers
    measured = workers * per_req / elapsed
    assert abs(measured - rate) / rate < 0.10, f"measured {measured:.1f} tok/s vs cap {rate}"


def test_reasoning_leak_and_raw_toolcall(engine: Any) -> None:
    h = engine(30026, {"reasoning_leak": True, "raw_toolcall": True,
                       "ignore_sampling_defaults": True})
    _, body = chat(h, 30026, "What is 2 + 2?", chat_template_kwargs={"thinking": True})
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] is None and "</think>" in msg["content"]
    assert msg["content"].endswith("2 + 2 = 4.")
    assert body["sim_sampling"]["top_p"] == 1.0  # defaults ignored
    _, body = chat(h, 30026, "Weather in Paris?", tools=[{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}, "required": ["city"]}}}])
    msg = body["choices"][0]["message"]
    assert msg["tool_calls"] is None
    assert '<｜DSML｜invoke name="get_weather">' in msg["content"]


def test_rule_max_times_and_bad_control(engine: Any, hosts: list[FakeHost]) -> None:
    h = hosts[0]
    h.write_sim_control({"rules": [{"match": {"port": 30027}, "set": {"never_ready": True},
                                    "max_times": 1}]})
    start_unit(h, "selftest-rule-30027", engine_argv(30027))
    try:
        wait_for(lambda: http(h, 30027, "/ready")[0] == 503, 10, "first start not ready")
        h.systemctl("restart", "selftest-rule-30027.service", check=True)
        wait_for(lambda: ready(h, 30027), 10, "second start ready")
    finally:
        stop_unit(h, "selftest-rule-30027")
    with pytest.raises(Exception, match="unknown switch"):
        h.write_sim_control({"default": {"never_redy": True}})


# -- the real router (sglang-router 0.3.2) and the router double ------------------------------
def _pd_router_units(h: FakeHost, *extra: str) -> list[str]:
    h.exec(f"mkdir -p {MODEL}", check=True)
    pre = engine_argv(30031, "--disaggregation-mode", "prefill",
                      "--disaggregation-bootstrap-port", "8998")
    dec = engine_argv(30032, "--disaggregation-mode", "decode")
    router = ["/opt/sglang-env/bin/python", "-m", "sglang_router.launch_router",
              "--pd-disaggregation", "--prefill", "http://127.0.0.1:30031", "8998",
              "--decode", "http://127.0.0.1:30032", "--host", "0.0.0.0", "--port", "8000",
              "--prometheus-port", "29000", "--health-failure-threshold", "1",
              "--health-success-threshold", "1", "--health-check-interval-secs", "1", *extra]
    names = ["selftest-prefill", "selftest-decode", "selftest-router"]
    for name, argv in zip(names, (pre, dec, router), strict=True):
        start_unit(h, name, argv)
    return names


def test_real_router_readiness_workers_and_pd(hosts: list[FakeHost],
                                              fresh_sim_control: Any) -> None:
    """The fake host's router unit runs the real sglang-router 0.3.2 in PD mode in front of the
    simulators: ready, both workers listed, generation with its bootstrap fields accepted."""
    h = hosts[1]
    names = _pd_router_units(h)
    try:
        wait_for(lambda: ready(h, 8000, "/readiness"), 30, "router readiness")
        runs = [r for r in h.sim_runs() if r.get("mode") == "router"]
        assert runs and runs[-1]["impl"] == "real"
        workers = http(h, 8000, "/workers")[1]["workers"]
        assert sorted((w["worker_type"], w["url"], w.get("bootstrap_port")) for w in workers) == [
            ("decode", "http://127.0.0.1:30032", None),
            ("prefill", "http://127.0.0.1:30031", 8998)]
        assert http(h, 8000, "/v1/models")[1]["data"][0]["id"] == "dsv4-test"
        status, body = chat(h, 8000, "What is 6 * 7?")
        assert status == 200 and body["choices"][0]["message"]["content"] == "6 * 7 = 42."
        events = sse(h, 8000, "/v1/chat/completions", {
            "model": "dsv4-test", "stream": True,
            "messages": [{"role": "user", "content": "What is 1 + 1?"}]})
        assert events[-1] == "[DONE]"
        # a PD engine refuses a request without the router's bootstrap fields
        assert chat(h, 30032, "What is 6 * 7?")[0] == 400
        metrics = http(h, 29000, "/metrics")[1]
        assert 'smg_worker_pool_size{worker_type="decode"' in metrics
        h.systemctl("stop", "selftest-decode.service", check=True)
        wait_for(lambda: http(h, 8000, "/readiness")[0] == 503, 15, "router not ready")
    finally:
        for name in names:
            stop_unit(h, name)


def test_router_double_runs_only_for_router_faults(hosts: list[FakeHost],
                                                   fresh_sim_control: Any) -> None:
    """A control file that addresses the router starts the double (faults the real router cannot
    be made to show: here generation failing while every worker is healthy)."""
    h = hosts[1]
    h.write_sim_control({"by_mode": {"router": {"fail_generate": True}}})
    names = _pd_router_units(h)
    try:
        wait_for(lambda: ready(h, 8000, "/readiness"), 30, "router readiness")
        assert [r for r in h.sim_runs() if r.get("mode") == "router"][-1]["impl"] == "double"
        assert chat(h, 8000, "What is 6 * 7?")[0] == 500
    finally:
        for name in names:
            stop_unit(h, name)
