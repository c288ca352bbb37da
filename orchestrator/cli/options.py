"""Options and output plumbing shared by every dsv4ctl command: verbosity (where library logs go).

One place so a flag is spelled and behaves the same on every command.
"""

from __future__ import annotations

import logging
import sys
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


def verbose_option(help_text: str = "Show what libraries log (SSH handshakes) on stderr.") -> Any:
    """``-v/--verbose`` for the commands that touch a host: routes library logs to stderr."""

    def _set(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        route_library_logs(bool(value))
        return bool(value)

    return click.option("-v", "--verbose", is_flag=True, callback=_set, expose_value=False,
                        help=help_text)


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

