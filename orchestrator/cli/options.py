"""Options shared by every dsv4ctl command: verbosity (where library logs go), and the one spelling
and help text of -p/--profile, --host and --inventory.

One place so a flag is spelled and behaves the same on every command.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def route_library_logs(verbose: bool) -> None:
    """paramiko logs each failed handshake with a traceback at ERROR; with no handler, Python prints
    it to stderr next to our own one-line error. Libraries' logs go to stderr only with -v."""
    log = logging.getLogger("paramiko")
    for h in list(log.handlers):
        if getattr(h, "_dsv4ctl", False):
            log.removeHandler(h)
    handler: logging.Handler
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.setLevel(logging.DEBUG)
    else:
        handler = logging.NullHandler()
        log.setLevel(logging.WARNING)
    handler._dsv4ctl = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.propagate = False


DETAIL_HELP = ("Show what the summary leaves out: info checks, rule sources, and the diffs of "
               "files that restart nothing.")
DEBUG_HELP = "Show what libraries log (SSH handshakes, key exchange) on stderr."


def detail_option() -> Any:
    """``-v/--verbose``, the one meaning on every command that has it: more detail in the text
    output (:data:`DETAIL_HELP`). Library logs are ``--debug``'s."""
    return click.option("-v", "--verbose", is_flag=True, help=DETAIL_HELP)


def debug_option() -> Any:
    """``--debug``: route library logs (paramiko) to stderr."""

    def _set(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        route_library_logs(bool(value))
        return bool(value)

    return click.option("--debug", is_flag=True, callback=_set, expose_value=False,
                        help=DEBUG_HELP)


def verbose_option() -> Any:
    """The commands that touch a host: ``--debug`` for library logs, and ``-v`` refused with the
    way to what it used to show (it meant library logs here, more detail elsewhere)."""

    def _refuse(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            raise click.UsageError(
                "-v/--verbose shows more detail on validate, plan and diff; this command's "
                "library logs (SSH) are behind --debug", ctx=ctx)
        return False

    def deco(fn: Any) -> Any:
        fn = debug_option()(fn)
        return click.option("-v", "--verbose", is_flag=True, expose_value=False, hidden=True,
                            callback=_refuse)(fn)

    return deco


class TokenCount(click.ParamType):
    """A token count on the command line: ``4096``, ``64K`` (x1024) or ``1M`` (x1048576), as in
    profiles (:func:`orchestrator.profile.types.parse_tokens` is the one parser)."""

    name = "tokens"

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from orchestrator.profile.types import parse_tokens

        try:
            n = parse_tokens(value if isinstance(value, str) else str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not isinstance(n, int) or not self.lo <= n <= self.hi:
            self.fail(f"{value} is not a token count in {self.lo:,}..{self.hi:,}", param, ctx)
        return n



# One spelling and one help text per shared flag (tests/unit/test_cli_flags.py compares them):
# `-p/--profile FILE` names the profile on every command that reads one; `--host NAME` is always the
# inventory host (or fleet member) the command acts on, never "probe it" (that is `plan --live`).
PROFILE_HELP = "Profile file (YAML). Default: the bundled profiles/default.yaml."
HOST_HELP = ("Inventory host (or member of the profile's fleet) to act on. Default: the profile's "
             "host; a fleet profile: see the command's help.")
INVENTORY_HELP = "Inventory file. Default: inventory.yaml beside the profile, then ./inventory.yaml."


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option callback that records the value as the run's target (cli/rerun.py): every
    command dsv4ctl prints for the operator then carries it."""
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        from orchestrator.cli.rerun import record

        record(**{key: value})
        return value

    return callback


def inventory_option() -> Any:
    return click.option("--inventory", "-i", type=click.Path(dir_okay=False, path_type=Path),
                        default=None, envvar="DSV4CTL_INVENTORY", show_envvar=True,
                        help=INVENTORY_HELP, callback=_remember("inventory"))


def host_option() -> Any:
    return click.option("--host", "host_name", metavar="NAME", default=None, help=HOST_HELP,
                        callback=_remember("host"))


def _same_path(a: Path, b: Path) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def profile_option(operand: str | None = None) -> Any:
    """``-p/--profile FILE``. Where the profile is the command's subject (``operand`` names the
    PROFILE/SOURCE argument) it may be given either way, and the command sees one value; given both
    ways and different, it is a usage error rather than a silent pick. Elsewhere the option alone
    names it, as ``profile_path``."""
    opt = click.option("-p", "--profile", "profile_opt" if operand else "profile_path",
                       type=click.Path(dir_okay=False, path_type=Path), default=None,
                       metavar="FILE", help=PROFILE_HELP,
                       callback=None if operand else _remember("profile"))
    if operand is None:
        return opt

    def decorate(fn: Callable[..., Any]) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, profile_opt: Path | None, **kwargs: Any) -> Any:
            given = kwargs.get(operand)
            if given is not None and profile_opt is not None and not _same_path(given, profile_opt):
                raise click.UsageError(
                    f"the profile is given twice and differs: {operand.upper()} '{given}' and "
                    f"--profile '{profile_opt}'; give it once (either spelling)")
            kwargs[operand] = given if given is not None else profile_opt
            from orchestrator.cli.rerun import record

            record(profile=kwargs[operand])
            return fn(*args, **kwargs)

        return opt(wrapper)

    return decorate


class _HiddenArgument(click.Argument):
    """An operand kept for old command lines only: absent from usage and help."""

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return []

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        return None


def deprecated_host_operand(command: str) -> Any:
    """The old ``dsv4ctl COMMAND HOST`` spelling: hidden, deprecated, the same as ``--host HOST``
    (a usage error when both are given and differ)."""

    def decorate(fn: Callable[..., Any]) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, old_host: str | None, **kwargs: Any) -> Any:
            if old_host is not None:
                host = kwargs.get("host_name")
                if host is not None and host != old_host:
                    raise click.UsageError(f"the host is given twice and differs: HOST "
                                           f"'{old_host}' and --host '{host}'; give --host once")
                kwargs["host_name"] = old_host
                from orchestrator.cli.output import echo
                from orchestrator.cli.rerun import record

                record(host=old_host)
                # the old spelling quoted (a synopsis, not a command to run); the new one with
                # this run's host, not a placeholder
                echo(f"warning: \"dsv4ctl {command} HOST\" is deprecated; use --host "
                     f"{shlex.quote(old_host)}", err=True)
            return fn(*args, **kwargs)

        return click.argument("old_host", required=False, metavar="HOST",
                              cls=_HiddenArgument)(wrapper)

    return decorate
