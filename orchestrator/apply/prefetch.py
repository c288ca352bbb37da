"""Preflight's reads of the host, run ahead in the lock's own SSH round trip (issue 20 #10).

Once it holds the host lock, apply's preflight reads the host: a saved plan's re-probe, the
install root's layout (``releases/``, leftovers of interrupted uploads removed), ``current``,
every release record, the current release's manifest, plan and profile, and the state of the
units. One by one that was six or seven round trips of a no-change apply after the lock's own.
Each reader still builds its own command (the store, the service manager, the probes own them);
:class:`Batch` runs the commands preflight will ask for side by side
(:func:`orchestrator.remote.probes.batch_command`) right after the lock is taken, in the same
round trip (``HostLock.acquire(then=...)``), and :class:`Prefetched` answers each of them once
from those results, so every reader keeps its own parsing and error messages. A command that was
not predicted (the host moved since planning: another current release, other units) goes to the
host as before, so the prediction decides the speed, never the result.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

from orchestrator.remote.connection import checked
from orchestrator.remote.probes import CommandResult, batch_command, parse_batch


class Prefetched:
    """A shell that answers the commands run ahead, each once, and passes everything else (and a
    second run of the same command) to the real one."""

    def __init__(self, shell: Any, results: dict[str, CommandResult]) -> None:
        self._shell = shell
        self._results = dict(results)

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        res = self._results.pop(command, None)
        return res if res is not None else self._shell.run(command, timeout=timeout)

    def check(self, command: str, *, timeout: float | None = None, what: str = "") -> str:
        return checked(self.run(command, timeout=timeout), self._shell.name, what)

    def __getattr__(self, name: str) -> Any:  # name, put_bytes, http, ...: the real shell's
        return getattr(self._shell, name)


class Batch:
    """The commands to run ahead, as one script (:attr:`script`, for ``HostLock.acquire(then=)``:
    the lock and the reads in one round trip) and their results from its output."""

    def __init__(self, commands: list[str]) -> None:
        self.commands = commands
        self.token = "@@dsv4-" + secrets.token_hex(8)
        self.script = batch_command(commands, self.token)

    def results(self, stdout: str) -> dict[str, CommandResult]:
        return parse_batch(stdout, self.commands, self.token)


@contextlib.contextmanager
def prefetched(ctx: Any, results: dict[str, CommandResult]) -> Iterator[Prefetched]:
    """While the block runs, ``ctx.store`` and ``ctx.svc`` read through a :class:`Prefetched`
    shell over ``results`` (yielded, for other readers)."""
    shell = Prefetched(ctx.remote, results)
    saved = ctx.store.shell, ctx.svc.remote
    ctx.store.shell = ctx.svc.remote = shell
    try:
        yield shell
    finally:
        ctx.store.shell, ctx.svc.remote = saved
