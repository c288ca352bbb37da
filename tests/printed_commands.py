"""Every ``dsv4ctl`` command the CLI prints during the suite, checked where it is printed.

Issue 32: a printed command is runnable as printed and acts on the deployment of the run that
printed it (its ``-p``, ``-i`` and ``--host``). The CLI's own completion of printed commands is
:mod:`orchestrator.cli.rerun`; this module is the suite's check of what came out of it, over
every in-process CLI run any test makes (``orchestrator.cli.main``, however a test calls it:
``main(argv)``, inside a ``CliRunner``, ``entrypoint()``).

Owns, for the suite: finding the commands in a run's output (:func:`commands_in`), and deciding
whether one is sound for the run that printed it (:func:`check`): it parses with the real click
CLI (``make_context``, nothing runs); where the command has ``-p``/``-i``/``--host`` it names the
profile and inventory the run named and a host of the run's; and resolving what it acts on
(profile and inventory loaded, targets resolved with the CLI's own rule,
:func:`orchestrator.cli.fleet_cmd.source_targets`; no connection) gives the run's deployment and
hosts. Exempt: a command in double quotes (a quotation of what some run did, e.g. a lock holder's
command line; :mod:`orchestrator.cli.rerun` leaves those as they were given), a JSON document's
``command`` and ``content`` values (the record of a run, a file's text), and what the CLI prints
as a file's own text (a rendered tree, a file diff: see the hook below).

The check runs right after each CLI run, in the process that ran it (so it holds under
pytest-xdist, where a worker has no other's runs, and while the test's files still exist); a
violation fails the test that made the run (tests/conftest.py), naming the command and the
argv that printed it. Cost: parsing, plus one target resolution per distinct (files, host).
Subprocess runs of dsv4ctl (the signal tests) are outside it. Past 400 lines: one check read
top to bottom (finding, parsing, resolving, comparing) and its hook into the CLI; the seam, if it
grows, is the hook (the Collector) into a module of its own.
"""

from __future__ import annotations

import contextvars
import io
import json
import os
import re
import shlex
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A command starts at `dsv4ctl VERB` (VERB one of the CLI's commands, as a word: `dsv4ctl plan:
# default` is a heading, `dsv4ctl sets ...` prose), not inside a word or a path, nor in click's
# synopsis (`Usage: dsv4ctl plan [OPTIONS]`). Right after a double quote it is a quotation (left
# out); right after a single quote it ends at the closing one (click's `Try 'dsv4ctl plan --help'`).
# Else it ends at a backtick, a newline, `;`, a bracket, two spaces (help's `dsv4ctl plan x.yaml
# <spaces> what it does`) or a ` #` comment, outside shell quotes.
_START = re.compile(r'(?<![\w./\\-])(?<!Usage: )dsv4ctl ([a-z][a-z-]*)(?=$|[\s`;().,\'])')
_ENDS = "`;()\n"
# commands that act on a deployment: their targets are resolved and compared
_ACTS = frozenset({"plan", "render", "apply", "rollback", "history", "status", "unlock",
                   "calibrate", "qualify kernels"})
# commands whose subject is a profile: given none, the bundled default profile
_PROFILE_SUBJECT = frozenset({"validate", "plan", "render", "apply"})
# ... of which these take a host named alone (no profile): the host is what they act on
_HOST_ALONE = frozenset({"rollback", "history", "status", "unlock", "calibrate",
                         "qualify kernels"})


@dataclass(frozen=True)
class Violation:
    """A printed command that is not runnable as printed, or acts elsewhere than its run."""

    command: str
    printed_by: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        return (f"printed command: {self.command}\n  printed by: dsv4ctl "
                f"{shlex.join(self.printed_by)}\n  {self.reason}")


@dataclass(frozen=True)
class Given:
    """What one command line names: its verb and the -p/-i/--host it gives (None: not given),
    and which of those flags the command has at all."""

    verb: str
    profile: Path | None
    inventory: Path | None
    host: str | None
    flags: frozenset[str]
    twice: str | None = None  # the profile given as the operand and as -p, differing


class ParseError(Exception):
    pass


def _cli() -> Any:
    from orchestrator.cli import cli

    return cli


def parse(argv: Sequence[str]) -> Given:
    """``argv`` (without ``dsv4ctl``) parsed by the real CLI, nothing run. Raises ParseError."""
    import click

    from orchestrator.cli.options import route_library_logs

    def run() -> Given:
        group = _cli()
        words = list(argv)
        if any(w in ("-h", "--help", "--version") for w in words):
            raise ParseError("help")  # click prints and exits; nothing to compare
        ctx = group.make_context("dsv4ctl", words)
        verb: list[str] = []
        cmd: Any = group
        rest = [*ctx._protected_args, *ctx.args]
        while isinstance(cmd, click.Group):
            if not rest:
                raise ParseError(f"`dsv4ctl {' '.join(verb)}` needs a command")
            name, sub, rest = cmd.resolve_command(ctx, rest)
            verb.append(str(name))
            ctx = sub.make_context(name, rest, parent=ctx)
            cmd = sub
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args] if isinstance(
                sub, click.Group) else []
        return _given(" ".join(verb), cmd, ctx.params)

    # the CLI's option callbacks record the run's target and format in context variables, and
    # --debug routes library logs: none of that may leak out of a check
    try:
        return contextvars.copy_context().run(run)
    except ParseError:
        raise
    except click.exceptions.Exit as exc:
        raise ParseError("help") from exc
    except click.ClickException as exc:
        raise ParseError(exc.format_message()) from exc
    finally:
        route_library_logs(False)


def _given(verb: str, cmd: Any, params: dict[str, Any]) -> Given:
    import click

    by_flag: dict[str, Any] = {}
    for p in cmd.params:
        for o in getattr(p, "opts", ()):
            if o in ("-p", "-i", "--host"):
                by_flag[o] = params.get(p.name)
    profile = by_flag.get("-p")
    twice = None
    if "-p" in by_flag:
        # the subject as an operand (validate, plan, render, apply); given both ways and
        # different, the command refuses to run (a usage error when it is invoked)
        for p in cmd.params:
            if isinstance(p, click.Argument) and isinstance(p.type, click.Path):
                v = params.get(p.name)
                operand = v[-1] if isinstance(v, tuple) and v else v if v else None
                if operand is not None and profile is not None and not _same(operand, profile):
                    twice = f"{operand} and -p {profile}"
                profile = profile if profile is not None else operand
                break
    host = by_flag.get("--host") or params.get("old_host")
    return Given(verb, Path(profile) if profile else None,
                 Path(by_flag["-i"]) if by_flag.get("-i") else None, host,
                 frozenset(by_flag), twice)


def commands_in(text: str) -> Iterator[str]:
    """The ``dsv4ctl VERB ...`` commands in ``text``, each as printed (quotations left out)."""
    verbs = set(_cli().commands)
    for m in _START.finditer(text):
        before = text[m.start() - 1:m.start()]
        if m.group(1) not in verbs or before == '"':
            continue
        if before == "'":
            end = text.find("'", m.start())
            yield text[m.start():end if end >= 0 else len(text)]
        else:
            yield _cut(text[m.start():])


def _strings(doc: Any, key: str | None = None) -> Iterator[str]:
    if isinstance(doc, str):
        if key not in ("command", "content"):  # a run's record, a file's text
            yield doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield from _strings(v, str(k))
    elif isinstance(doc, list):
        for v in doc:
            yield from _strings(v, key)


def _cut(text: str) -> str:
    """The command at the start of ``text``: up to the first terminator outside quotes. A quote
    left open at the line's end was an apostrophe of the prose after the command."""
    quote, opened = "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
            elif ch == "\n":
                return text[:opened].rstrip()
        elif ch in "'\"":
            quote, opened = ch, i
        elif ch in _ENDS or text.startswith("  ", i) or (
                ch == "#" and text[i - 1:i].isspace()):
            return text[:i].rstrip()
    return (text[:opened] if quote else text).rstrip()


def _words(command: str) -> list[str]:
    words = shlex.split(command)
    if words and words[-1][-1:] in ".,:" and len(words[-1]) > 1:
        words[-1] = words[-1][:-1]  # the sentence's full stop, not the command's
    return words[1:]


def _same(a: Path, b: Path) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def _plan_profile(path: Path) -> tuple[Path | None, bool]:
    """(the profile a saved plan names, whether ``path`` is a saved plan at all)."""
    from orchestrator.cli.common import is_plan_file

    if not path.is_file() or not is_plan_file(path):
        return path, False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, True
    p = data.get("profile_path") if isinstance(data, dict) else None
    if p is None and isinstance(data, dict) and isinstance(data.get("plans"), list) and \
            data["plans"] and isinstance(data["plans"][0], dict):
        p = data["plans"][0].get("profile_path")  # a fleet's plan: its hosts' profile
    return (Path(p) if isinstance(p, str) and p else None), True


@dataclass(frozen=True)
class Deployment:
    """What a command acts on: the profile's name (None: a host named alone) and the hosts."""

    profile: str | None
    hosts: frozenset[str]


def _stamp(path: Path | None) -> tuple[str, int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (os.path.abspath(path), st.st_mtime_ns, st.st_size)


_CACHE: dict[tuple[Any, ...], Deployment | str] = {}


def deployment(given: Given) -> Deployment:
    """The deployment ``given`` acts on, by the CLI's own rules, with no connection. Raises the
    CLI's error when it names none (a host not in the inventory, a profile that does not load)."""
    from orchestrator.paths import default_profile

    source = given.profile or default_profile()
    beside = source.parent / "inventory.yaml"
    key = (given.verb in _HOST_ALONE and given.profile is None, given.verb == "validate",
           _stamp(source), _stamp(given.inventory), _stamp(beside),
           _stamp(Path("inventory.yaml")), os.getcwd(), given.host)
    hit = _CACHE.get(key)
    if hit is None:
        try:
            hit = _resolve(given, source)
        except Exception as exc:  # the CLI's refusal, kept for the report
            hit = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
        _CACHE[key] = hit
    if isinstance(hit, str):
        raise LookupError(hit)
    return hit


def _resolve(given: Given, source: Path) -> Deployment:
    if given.verb == "validate":
        from orchestrator.profile.loader import load_text, read_file
        from orchestrator.profile.schema import Profile

        return Deployment(load_text(Profile, read_file(source), str(source)).name, frozenset())
    if given.verb in _HOST_ALONE and given.profile is None and given.host is not None:
        from orchestrator.cli.common import resolve_host

        name, _ = resolve_host(None, given.inventory, given.host)
        return Deployment(None, frozenset({name}))
    from orchestrator.cli.fleet_cmd import source_targets

    t = source_targets(source, given.inventory, given.host)
    return Deployment(t.profile_name, frozenset(t.moved))


def check(command: str, printed_by: Sequence[str]) -> list[Violation]:
    """Whether ``command`` (as printed) is sound for the run ``dsv4ctl PRINTED_BY`` that printed
    it: runnable as printed, and acting on that run's deployment."""
    argv = tuple(printed_by)

    def bad(reason: str) -> list[Violation]:
        return [Violation(command, argv, reason)]

    try:
        words = _words(command)
    except ValueError as exc:
        return bad(f"it does not split as a shell command line: {exc}")
    try:
        printed = parse(words)
    except ParseError as exc:
        return [] if str(exc) == "help" else bad(f"it does not parse: {exc}")
    if printed.twice:
        return bad(f"it names the profile twice ({printed.twice}): the CLI refuses it")
    try:
        run = parse(argv)
    except ParseError:
        return []  # a run the CLI refused: it names no deployment to compare with
    if run.twice:
        return []  # so is a run that names it twice
    out: list[str] = []
    run_profile, _ = _plan_profile(run.profile) if run.profile else (None, False)
    if run_profile is not None and "-p" in printed.flags:
        mine, _ = _plan_profile(printed.profile) if printed.profile else (None, False)
        if mine is None:
            out.append(f"it names no profile; the run's is {run_profile} (run as printed, it "
                       "takes the bundled default profile)")
        elif not _same(mine, run_profile):
            out.append(f"it names profile {mine}; the run's is {run_profile}")
    if run.inventory is not None and "-i" in printed.flags:
        if printed.inventory is None:
            out.append(f"it names no inventory; the run's is {run.inventory}")
        elif not _same(printed.inventory, run.inventory):
            out.append(f"it names inventory {printed.inventory}; the run's is {run.inventory}")
    run_dep: Deployment | None = None
    if run.verb in _ACTS or run.verb == "validate":
        try:
            run_dep = deployment(run)
        except LookupError:
            run_dep = None  # the run itself names no deployment (it was refused)
    if run.host is not None and "--host" in printed.flags:
        hosts = {run.host, *(run_dep.hosts if run_dep else ())}
        if printed.host is None:
            out.append(f"it names no host; the run's is --host {run.host}")
        elif printed.host not in hosts:
            out.append(f"it names --host {printed.host}; the run's is --host {run.host}")
    # `-p PROFILE` where the run named no profile (a host named alone): a placeholder for what
    # the run does not know, which acts on no deployment until filled in (rerun.py writes it)
    placeholder = run_profile is None and printed.profile is not None and bool(
        re.fullmatch(r"[A-Z][A-Z_-]*", str(printed.profile)))
    if (run_dep is not None and run_dep.profile is None and printed.profile is None
            and printed.verb in _PROFILE_SUBJECT):
        out.append("it names no profile, so it takes the bundled default profile; the run "
                   "named a host alone, whose profile it does not know")
    if run_dep is not None and (printed.verb in _ACTS or printed.verb == "validate") and \
            not out and not placeholder:
        try:
            dep = deployment(printed)
        except LookupError as exc:
            out.append(f"run as printed, it names no deployment ({exc}); the run's is "
                       f"{_describe(run_dep)}")
        else:
            if dep.profile is not None and run_dep.profile is not None and \
                    dep.profile != run_dep.profile:
                out.append(f"it acts on deployment {_describe(dep)}; the run's is "
                           f"{_describe(run_dep)}")
            elif run_dep.hosts and not dep.hosts <= run_dep.hosts:
                out.append(f"it acts on host(s) {', '.join(sorted(dep.hosts))}; the run's are "
                           f"{', '.join(sorted(run_dep.hosts))}")
    return [Violation(command, argv, r) for r in out]


def _describe(d: Deployment) -> str:
    return (f"'{d.profile}'" if d.profile else "a host named alone") + (
        f" on {', '.join(sorted(d.hosts))}" if d.hosts else "")


def check_output(text: str, printed_by: Sequence[str]) -> list[Violation]:
    """:func:`check` for every command printed in ``text``."""
    return [v for c in commands_in(text) for v in check(c, printed_by)]


# ---- the hook into the CLI ------------------------------------------------------------------
#
# What a run writes to stdout and stderr is copied (beneath the CLI's escaping layer), except what
# the CLI prints as it is: ``echo(raw=True)`` (JSON, file trees, markdown documents, Prometheus
# text) and ``echo(wrap=False)`` (file diffs), whose text is a file's, not a command for the
# operator. Of those, a JSON document is searched string by string (its fixes are for the
# operator too), its ``command`` and ``content`` values left out.

_LOCAL = threading.local()  # per thread: inside a raw or verbatim echo (fleet probes print too)


class _Run:
    def __init__(self, argv: tuple[str, ...]) -> None:
        self.argv = argv
        self.out, self.err = io.StringIO(), io.StringIO()
        self.raw: list[str] = []
        self.verbatim: list[str] = []


_ACTIVE: list[_Run] = []


class _Tee:
    """A text stream that writes to ``inner`` and also into ``copy`` (outside raw output)."""

    def __init__(self, inner: Any, copy: io.StringIO) -> None:
        self._inner, self._copy = inner, copy

    def write(self, text: str) -> int:
        n = self._inner.write(text)  # first: click's bytes probe (write(b"")) must fail here
        if not getattr(_LOCAL, "verbatim", 0):
            self._copy.write(text)
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _teed(stream: Any, copy: io.StringIO) -> Any:
    """``stream`` also writing into ``copy``, beneath the CLI's escaping layer so what the CLI
    writes raw (rich's own codes) stays raw."""
    from orchestrator.terminal import _EscapingStream

    if isinstance(stream, _EscapingStream):
        return _EscapingStream(_Tee(stream.raw, copy))  # type: ignore[arg-type]
    return _Tee(stream, copy)


def _documents(texts: Sequence[str]) -> Iterator[str]:
    """The strings of the JSON documents among ``texts`` (raw output), but records and files."""
    for t in texts:
        try:
            doc = json.loads(t)
        except ValueError:
            continue
        yield from _strings(doc)


def _whole_commands(text: str) -> Iterator[str]:
    """The lines of verbatim text that are a command whole (plan -o's `Apply it with:` line is
    printed unfolded); a file diff's lines start with its +, - or one space."""
    for line in text.splitlines():
        if re.match(r"\s*dsv4ctl ", line) and not re.match(r"[ +-]\S", line):
            yield from commands_in(line)


class Collector:
    """Collects the violations of the CLI runs made while it is installed."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.commands = 0  # commands checked over all runs, for the summary line
        self._installed = False

    def install(self) -> None:
        """Wrap the CLI's run (``orchestrator.cli._main``) and its printer (``echo``)."""
        import orchestrator.cli as cli_mod
        import orchestrator.cli.output as output

        if self._installed:
            return
        self._installed = True
        real_main, real_echo = cli_mod._main, output.echo

        def echo(message: object = "", *, nl: bool = True, err: bool = False,
                 raw: bool = False, wrap: bool = True) -> None:
            if not raw and wrap:
                return real_echo(message, nl=nl, err=err, raw=raw, wrap=wrap)
            _LOCAL.verbatim = getattr(_LOCAL, "verbatim", 0) + 1
            try:
                return real_echo(message, nl=nl, err=err, raw=raw, wrap=wrap)
            finally:
                _LOCAL.verbatim -= 1
                if _ACTIVE and message is not None:
                    (_ACTIVE[-1].raw if raw else _ACTIVE[-1].verbatim).append(str(message))

        def _main(argv: Sequence[str] | None) -> int:
            run = _Run(tuple(argv) if argv is not None else tuple(sys.argv[1:]))
            old = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = _teed(old[0], run.out), _teed(old[1], run.err)
            _ACTIVE.append(run)
            try:
                return real_main(argv)
            finally:
                _ACTIVE.remove(run)
                sys.stdout, sys.stderr = old
                self._check(run)

        cli_mod._main = _main  # type: ignore[assignment]
        # `from orchestrator.cli.output import echo` bound the printer in the modules loaded so
        # far; the ones loaded later bind the wrapper
        for name, mod in list(sys.modules.items()):
            if name.startswith("orchestrator.") and getattr(mod, "echo", None) is real_echo:
                mod.echo = echo  # type: ignore[attr-defined]

    def _check(self, run: _Run) -> None:
        found = [c for text in (run.out.getvalue(), run.err.getvalue())
                 for c in commands_in(text)]
        found += [c for s in _documents(run.raw) for c in commands_in(s)]
        found += [c for s in run.verbatim for c in _whole_commands(s)]
        self.commands += len(found)
        for c in found:
            self.violations += check(c, run.argv)

    def take(self) -> list[Violation]:
        out, self.violations = self.violations, []
        return out


COLLECTOR = Collector()
