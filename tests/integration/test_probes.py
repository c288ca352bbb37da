"""The probes against the engine simulator (and its router double), run as local processes.

Proves the probes measure what they claim (issue 6 acceptance): with a recall horizon of 5,000
tokens `recall` finds full recall up to that length and failures beyond; with a token-rate cap
`load` reports the rate within 10%; `chat` passes on a well-behaved simulator and names the
failing behaviour under reasoning leak, raw tool-call markup or ignored sampling defaults; the
qualification gate passes and fails on those figures. The simulators listen on 127.0.0.1 (no
network namespaces needed); each gets its switches through `by_port` in one control file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.probes.chat import run_chat
from orchestrator.probes.client import Endpoint
from orchestrator.probes.load import run_load
from orchestrator.probes.qualify import run_qualification, run_sync
from orchestrator.probes.recall import run_recall
from orchestrator.profile.schema import Qualify
from tests.promtool.support import MODEL, REPO, Sims, free_port, resolved


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[Sims]:
    s = Sims(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def test_recall_finds_the_horizon(sims: Sims) -> None:
    url = sims.engine(recall_horizon_tokens=5000)
    rep = run_sync(run_recall(Endpoint(url), MODEL, [1000, 2500, 4500, 6000, 9000],
                              [0.0, 0.5, 1.0]))
    for n in (1000, 2500, 4500):
        assert rep.recall(n) == 1.0, rep.table()
    for n in (6000, 9000):
        assert rep.recall(n) == 0.0, rep.table()
    assert rep.longest_full_recall == 4500
    for n in rep.lengths:  # calibrated against the server's count: within 2% of the target
        measured = rep.measured_tokens(n)
        assert measured is not None and abs(measured - n) <= 0.02 * n, rep.table()
    assert "longest length with full recall: 4500 tokens" in rep.table()


def test_recall_without_horizon_is_full(sims: Sims) -> None:
    url = sims.engine()
    rep = run_sync(run_recall(Endpoint(url), MODEL, [2000, 12000], [0.0, 1.0]))
    assert rep.longest_full_recall == 12000


def test_load_reports_the_token_rate_cap(sims: Sims) -> None:
    rate = 400.0
    url = sims.engine(token_rate=rate, ttft_s=0.15)
    seen: list[Any] = []
    rep = run_sync(run_load(Endpoint(url), MODEL, concurrency=8, duration_s=4.0, max_tokens=64,
                            prompt_tokens=200, progress=seen.append, progress_interval_s=0.5))
    assert rep.requests_failed == 0 and rep.requests_ok >= 16, rep.table()
    assert abs(rep.output_tok_s - rate) <= 0.10 * rate, rep.table()
    assert rep.output_tokens == 64 * rep.requests_ok  # ignore_eos: every answer max_tokens long
    f = rep.figures()
    assert f["ttft_s_p50"] is not None and 0.15 <= f["ttft_s_p50"] < 1.0, rep.table()
    # 8 streams share 400 tok/s: a stream gets a token about every 8/400 s.
    assert f["itl_s_p50"] is not None and 0.01 <= f["itl_s_p50"] <= 0.04, rep.table()
    assert len(seen) >= 6 and seen[-1].in_flight == 0


def test_load_rate_tracks_a_different_cap(sims: Sims) -> None:
    url = sims.engine(token_rate=150.0)
    rep = run_sync(run_load(Endpoint(url), MODEL, concurrency=4, duration_s=3.0, max_tokens=32))
    assert abs(rep.output_tok_s - 150.0) <= 15.0, rep.table()


@pytest.mark.parametrize(("switches", "parsers", "failing"), [
    ({}, True, []),
    ({"reasoning_leak": True}, True, ["reasoning"]),
    ({"raw_toolcall": True}, True, ["tool_call"]),
    ({"ignore_sampling_defaults": True}, True, ["sampling_defaults"]),
    ({}, False, ["reasoning", "tool_call"]),  # engine started without the parsers
])
def test_chat_names_the_failing_behaviour(sims: Sims, switches: dict[str, Any], parsers: bool,
                                          failing: list[str]) -> None:
    url = sims.engine(parsers=parsers, **switches)
    rep = run_sync(run_chat(Endpoint(url), MODEL, temperature=1.0, top_p=0.95))
    assert rep.failing() == failing, rep.table()
    assert rep.passed == (not failing)


def test_chat_flags_wrong_expected_defaults(sims: Sims) -> None:
    url = sims.engine()
    rep = run_sync(run_chat(Endpoint(url), MODEL, temperature=0.6, top_p=0.95))
    assert rep.failing() == ["sampling_defaults"]
    assert "temperature" in rep.checks[2].detail


def test_probes_through_the_pd_router(sims: Sims) -> None:
    prefill = sims.engine(mode="prefill", recall_horizon_tokens=3000)
    decode = sims.engine(mode="decode", recall_horizon_tokens=3000, raw_toolcall=True)
    router = sims.router(prefill, decode)
    ep = Endpoint(router)
    chat = run_sync(run_chat(ep, MODEL))
    assert chat.failing() == ["tool_call"], chat.table()
    rep = run_sync(run_recall(ep, MODEL, [2000, 4000], [0.5]))
    assert rep.longest_full_recall == 2000, rep.table()


def test_cli_probe_commands(sims: Sims, capsys: pytest.CaptureFixture[str],
                            tmp_path: Path) -> None:
    good = sims.engine(recall_horizon_tokens=5000)
    leak = sims.engine(reasoning_leak=True)
    assert main(["probe", "chat", "--url", good]) == 0
    assert main(["probe", "chat", "--url", leak]) == 1
    out = capsys.readouterr().out
    assert "FAIL  reasoning" in out and "reasoning leaked into content" in out
    # Expected defaults from a profile: the shipped one matches the server, a changed one not.
    assert main(["probe", "chat", "--url", good, "--profile",
                 str(REPO / "profiles" / "default.yaml")]) == 0
    changed = tmp_path / "cold.yaml"
    changed.write_text((REPO / "profiles" / "default.yaml").read_text().replace(
        "temperature: 1.0", "temperature: 0.6"))
    capsys.readouterr()
    assert main(["probe", "chat", "--url", good, "--profile", str(changed)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  sampling_defaults" in out and "temperature 0.6" in out
    png = tmp_path / "recall.png"
    assert main(["probe", "recall", "--url", good, "--model", MODEL, "--lengths", "1k,4k,8k",
                 "--depths", "0,1", "--plot", str(png), "--min-full-recall", "4000"]) == 0
    out = capsys.readouterr().out
    assert "longest length with full recall: 4096 tokens" in out  # 4k = 4 x 1024
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert main(["probe", "recall", "--url", good, "--lengths", "1k,8k", "--depths", "0.5",
                 "--min-full-recall", "8000"]) == 1
    capsys.readouterr()
    assert main(["probe", "load", "--url", good, "-c", "2", "-d", "1", "--max-tokens", "8",
                 "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["requests_ok"] > 0 and figures["output_tok_s"] > 0


def test_cli_unreachable_endpoint_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()  # nothing listens there
    for cmd in ("chat", "load", "recall"):
        assert main(["probe", cmd, "--url", f"http://127.0.0.1:{port}"]) == 1
        err = capsys.readouterr().err
        assert "error: cannot connect to" in err and "connection refused" in err, err
        assert "Traceback" not in err


def _qualify(**kw: Any) -> Qualify:
    return Qualify(load_concurrency=4, load_duration_s=2.0, **kw)


def test_qualification_passes_and_fails_on_figures(sims: Sims) -> None:
    _, dep = resolved(REPO / "profiles" / "default.yaml")
    url = sims.engine(recall_horizon_tokens=5000, token_rate=400.0)
    ok = run_qualification(url, dep, _qualify(min_recall_tokens=4000, min_output_tok_s=300.0))
    assert ok.passed, ok.reason
    assert ok.figures["recall_full_tokens"] == 4000
    assert ok.figures["chat_reasoning"] == "pass"
    assert 360 <= float(ok.figures["load_output_tok_s"]) <= 440
    deep = run_qualification(url, dep, _qualify(min_recall_tokens=8000))
    assert not deep.passed and "recall: full recall only up to 4000 tokens, 8000 required" in (
        deep.reason)
    fast = run_qualification(url, dep, _qualify(min_output_tok_s=1000.0))
    assert not fast.passed and "load:" in fast.reason and "1000 required" in fast.reason


def test_qualification_fails_on_chat_and_unreachable(sims: Sims) -> None:
    _, dep = resolved(REPO / "profiles" / "default.yaml")
    url = sims.engine(raw_toolcall=True)
    res = run_qualification(url, dep, _qualify())
    assert not res.passed and res.reason.startswith("chat tool_call: raw tool-call markup")
    down = run_qualification(f"http://127.0.0.1:{free_port()}", dep, _qualify())
    assert not down.passed and "could not run" in down.reason and "connection refused" in (
        down.reason)


def test_qualification_runs_inside_an_event_loop(sims: Sims) -> None:
    """Apply may call it from async code: it must not fail with 'loop already running'."""
    import asyncio

    _, dep = resolved(REPO / "profiles" / "default.yaml")
    url = sims.engine()

    async def caller() -> Any:
        return run_qualification(url, dep, _qualify())

    assert asyncio.run(caller()).passed


