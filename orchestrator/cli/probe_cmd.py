"""`dsv4ctl probe recall|load|chat`: measure a live endpoint the way its users feel it.

Thin adapters over :mod:`orchestrator.probes`: parse options, run the probe, print a table (or
JSON). The probes package is imported inside the command bodies, so other commands never load
it. Endpoint problems surface as :class:`orchestrator.errors.RemoteError` and are printed by the
CLI's one error boundary; a probe that ran but found a failure exits 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.options import TokenCount
from orchestrator.cli.output import (
    Progress,
    chosen_format,
    echo,
    format_option,
    json_alias_option,
)
from orchestrator.errors import DsvError, ExitCode


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DsvError(f"--{what} {text!r} is not a comma-separated list of numbers",
                       fix=f"e.g. --{what} 0,0.5,1") from None


def _lengths(text: str) -> list[int]:
    from orchestrator.profile.types import parse_tokens

    out = []
    for x in text.split(","):
        if not x.strip():
            continue
        try:
            out.append(int(parse_tokens(x.strip())))  # type: ignore[call-overload]
        except (ValueError, TypeError):
            raise DsvError(f"--lengths {text}: '{x.strip()}' is not a number of tokens",
                           fix="e.g. --lengths 1K,4K,16K,64K (K = 1024, M = 1024*1024)") from None
    return out


def _endpoint(url: str, api_key: str | None, timeout: float, deadline: float) -> Any:
    from orchestrator.probes.client import Endpoint

    return Endpoint(url, api_key=api_key, timeout_s=timeout, deadline_s=max(deadline, timeout))


_common = [
    click.option("--url", required=True, envvar="DSV4CTL_PROBE_URL", show_envvar=True,
                 help="Server root: the router in PD (http://HOST:8000) or an engine "
                      "(http://HOST:30000)."),
    click.option("--model", default=None,
                 help="Served model name. Default: the only model in /v1/models."),
    click.option("--api-key", default=None, envvar="DSV4CTL_API_KEY", show_envvar=True,
                 help="Bearer token, if the server wants one."),
    click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=1),
                 help="Seconds to wait for any single read."),
    click.option("--deadline", default=3600.0, show_default=True, type=click.FloatRange(min=1),
                 help="Seconds any one request (a streamed one included) may take in all."),
    format_option(("text", "json")),
    json_alias_option(),
]


def _with_common(fn: Any) -> Any:
    for opt in reversed(_common):
        fn = opt(fn)
    return fn


@click.group("probe")
def probe() -> None:
    """Probe a live OpenAI-compatible endpoint (recall, load, chat behaviours)."""


@probe.command("recall")
@_with_common
@click.option("--lengths", default="1k,2k,4k,8k,16k,32k,64k", show_default=True,
              help="Context lengths in tokens (K = 1024, M = 1024*1024), comma-separated.")
@click.option("--depths", default="0,0.25,0.5,0.75,1", show_default=True,
              help="Needle depths as fractions of the document (0 start, 1 end).")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Grid cells in flight at once.")
@click.option("--max-tokens", default=64, show_default=True, type=TokenCount(1, 8192))
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write a PNG heatmap (green recalled, red missed, grey error).")
@click.option("--min-full-recall", type=int, default=None,
              help="Exit 1 unless every cell up to this length is recalled.")
def recall_cmd(url: str, model: str | None, api_key: str | None, timeout: float,
             deadline: float, fmt: str,
               lengths: str, depths: str, concurrency: int, max_tokens: int, plot: Path | None,
               min_full_recall: int | None) -> int:
    """Needle-in-a-haystack recall over a grid of context lengths and depths.

    Hides "The secret code for <KEY> is <VALUE>." at each depth of a filler document of each
    length and asks for it at the end; prints recall per cell and the longest length with full
    recall. Lengths are calibrated against the server's own token counts.
    """
    from orchestrator.probes.client import resolve_model
    from orchestrator.probes.png import heatmap
    from orchestrator.probes.qualify import run_sync
    from orchestrator.probes.recall import run_recall

    ep = _endpoint(url, api_key, timeout, deadline)
    grid_l, grid_d = _lengths(lengths), _floats(depths, "depths")

    cells = Progress("recall", len(grid_l) * len(grid_d))
    done: list[Any] = []

    def on_cell(c: Any) -> None:
        done.append(c)
        cells.update(len(done), f"{len(done)}/{cells.total:g} cells")

    async def go() -> Any:
        name = await resolve_model(ep, model)
        return await run_recall(ep, name, grid_l, grid_d, concurrency=concurrency,
                                max_tokens=max_tokens, on_cell=on_cell)

    try:
        report = run_sync(go())
    finally:
        cells.close()
    if plot is not None:
        values = {(c.length, c.depth): (None if c.error else c.recalled) for c in report.cells}
        try:
            plot.write_bytes(heatmap(report.lengths, report.depths, values))
        except OSError as exc:
            raise DsvError(f"cannot write --plot {plot}: {exc.strerror or exc}",
                           fix="choose a writable path") from None
    if chosen_format(fmt) == "json":
        echo(json.dumps(report.as_dict(), indent=2), raw=True)
    else:
        echo(report.table())
    if plot is not None and chosen_format(fmt) != "json":
        echo(f"plot written to {plot}")
    best = report.longest_full_recall
    if min_full_recall is not None and (best is None or best < min_full_recall):
        return int(ExitCode.ERROR)
    return 0


class _Bar:
    """probe load's progress: elapsed of the duration, requests, tok/s, requests in flight."""

    def __init__(self, duration_s: float) -> None:
        self.progress = Progress("load", duration_s)

    def __call__(self, p: Any) -> None:
        rate = p.output_tokens / p.elapsed_s if p.elapsed_s > 0 else 0.0
        self.progress.update(p.elapsed_s, f"{p.requests} req, {rate:.1f} tok/s, "
                                          f"{p.in_flight} in flight")

    def close(self) -> None:
        self.progress.close()


@probe.command("load")
@_with_common
@click.option("--concurrency", "-c", default=16, show_default=True, type=click.IntRange(1, 4096),
              help="Requests in flight at once (closed loop).")
@click.option("--duration", "-d", default=30.0, show_default=True,
              type=click.FloatRange(min=0.1), help="Seconds to keep sending new requests.")
@click.option("--max-tokens", default=256, show_default=True, type=TokenCount(1, 65536),
              help="Output tokens per request (ignore_eos: every answer is this long).")
@click.option("--prompt-tokens", default=512, show_default=True, type=TokenCount(1, 10**6),
              help="Approximate prompt length per request.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@click.option("--min-tok-s", type=float, default=None,
              help="Exit 1 if output tokens/s falls below this.")
def load_cmd(url: str, model: str | None, api_key: str | None, timeout: float,
             deadline: float, fmt: str,
             concurrency: int, duration: float, max_tokens: int, prompt_tokens: int,
             no_progress: bool, min_tok_s: float | None) -> int:
    """Closed-loop streaming load: output tok/s, requests/s, TTFT and inter-token latency.

    CONCURRENCY workers send streaming chat completions back to back for DURATION seconds;
    requests in flight at the end finish and count.
    """
    from orchestrator.probes.client import resolve_model
    from orchestrator.probes.load import run_load
    from orchestrator.probes.qualify import run_sync

    ep = _endpoint(url, api_key, timeout, deadline)
    bar = None if no_progress else _Bar(duration)

    async def go() -> Any:
        name = await resolve_model(ep, model)
        return await run_load(ep, name, concurrency=concurrency, duration_s=duration,
                              max_tokens=max_tokens, prompt_tokens=prompt_tokens, progress=bar)

    try:
        report = run_sync(go())
    finally:
        if bar is not None:
            bar.close()
    if chosen_format(fmt) == "json":
        echo(json.dumps(report.figures(), indent=2), raw=True)
    else:
        echo(report.table())
    if report.requests_ok == 0:
        raise DsvError(f"no request succeeded: {report.errors[0] if report.errors else '?'}",
                       fix="check the server's log and `dsv4ctl probe chat`")
    if min_tok_s is not None and report.output_tok_s < min_tok_s:
        return int(ExitCode.ERROR)
    return 0


@probe.command("chat")
@_with_common
@click.option("-p", "--profile", "profile_path", metavar="FILE",
              type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Profile file (YAML) to take the expected sampling defaults (and --model) "
                   "from. Default: none (the defaults below).")
@click.option("--temperature", "expect_temperature", default=None, type=float,
              help="Expected default temperature. Default: the profile's, else 1.0.")
@click.option("--top-p", "expect_top_p", default=None, type=float,
              help="Expected default top_p. Default: the profile's, else 0.95.")
def chat_cmd(url: str, model: str | None, api_key: str | None, timeout: float,
             deadline: float, fmt: str,
             profile_path: Path | None, expect_temperature: float | None,
             expect_top_p: float | None) -> int:
    """Check reasoning separation, parsed tool calls and sampling defaults.

    Exits 1 and names the failing behaviour when reasoning leaks into the answer, a tool call
    comes back as raw markup, or requests without sampling parameters miss the defaults.
    """
    from orchestrator.probes.chat import run_chat
    from orchestrator.probes.client import resolve_model
    from orchestrator.probes.qualify import run_sync

    ep = _endpoint(url, api_key, timeout, deadline)
    if profile_path is not None:
        from orchestrator.profile.loader import load_profile

        prof = load_profile(profile_path)
        defaults = prof.serving.sampling_defaults
        expect_temperature = defaults.temperature if expect_temperature is None \
            else expect_temperature
        expect_top_p = defaults.top_p if expect_top_p is None else expect_top_p
        model = model or prof.model.served_name
    if expect_temperature is None:
        expect_temperature = 1.0
    if expect_top_p is None:
        expect_top_p = 0.95

    async def go() -> Any:
        name = await resolve_model(ep, model)
        return await run_chat(ep, name, temperature=expect_temperature, top_p=expect_top_p)

    report = run_sync(go())
    if chosen_format(fmt) == "json":
        echo(raw=True, message=json.dumps({"passed": report.passed,
                               "checks": [c.__dict__ for c in report.checks]}, indent=2))
    else:
        echo(report.table())
    return 0 if report.passed else int(ExitCode.ERROR)


def register(group: click.Group) -> None:
    group.add_command(probe)
