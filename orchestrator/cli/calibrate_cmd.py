"""``dsv4ctl calibrate``: feed a host's real KV pool to the planner by hand, or forget it.

A thin adapter over :mod:`orchestrator.apply.measure` (issue 22). ``apply`` measures by itself
after every start; this command is for a host whose engine was started without dsv4ctl, and for
resetting the calibration.
"""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import accept_new_host_key_opt, resolve_host, say
from orchestrator.cli.options import (
    deprecated_host_operand,
    host_option,
    inventory_option,
    profile_option,
    verbose_option,
)
from orchestrator.errors import DsvError


@click.command()
@deprecated_host_operand("calibrate")
@host_option()
@click.option("--from-log", "log_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="An SGLang 0.5.23 engine log with the scheduler's startup line "
              "('max_total_num_tokens=..., available_gpu_mem=... GB'); the last one counts.")
@click.option("--role", type=click.Choice(["engine", "prefill", "decode"]), default=None,
              help="The role that wrote the log (needed when the profile has two).")
@profile_option()
@inventory_option()
@click.option("--reset", is_flag=True,
              help="Remove the host's calibration (<install_root>/calibration.json): plans then "
                   "use the model alone until the next apply measures again.")
@accept_new_host_key_opt
@verbose_option()
def calibrate(host_name: str | None, log_file: Path | None, role: str | None,
              profile_path: Path | None, inventory: Path | None, reset: bool) -> int:
    """Store what a host's engine really allocated, so `plan --live` predicts from it.

    \b
    The host is --host NAME (default: the profile's host, the profile being the one the engine
    ran). The measurement (the scheduler's startup line: max_total_num_tokens per rank) is kept on
    the host in <install_root>/calibration.json beside the model's prediction for the profile's
    configuration; `plan --live` reads it as a fact and shows the difference as a per-host,
    per-engine-version calibration term. `apply` records one after every start.
    """
    from datetime import UTC, datetime

    from orchestrator.apply import measure
    from orchestrator.profile.loader import read_file
    from orchestrator.release.record import stamp

    if reset:
        if log_file is not None:
            raise DsvError("--reset and --from-log together", fix="pass one of them")
        name, host = resolve_host(profile_path, inventory, host_name)
        removed = measure.reset(name, host)
        say(f"host {name}: calibration " + ("removed; plans use the model alone" if removed
                                              else "was not set; nothing to remove"))
        return 0
    if log_file is None:
        raise DsvError("nothing to do", fix="pass --from-log FILE or --reset")
    _, line = measure.calibrate_from_log(
        profile_path, inventory, host_name, read_file(log_file), where=str(log_file), role=role,
        now=stamp(datetime.now(UTC)))
    say(line)
    return 0


def register(group: click.Group) -> None:
    group.add_command(calibrate)
