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
