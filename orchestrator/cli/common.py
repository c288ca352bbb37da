"""What the host-changing commands share: progress lines, the command line a run records, the
confirmation rule, the ``--accept-new-host-key`` opt-in, finding a named host, and printing one
host's result with the exit code it maps to.

One module so no command module imports another's private helpers (the layering test refuses a
file-to-file import cycle). fabric is imported only inside the functions that reach a host.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.output import echo
from orchestrator.errors import DsvError


def say(line: str) -> None:
    """One progress line on stdout, flushed at once (a run's lines interleave with prompts)."""
    echo(line)
    sys.stdout.flush()


def command_line(*extra: str) -> str:
    """The command as typed (the words the CLI was given, shell-quoted: copied, it runs), for
    lock holders, records and the command that repeats this run; ``extra`` words appended."""
    import shlex

    from orchestrator.cli.rerun import ARGV

    words = ARGV.get()
    return shlex.join(["dsv4ctl", *(words if words is not None else sys.argv[1:]), *extra])


def is_plan_file(path: Path) -> bool:
    """Whether SOURCE is a saved plan (JSON) rather than a profile (YAML)."""
    if path.suffix == ".json":
        return True
    try:
        with path.open("rb") as fh:
            return fh.read(64).lstrip().startswith(b"{")
    except OSError:
        return False


def require_terminal(what: str) -> None:
    """Refuse when nobody is at a terminal to answer (Terraform's rule for apply without
    -auto-approve): a script or a pipe must say --yes on purpose."""
    if not sys.stdin.isatty():
        raise DsvError(f"{what} needs confirmation and stdin is not a terminal; nothing was changed",
                       fix=f"run it from a terminal to answer the prompt, or pass --yes in "
                           f"scripts (`{command_line('--yes')}`)")


def confirm(what: str, question: str) -> None:
    """Ask before changing a host; with nobody at a terminal to ask, refuse."""
    from orchestrator.cli.output import FORMAT

    require_terminal(what)
    if not click.confirm(question, default=False, err=FORMAT.get() == "json"):
        raise DsvError(f"{what} cancelled at the prompt; nothing was changed",
                       fix="answer y, or pass --yes in scripts")


def accept_new_host_key_opt(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--accept-new-host-key``: the explicit opt-in to trust a host seen for the first time
    (OpenSSH's accept-new). Without it an unknown host key is refused."""

    @functools.wraps(fn)
    def wrapper(*args: Any, accept_new_host_key: bool, **kwargs: Any) -> Any:
        if not accept_new_host_key:
            return fn(*args, **kwargs)
        import logging

        from orchestrator.remote.connection import accept_new_host_keys, log

        echo("--accept-new-host-key: a host key never seen before will be accepted and "
             "recorded (a changed key is still refused)", err=True)
        # each key accepted is said on stderr, whatever else configures logging
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        log.addHandler(handler)
        try:
            with accept_new_host_keys():
                return fn(*args, **kwargs)
        finally:
            log.removeHandler(handler)

    return click.option(
        "--accept-new-host-key", is_flag=True,
        help="Accept the SSH key of a host seen for the first time, log it and record it in the "
             "host's known_hosts (else ~/.ssh/known_hosts), like OpenSSH's accept-new. Default: "
             "unknown keys are refused; a changed key is always refused.")(wrapper)


def resolve_host(profile_path: Path | None, inventory: Path | None, host_name: str | None
                 ) -> tuple[str, Any]:
    """(host name, Host) from --host / the profile's host (default: the bundled profile's), found
    the way `plan` finds it (orchestrator.planner.build: the inventory beside the profile, then
    ./inventory.yaml)."""
    from orchestrator.planner.build import inventory_path_for, load_context, lookup_host
    from orchestrator.profile import load_inventory

    if host_name is None:  # the profile's host; no profile: the bundled one's, as `apply` does
        from orchestrator.paths import default_profile

        ctx = load_context(profile_path or default_profile(), inventory)
        return ctx.host_name, ctx.host
    inv_path = inventory_path_for(profile_path, inventory)
    return lookup_host(host_name, load_inventory(inv_path) if inv_path else None, inv_path)


def print_result(res: Any, what: str = "Apply") -> None:
    """One host's result (:class:`orchestrator.apply.executor.Result`): its message, what was
    done and not, where its journal is and how to recover; raises the error its status maps to
    (the CLI boundary turns it into the documented exit code)."""
    from orchestrator.apply.executor import raise_for

    if res.status in ("healthy", "no-changes"):
        say(res.message)
        return
    say("")
    say(f"{what} {res.status.upper()}: {res.message}")
    if res.done:
        say("Done:")
        for d in res.done:
            say(f"  ✓ {d}")
    if res.not_done:
        say("Not done:")
        for d in res.not_done:
            say(f"  ✗ {d}")
    if res.release:
        say(f"The journal is in releases/{res.release}/record.json on the host.")
    if res.recovery:
        say(f"To recover: {res.recovery}")
    raise_for(res)
