"""Output that fits the terminal and the pipe: every offline command's text output piped (not a
terminal) fits 100 columns; colour only on a terminal and never with NO_COLOR; one --format flag;
JSON diagnostics on stdout for --format json even when the command fails; `-` reads stdin;
`render` without -o prints the tree."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import click
import pytest

from orchestrator.cli import cli, main
from orchestrator.paths import data_dir

PROFILES = data_dir("profiles")
SHIPPED = sorted(str(p) for p in PROFILES.glob("*.yaml") if p.name != "inventory.yaml")
ANSI = re.compile(r"\x1b\[")
WIDTH = 100


def _offline_runs(tmp: Path) -> list[list[str]]:
    a, b = SHIPPED[0], SHIPPED[-1]
    runs: list[list[str]] = [["--help"], ["catalog", "models"], ["catalog", "gpus"],
                             ["catalog", "engines"], ["diff", a, b], ["diff", b, a],
                             ["diff", a, b, "--format", "markdown"]]
    for name, cmd in sorted(cli.commands.items()):
        runs.append([name, "--help"])
        if isinstance(cmd, click.Group):
            runs += [[name, sub, "--help"] for sub in sorted(cmd.commands)]
    for p in SHIPPED:
        runs += [["validate", p], ["validate", p, "-v"], ["plan", p], ["plan", p, "-v", "--explain"],
                 ["plan", p, "--format", "markdown", "--explain"],
                 ["render", p, "-o", str(tmp / Path(p).stem)]]
    bad = tmp / "bad.yaml"
    bad.write_text((PROFILES / "default.yaml").read_text().replace(
        "runner_backend: flashinfer_cutlass", "runner_backend: flashinfer_cutlas").replace(
        "mode: pd", "mode: pdd"))
    runs += [["validate", str(bad)], ["plan", str(bad)]]
    return runs


def test_every_offline_command_fits_100_columns_in_a_pipe(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # the default, not a width someone asked for
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    too_wide = []
    for args in _offline_runs(tmp_path):
        main(args)
        cap = capsys.readouterr()
        for stream in (cap.out, cap.err):
            assert not ANSI.search(stream), (args, "colour in a pipe")
            if "markdown" in args:  # a document, never folded (test_review_outputs.py)
                continue
            if args[0] == "diff":  # the prose only: unified diffs are verbatim patches
                stream = stream.split("\n--- a/")[0]
            too_wide += [(args, len(line), line) for line in stream.splitlines()
                         if len(line) > WIDTH and not _whole_command(line)]
    assert too_wide == [], "\n".join(f"{a}: {n}: {line}" for a, n, line in too_wide[:10])


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_on_a_terminal_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    tty = _Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    bad = str(PROFILES / "default.yaml")
    assert main(["plan", bad]) == 0
    assert ANSI.search(tty.getvalue())
    monkeypatch.setenv("NO_COLOR", "1")
    tty2 = _Tty()
    monkeypatch.setattr(sys, "stdout", tty2)
    assert main(["plan", bad]) == 0
    assert tty2.getvalue() and not ANSI.search(tty2.getvalue())


def test_one_format_flag_on_every_command() -> None:
    spelled: dict[str, list[str]] = {}
    for name, cmd in cli.commands.items():
        subs = cmd.commands.items() if isinstance(cmd, click.Group) else [(None, cmd)]
        for sub, c in subs:
            for p in c.params:
                if isinstance(p, click.Option) and not p.hidden:
                    for o in p.opts:
                        if o in ("--json", "--markdown", "--output-format", "--fmt"):
                            spelled.setdefault(f"{name} {sub or ''}".strip(), []).append(o)
    assert spelled == {}
    with_format = {n for n, c in cli.commands.items()
                   if any("--format" in getattr(p, "opts", ()) for p in c.params)}
    assert {"plan", "validate", "catalog", "history", "status", "diff"} <= with_format


@pytest.mark.parametrize("args", [["plan"], ["validate"]])
def test_format_json_errors_are_json_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               args: list[str]) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text((PROFILES / "default.yaml").read_text().replace("mode: pd", "mode: pdd"))
    assert main([*args, str(bad), "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["exit_code"] == 1
    (p,) = out["error"]["problems"]
    assert p["path"] == "topology.mode" and p["line"] and "did you mean 'pd'?" in p["fix"]


def test_dash_reads_the_profile_from_stdin(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(PROFILES)  # the inventory beside "-" is ./inventory.yaml
    monkeypatch.setattr(sys, "stdin", io.StringIO((PROFILES / "mxfp4-tp8.yaml").read_text()))
    assert main(["plan", "-", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile_name"] == "mxfp4-tp8"


def test_render_without_out_prints_the_tree(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", SHIPPED[0]]) == 0
    out = capsys.readouterr().out
    assert "units/dsv4-" in out and "bin/launch-" in out


def test_progress_is_a_bar_on_a_terminal_and_tenths_in_a_pipe(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.output import Progress

    p = Progress("load", 20.0)
    for i in range(21):
        p.update(i, f"{i} req")
    p.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "load:   0% 0 req" and lines[-1] == "load: 100% 20 req" and len(lines) == 11
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    p = Progress("load", 2.0)
    p.update(1.0, "1 req")
    p.close()
    assert "━" in tty.getvalue() and "1 req" in tty.getvalue()  # rich's bar


def test_columns_asks_for_another_width_in_a_pipe(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    assert main(["plan", SHIPPED[0]]) == 0
    wide = [ln for ln in capsys.readouterr().out.splitlines() if len(ln) > 60]
    assert all(_whole_command(ln) for ln in wide), wide


def _whole_command(line: str) -> bool:
    """A printed command is kept whole, wider than the terminal if need be (copied, it runs):
    the only text allowed past the width, and then alone on its line."""
    return bool(re.fullmatch(r"\s*`?dsv4ctl [^`]*`?\S?", line))


def test_status_words_are_coloured_by_meaning() -> None:
    """ "healthy" inside a failure line is not green (it was, in `FAILED: not healthy after
    40s`); a healthy line keeps its green."""
    from orchestrator.cli.output import styles_of

    def colours(line: str) -> dict[str, str]:
        return {line[s:e]: style for s, e, style in styles_of(line)}

    failed = colours("  health: FAILED: not healthy after 40s")
    assert "green" not in failed.values()
    assert failed["FAILED"] == "bold red" and failed["not healthy"] == "red"
    assert "green" not in colours("  decode: unhealthy (HTTP 503)").values()
    assert "green" not in colours("x error   capacity.layout: healthy layouts only").values()
    assert colours("Apply complete: r0002 is healthy.")["healthy"] == "green"
