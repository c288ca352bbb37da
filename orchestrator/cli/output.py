"""Everything dsv4ctl prints goes through here: fitted to the terminal, 100 columns in a pipe,
coloured on a terminal only.

Owns the output width and colour. rich decides what the stream is: a terminal gets its width and
colour (``NO_COLOR`` turns colour off, as https://no-color.org asks; rich honours it), a pipe or file
gets no colour and :data:`PIPE_WIDTH` columns (``COLUMNS`` overrides it). Long lines are folded at
word boundaries with a hanging indent that keeps the line's own indentation, so a check's message
stays under its title. Machine output (JSON, Prometheus text, a release tree's file contents) is
written ``raw``: unfolded and uncoloured, byte for byte.

``--format json`` commands also record the format here, so the error boundary
(:func:`orchestrator.cli.main`) can answer a failure as JSON on stdout.
"""

from __future__ import annotations

import contextvars
import os
import re
import sys
import textwrap
from typing import IO, Any

import click

from orchestrator.terminal import escape

PIPE_WIDTH = 100  # columns when stdout is not a terminal (logs, CI, `| cat`)
MAX_WIDTH = 120  # even on a wide terminal: prose longer than this is hard to read

FORMAT: contextvars.ContextVar[str] = contextvars.ContextVar("dsv4ctl_format", default="text")

# What gets a colour on a terminal (the words are the same in every command's text output).
# Colour follows meaning, not spelling: a failure line (FAILED, an error, "not healthy") gets no
# reassuring green, so "healthy" inside "FAILED: not healthy after 40s" is not green.
_FAILURE = re.compile(r"\bx error\b|\bFAILED\b|\bSHORT\b|^\s*error:|✗|\bfailed\b"
                      r"|\bnot (?:healthy|ready|serving)\b|\bunhealthy\b")
_STYLES = (
    (re.compile(r"\bx error\b|\bFAILED\b|\bSHORT\b|^error:|✗"), "bold red"),
    (re.compile(r"\bnot (?:healthy|ready|serving)\b|\bunhealthy\b"), "red"),
    (re.compile(r"! warning\b|\bdrift\b"), "yellow"),
    (re.compile(r"i info\b"), "dim"),
    (re.compile(r"^\s+(\+>?|\+) "), "green"),
    (re.compile(r"^\s+(-<?|-) "), "red"),
    (re.compile(r"^\s+(~>?|~) "), "yellow"),
    (re.compile(r"✓|(?<!not )(?<!un)\bhealthy\b|\bvalid profile\b"), "green"),
    (re.compile(r"^\s*fix: "), "cyan"),
    (re.compile(r"^(Plan|Diff):.*$"), "bold"),
)
_GOOD = "green"


def styles_of(line: str) -> list[tuple[int, int, str]]:
    """``(start, end, style)`` of each coloured span of ``line``: the one owner of what a word's
    colour means (a failure line gets no green)."""
    failure = bool(_FAILURE.search(line))
    return [(m.start(), m.end(), style) for pattern, style in _STYLES
            if not (failure and style == _GOOD) for m in pattern.finditer(line)]


def _console(err: bool) -> Any:
    from rich.console import Console  # imported on first output: `dsv4ctl --help` needs none

    from orchestrator.terminal import raw_stream

    # rich writes its own colour codes: it gets the stream beneath the CLI's escaping one, and
    # every text it prints is escaped here first (echo, table): orchestrator/terminal.py
    file: IO[str] = raw_stream(sys.stderr if err else sys.stdout)
    console = Console(file=file, highlight=False, soft_wrap=True, emoji=False, markup=False)
    if not console.is_terminal:
        console.width = _pipe_width()
    return console


def _pipe_width() -> int:
    """100 columns, unless COLUMNS says otherwise (the usual way to ask a tool for a width)."""
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return PIPE_WIDTH


def width(err: bool = False) -> int:
    c = _console(err)
    return min(c.width, MAX_WIDTH) if c.is_terminal else c.width


def fold(line: str, cols: int) -> list[str]:
    """``line`` in pieces of at most ``cols`` columns, continuation lines indented 4 more than
    the line itself. Words longer than a line (a URL, a path) are split rather than overflow."""
    if len(line) <= cols:
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    # markdown list items continue under their text; everything else 4 columns in
    markdown = line.lstrip().startswith(("- ", "* ", "| "))
    hang = (indent + ("  " if markdown else "    "))[: max(0, cols // 2)]
    return textwrap.wrap(line, width=cols, initial_indent="", subsequent_indent=hang,
                         break_long_words=True, break_on_hyphens=False, drop_whitespace=True,
                         replace_whitespace=False) or [line[:cols]]


_KEEP = "\x00"  # a space inside a printed command: folding never breaks a command in two
_DSV4CTL_COMMAND = re.compile(r"(?<![\w./-])dsv4ctl [a-z][^`;\n(#]*")


def _fold_keeping_commands(line: str, cols: int) -> list[str]:
    """:func:`fold`, but a ``dsv4ctl ...`` command stays on one line, whole (copied, it runs)."""
    if len(line) <= cols or "dsv4ctl " not in line:
        return fold(line, cols)
    kept = _DSV4CTL_COMMAND.sub(lambda m: m.group(0).rstrip().replace(" ", _KEEP)
                                + m.group(0)[len(m.group(0).rstrip()):], line)
    if kept == line:
        return fold(line, cols)
    indent = line[: len(line) - len(line.lstrip())]
    pieces = textwrap.wrap(kept, width=cols, subsequent_indent=indent + "    ",
                           break_long_words=False, break_on_hyphens=False)
    return [p.replace(_KEEP, " ") for p in pieces] or [line]


def echo(message: object = "", *, nl: bool = True, err: bool = False, raw: bool = False,
         wrap: bool = True) -> None:
    """Print ``message``: folded to the width and coloured on a terminal, unless ``raw``.
    ``wrap=False``: verbatim text (a file's diff), coloured on a terminal but never folded nor
    completed (a unified diff must still apply as a patch: a file line naming `dsv4ctl render`
    is the file's, not a command of this run); only prose is fitted to the terminal and has its
    printed commands completed with the run's -p, -i and --host."""
    text = "" if message is None else str(message)
    if raw:
        # escaped before click sees it: click strips escape sequences from what goes to a pipe,
        # so a pipe showed other bytes than were deployed (issue 31); escaped, both show \u001b
        click.echo(escape(text), nl=nl, err=err)
        return
    from orchestrator.cli.rerun import complete

    if wrap:
        text = complete(text)  # a printed command carries this run's -p, -i and --host
    # with --format json, stdout is the JSON document alone: every line for humans (progress,
    # the plan shown before a prompt) goes to stderr
    err = err or FORMAT.get() == "json"
    console = _console(err)
    cols = min(console.width, MAX_WIDTH) if console.is_terminal else console.width
    lines = text.split("\n")
    trailing = text.endswith("\n")
    if trailing:
        lines = lines[:-1]
    out: list[str] = []
    for line in lines:
        out += _fold_keeping_commands(line.rstrip(), cols) if wrap else [line]
    body = "\n".join(out) + ("\n" if trailing or nl else "")
    if not (console.is_terminal and console.color_system) or console.no_color:
        click.echo(escape(body), nl=False, err=err)
        return
    from rich.text import Text

    for i, line in enumerate(body.split("\n")):
        if i:
            console.file.write("\n")
        if line:
            t = Text(escape(line))
            for start, end, style in styles_of(line):
                t.stylize(style, start, end)
            console.print(t, end="")
    console.file.flush()


def echo_blocks(blocks: list[tuple[str, bool]]) -> None:
    """Print text made of prose (folded) and verbatim blocks (``(text, True)``: file diffs, code),
    which keep their lines whole."""
    for text, verbatim in blocks:
        echo(text, nl=False, wrap=not verbatim)


FORMAT_HELP = "Output format."  # every command's --format help starts so (test_cli_flags.py)


def format_option(choices: tuple[str, ...] = ("text", "json", "markdown"), default: str = "text",
                  help_text: str | None = None) -> Any:
    """``--format`` spelled the same on every command, its help ``FORMAT_HELP`` and then what is
    particular to the command's formats; the choice is remembered for the error boundary (a failed
    ``--format json`` run answers in JSON on stdout)."""

    def remember(ctx: click.Context, param: click.Parameter, value: str) -> str:
        FORMAT.set(value)
        return value

    return click.option("--format", "fmt", type=click.Choice(list(choices)), default=default,
                        show_default=True, callback=remember, is_eager=True,
                        help=FORMAT_HELP + (f" {help_text}" if help_text else ""))


def json_alias_option() -> Any:
    """The old ``--json`` flag of some commands: hidden, deprecated, the same as ``--format json``."""

    def alias(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            click.echo("warning: --json is deprecated; use --format json", err=True)
            FORMAT.set("json")
        return value

    return click.option("--json", "json_alias", is_flag=True, hidden=True, callback=alias,
                        expose_value=False)


def chosen_format(fmt: str) -> str:
    """The command's format after a deprecated alias may have chosen json."""
    return "json" if FORMAT.get() == "json" else fmt


def table(headers: list[str], rows: list[list[str]], *, err: bool = False,
          no_wrap: tuple[int, ...] = (0,)) -> None:
    """A table fitted to the width (cells wrap instead of the line overflowing), via rich.
    Columns in ``no_wrap`` (ids) keep their values whole."""
    from rich import box
    from rich.table import Table

    console = _console(err)
    console.width = width(err)
    tty = console.is_terminal
    t = Table(box=box.SIMPLE_HEAD if tty else None, show_edge=False, pad_edge=False,
              header_style="bold" if tty else "", padding=(0, 1) if tty else (0, 2, 0, 0))
    for i, h in enumerate(headers):
        t.add_column(escape(h), overflow="fold", no_wrap=i in no_wrap)
    for r in rows:
        t.add_row(*(escape(c) for c in r))
    if tty:
        console.print(t)
        return
    with console.capture() as cap:
        console.print(t)
    click.echo("\n".join(line.rstrip() for line in cap.get().splitlines()), err=err)


class Progress:
    """Progress of a long command on stderr: a rich progress bar on a terminal; in a pipe (CI
    logs) one plain line per tenth of the way, so a log shows progress without redraw codes."""

    def __init__(self, label: str, total: float) -> None:
        self.label, self.total = label, total
        self._console = _console(err=True)
        self._decile = -1
        self._bar: Any = None
        if self._console.is_terminal:
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                     console=self._console)
            self._task = self._bar.add_task(label, total=total, status="")
            self._bar.start()

    def update(self, done: float, status: str = "") -> None:
        frac = min(1.0, done / self.total) if self.total else 1.0
        if self._bar is not None:
            self._bar.update(self._task, completed=min(done, self.total), status=status)
        elif int(frac * 10) > self._decile:
            self._decile = int(frac * 10)
            echo(f"{self.label}: {frac:4.0%} {status}".rstrip(), err=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
