"""The ``measure`` step of apply, and ``dsv4ctl calibrate``: what the engine really allocated.

Owns the host side of calibration (issue 22): after a healthy start, read each role's KV pool from
the engine itself (``/server_info``'s ``max_total_num_tokens``, and the scheduler's startup line in
the role's log for ``available_gpu_mem``), store it with the release record (predicted and measured
side by side, for ``history`` and the metrics) and in the host's ``calibration.json``, which
``plan --live`` reads back as a fact (``remote.probes.probe_calibration``). The pure parts live in
:mod:`orchestrator.calibration`.

A measurement that cannot be taken never fails an apply: the engine serves, so the step records
why it has no number and moves on.
"""

from __future__ import annotations

import shlex
from typing import Any

from orchestrator import calibration as C
from orchestrator.calibration import last_scheduler_line
from orchestrator.facts import PoolMeasurement
from orchestrator.planner_model import Plan, RoleCapacity
from orchestrator.release.record import stamp
from orchestrator.remote.hostfs import remove_if_present


def calibration_path(install_root: str) -> str:
    return f"{install_root.rstrip('/')}/{C.CALIBRATION_FILE}"


def read_host_calibration(shell: Any, install_root: str) -> list[PoolMeasurement]:
    from orchestrator.remote.probes import probe_calibration

    return probe_calibration(shell, install_root)


def write_host_calibration(remote: Any, install_root: str,
                           measurements: list[PoolMeasurement]) -> None:
    """Merge ``measurements`` into the host's calibration.json (atomic replace)."""
    merged = C.merge(read_host_calibration(remote, install_root), measurements)
    remote.replace_bytes(C.render_file(merged).encode(), calibration_path(install_root))


def reset_host_calibration(remote: Any, install_root: str) -> bool:
    """Remove the host's calibration.json; True when there was one."""
    return remove_if_present(remote, calibration_path(install_root))


def measurement(cap: RoleCapacity, plan: Plan, *, measured_tokens: int,
                engine_version: str | None, source: str, release: str | None, measured_at: str,
                available_gpu_mem_gib: float | None = None) -> PoolMeasurement:
    dep = plan.deployment
    return PoolMeasurement(
        role=cap.role, engine_version=engine_version or dep.engine_version,
        model_variant=dep.model_variant, measured_tokens=measured_tokens,
        model_tokens=cap.model_tokens_per_rank or cap.max_total_tokens_per_rank,
        predicted_tokens=cap.max_total_tokens_per_rank, bytes_per_token=cap.bytes_per_token,
        mem_fraction_static=cap.mem_fraction_static, available_gpu_mem_gib=available_gpu_mem_gib,
        source=source, release=release, measured_at=measured_at)


def measure_roles(remote: Any, install_root: str, plan: Plan, release: str | None,
                  measured_at: str) -> tuple[list[PoolMeasurement], list[str]]:
    """One measurement per sized role, and a note for each role that could not be measured."""
    out: list[PoolMeasurement] = []
    notes: list[str] = []
    caps = {c.role: c for c in plan.capacity if c.max_total_tokens_per_rank}
    for role in plan.deployment.roles:
        cap = caps.get(role.name)
        if cap is None:
            continue
        try:
            resp = remote.http("GET", role.port, "/server_info", timeout=10,
                               address=role.listen)
            info = resp.json() if resp.status == 200 else None
        except (OSError, ValueError) as exc:
            notes.append(f"{role.name}: /server_info unreadable ({exc})")
            continue
        tokens, version = C.server_info_pool(info)
        line = None
        log = shlex.quote(f"{install_root.rstrip('/')}/logs/{role.name}.log")
        res = remote.run(f"grep -a 'max_total_num_tokens=' {log} 2>/dev/null | tail -n 1",
                         timeout=30)
        lines = C.parse_scheduler_lines(res.stdout) if res.ok else []
        if lines:
            line = lines[-1]
        if tokens is None and line is not None:
            tokens = line.max_total_num_tokens
        if tokens is None:
            notes.append(f"{role.name}: neither /server_info nor the log reports "
                         "max_total_num_tokens")
            continue
        source = "server_info" + (" + log" if line is not None else "")
        out.append(measurement(
            cap, plan, measured_tokens=tokens, engine_version=version, source=source,
            release=release, measured_at=measured_at,
            available_gpu_mem_gib=line.available_gpu_mem_gib if line else None))
    return out, notes


def summary(m: PoolMeasurement) -> str:
    d = C.drift(m.measured_tokens, m.predicted_tokens)
    return (f"{m.role}: predicted {m.predicted_tokens:,}, measured {m.measured_tokens:,} "
            f"tokens per rank ({d:+.1%})")


def measure_pool(ctx: Any, step: Any) -> Any:
    """Apply step: measure every role's pool; record it; update the host's calibration."""
    from orchestrator.apply.context import Outcome

    if ctx.plan is None or ctx.record is None:
        return Outcome(detail="no plan to compare with")
    try:
        found, notes = measure_roles(ctx.remote, ctx.host.install_root, ctx.plan, ctx.record.id,
                                     stamp(ctx.now()))
        ctx.record.pool = found
        if found:
            write_host_calibration(ctx.remote, ctx.host.install_root, found)
    except Exception as exc:
        return Outcome(detail=f"not measured: {exc}")
    parts = [summary(m) for m in found] + notes
    return Outcome(detail="; ".join(parts) or "no role to measure")


def calibrate_from_log(profile_path: Any, inventory: Any, host_name: str, log_text: str, *,
                       where: str, role: str | None, now: str) -> tuple[PoolMeasurement, str]:
    """``dsv4ctl calibrate --host HOST --from-log FILE``: a measurement from an engine's log, fed by hand
    for a host set up without dsv4ctl. The profile says which configuration the engine ran (the
    model's prediction for it is stored beside the measurement); the result is merged into the
    host's calibration.json. Returns the measurement and a line saying what it did."""
    from orchestrator.errors import DsvError
    from orchestrator.planner.build import build_plan, load_context
    from orchestrator.remote import gather_facts
    from orchestrator.remote.connection import connect

    line = last_scheduler_line(log_text, where=where)
    ctx = load_context(profile_path, inventory, host_override=host_name)
    facts = gather_facts(ctx.host_name, ctx.host, model_paths=[ctx.profile.model.path])
    # the model alone: a measurement is compared with the uncalibrated prediction
    plan = build_plan(ctx, facts.model_copy(update={"calibration": []}))
    sized = {c.role: c for c in plan.capacity if c.max_total_tokens_per_rank}
    names = [r.name for r in plan.deployment.roles if r.name in sized]
    if role is None:
        if len(names) != 1:
            raise DsvError(f"the profile has roles {', '.join(names) or 'none sized'}; which one "
                           "wrote this log?", fix="pass --role " + " or --role ".join(names))
        role = names[0]
    if role not in sized:
        raise DsvError(f"--role {role!r}: the profile has no sized role of that name "
                       f"(it has {', '.join(names) or 'none'})",
                       fix="pass one of: " + ", ".join(names))
    m = measurement(sized[role], plan, measured_tokens=line.max_total_num_tokens,
                    engine_version=None, source=f"log {where}", release=None, measured_at=now,
                    available_gpu_mem_gib=line.available_gpu_mem_gib)
    with connect(ctx.host_name, ctx.host) as remote:
        write_host_calibration(remote, ctx.host.install_root, [m])
    d = C.drift(m.measured_tokens, m.model_tokens)
    return m, (f"host {ctx.host_name}, role {role}: measured {m.measured_tokens:,} tokens per rank "
               f"(available_gpu_mem {line.available_gpu_mem_gib:.2f} GB), the model predicts "
               f"{m.model_tokens:,} ({d:+.1%}); `dsv4ctl plan --host {ctx.host_name} --live` now "
               f"calibrates with {m.unexplained_bytes / 2**30:+.2f} GiB per rank")


def reset(host_name: str, host: Any) -> bool:
    from orchestrator.remote.connection import connect

    with connect(host_name, host) as remote:
        return reset_host_calibration(remote, host.install_root)
