"""The dsv4ctl command line: a thin click adapter over the library, and the one error boundary.

Each command lives in a small module of this package and registers itself on the group. Nothing below
this package prints to the terminal or exits; library code raises typed errors
(:mod:`orchestrator.errors`) and :func:`main` maps them to messages and documented exit codes. Commands
import their heavy dependencies (fabric, the renderer) inside the command body, so ``dsv4ctl plan``
stays light.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import click

from orchestrator import __version__
from orchestrator.cli.options import route_library_logs
from orchestrator.cli.output import FORMAT, echo
from orchestrator.errors import EXIT_CODE_MEANINGS, DsvError, ExitCode, InputError, Problem

EXIT_CODES_HELP = "\b\nExit codes:\n" + "\n".join(
    f"  {int(code):<3} {meaning.replace('`', '')}" for code, meaning in EXIT_CODE_MEANINGS.items())

# Command modules, each with ``register(group)``. Order is the order of `dsv4ctl --help`.
COMMAND_MODULES = (
    "orchestrator.cli.plan_cmd",
    "orchestrator.cli.render_cmd",
    "orchestrator.cli.apply_cmd",
    "orchestrator.cli.probe_cmd",
    "orchestrator.cli.calibrate_cmd",
    "orchestrator.cli.qualify_cmd",
)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EXIT_CODES_HELP,
)
@click.version_option(__version__, prog_name="dsv4ctl")
def cli() -> None:
    """Deploy DeepSeek-V4-Flash on SGLang from a YAML profile.

    \b
    Typical flow:
      dsv4ctl validate profiles/x.yaml     check the profile's shape
      dsv4ctl plan profiles/x.yaml         prove it fits; see what would change
      dsv4ctl diff --git HEAD profiles/x.yaml   review a profile change
      dsv4ctl apply profiles/x.yaml        roll it out with health checks
      dsv4ctl rollback                     return to the last healthy release

    \b
    The same flag means the same thing on every command:
      -p, --profile FILE    the profile; where it is the command's subject (validate, plan,
                            render, apply) it may be the operand instead: `plan x.yaml` is
                            `plan -p x.yaml` (both, differing: a usage error). diff compares
                            two: OLD NEW, or --git REV PROFILE.
      --host NAME           the inventory host (or fleet member) to act on; it never probes:
                            `plan --live` plans against live facts.
      -i, --inventory FILE  the inventory file.
      --format FMT          the output format (of those the command has).
    """


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(cli)


_register_all()


def _json_error(code: int, message: str, fix: str | None = None,
                problems: Sequence[Problem] = ()) -> None:
    """A failure of a ``--format json`` run, as JSON on stdout (where the caller's parser reads)."""
    import json

    data = {"ok": False, "exit_code": code, "error": {
        "message": message, "fix": fix,
        "problems": [{"location": p.location(), "path": p.path, "value": p.value,
                      "message": p.message, "fix": p.fix, "file": p.file, "line": p.line,
                      "column": p.column} for p in problems]}}
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def main(argv: Sequence[str] | None = None) -> int:
    """Run dsv4ctl; returns the exit code instead of exiting (for tests and embedding). Everything
    printed is escaped for the terminal (:mod:`orchestrator.terminal`)."""
    from orchestrator.terminal import escaped_output

    with escaped_output():
        return _main(argv)


def _options() -> dict[str, frozenset[str]]:
    """command -> its option spellings (``probe recall`` for a group's commands)."""
    out: dict[str, frozenset[str]] = {}
    for name, cmd in cli.commands.items():
        subs = cmd.commands.items() if isinstance(cmd, click.Group) else [("", cmd)]
        for sub, c in subs:
            out[f"{name} {sub}".strip()] = frozenset(
                o for p in c.params for o in getattr(p, "opts", ()) if o.startswith("-"))
    return out


def _main(argv: Sequence[str] | None) -> int:
    from orchestrator.cli import rerun

    route_library_logs(False)
    FORMAT.set("text")
    rerun.RUN.set(None)
    rerun.OPTIONS.set(_options())
    words = list(argv) if argv is not None else sys.argv[1:]
    rerun.ARGV.set(tuple(words))
    rerun.VERB.set(next((w for w in words if not w.startswith("-")), None))
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="dsv4ctl",
                          standalone_mode=False)
    except DsvError as exc:
        if FORMAT.get() == "json":
            _json_error(int(exc.exit_code), exc.message,
                        rerun.complete(exc.fix) if exc.fix else exc.fix,
                        exc.problems if isinstance(exc, InputError) else ())
        echo(exc.render(), err=True)
        return int(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        echo("interrupted", err=True)
        return int(ExitCode.INTERRUPTED)
    except click.ClickException as exc:
        if FORMAT.get() == "json":
            _json_error(int(ExitCode.ERROR), exc.format_message())
        exc.show()
        # click uses 2 for usage errors; 2 means "changes present" here, so usage errors map to 1.
        return int(ExitCode.ERROR)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    return int(result) if isinstance(result, int) else 0


def entrypoint() -> None:
    sys.exit(main())
