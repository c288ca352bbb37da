"""`dsv4ctl history` of one host: its releases, oldest first, as their records tell them.

Owns the rows the CLI prints (status, what restarted, the failed step, qualification figures, the
KV pool measured, the kernels loaded, events) and the one-line renderings of a qualification and
of a pool measurement. A record still ``applying`` with nobody holding the host lock is shown as
what it is: interrupted (the next apply or rollback marks it so on the host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.profile.inventory import Host


@dataclass
class HistoryRow:
    id: str
    created: str
    status: str
    reason: str
    current: bool
    restarted: list[str]
    events: list[str]
    failed_step: str | None
    # {passed, reason, figures} from the qualify step; None when it did not run
    qualification: dict[str, Any] | None = None
    # per role, the KV pool the plan predicted and the engine reported (the measure step)
    pool: list[dict[str, Any]] = field(default_factory=list)
    # per engine process: role, pid and the kernels it loaded when the release was last verified
    # healthy (empty with kernels disabled)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    # per role, the path each hooked op ran in this release (engine | bundled)
    kernel_paths: dict[str, dict[str, str]] = field(default_factory=dict)


def _ms(v: Any) -> str:
    if not isinstance(v, int | float):
        return "-"
    return f"{v * 1000:.1f}" if v < 0.1 else f"{v * 1000:.0f}"


def qualification_line(q: dict[str, Any]) -> str:
    """One line per release for `dsv4ctl history`: the figures a regression shows up in (recall
    length, output tok/s, TTFT/ITL percentiles, chat behaviours); --json has every figure."""
    f = q.get("figures") or {}
    parts = []
    if "recall_full_tokens" in f:
        need = f.get("recall_required_tokens")
        parts.append(f"recall {f['recall_full_tokens']}" + (f"/{need}" if need else "") + " tok")
    if "load_output_tok_s" in f:
        need = f.get("load_required_tok_s")
        parts.append(f"{f['load_output_tok_s']:.1f} tok/s" + (f" (min {need:g})" if need else "")
                     + (f" @c{f['load_concurrency']}" if "load_concurrency" in f else ""))
    if "load_ttft_s_p50" in f or "load_ttft_s_p99" in f:
        parts.append(f"TTFT p50/p99 {_ms(f.get('load_ttft_s_p50'))}/"
                     f"{_ms(f.get('load_ttft_s_p99'))} ms")
    if "load_itl_s_p50" in f:
        parts.append(f"ITL p50 {_ms(f['load_itl_s_p50'])} ms")
    chat = {k[5:]: v for k, v in f.items() if k.startswith("chat_")}
    if chat:
        bad = sorted(k for k, v in chat.items() if v != "pass")
        parts.append("chat ok" if not bad else "chat FAIL " + ",".join(bad))
    line = ("PASS" if q.get("passed") else "FAIL") + (": " + ", ".join(parts) if parts else "")
    if not q.get("passed") and q.get("reason"):
        line += f" -- {q['reason']}"
    return line


def history(host_name: str, host: Host) -> list[HistoryRow]:
    from orchestrator.release.store import ReleaseStore
    from orchestrator.remote.connection import connect
    from orchestrator.remote.lock import is_locked

    with connect(host_name, host) as remote:
        store = ReleaseStore(remote, host.install_root)
        records, current = store.read_records(), store.current()
        locked = is_locked(remote, host.install_root)
    rows = []
    for r in records:
        failed = next((e.step + (f": {e.error}" if e.error else "") for e in r.journal
                       if e.result in ("failed", "interrupted")), None)
        if r.status == "applying" and not locked:
            # no run holds the lock, so none is applying it: its run was lost (the next apply
            # or rollback marks it interrupted on the host)
            r = r.model_copy(update={"status": "interrupted"})
            failed = failed or next((f"{e.step}: its run was lost" for e in r.journal
                                     if e.result == "running"), "its run was lost")
        rows.append(HistoryRow(
            id=r.id, created=r.created, status=r.status, reason=r.reason, current=r.id == current,
            restarted=r.restarted_roles, failed_step=failed,
            events=[event_line(e) for e in sorted(r.events, key=lambda e: e.time)],
            qualification=r.qualification.model_dump(mode="json") if r.qualification else None,
            pool=[m.model_dump(mode="json") for m in r.pool],
            kernels=[k.model_dump(mode="json") for k in r.kernels],
            kernel_paths={role: dict(ops) for role, ops in r.kernel_paths.items()}))
    return rows


def event_line(e: Any) -> str:
    """One event of a release, in words that read the right way round from that release's row
    (``rollback-to r2`` on r1's row read as "r1 rolled back to r2", the opposite of what
    happened)."""
    other = e.other or "?"
    failed = e.result == "failed"
    if e.kind == "rollback-to":
        text = (f"rollback to this release from {other} failed" if failed
                else f"rolled back to this release from {other}")
    elif e.kind == "rolled-back-from":
        text = f"rolled back from this release to {other}"
    else:
        text = f"{e.kind}{' failed' if failed else ''}"
    if e.detail:
        text += f": {e.detail}"
    return f"{e.time} {text}"


def pool_line(m: dict[str, Any]) -> str:
    """One line per role for `dsv4ctl history`: the plan's pool beside the engine's."""
    from orchestrator.calibration import drift

    d = drift(m["measured_tokens"], m["predicted_tokens"])
    line = (f"pool {m['role']}: predicted {m['predicted_tokens']:,}, measured "
            f"{m['measured_tokens']:,} tokens per rank ({d:+.1%}; {m['source']})")
    if m.get("predicted_tokens") != m.get("model_tokens"):
        line += f", model alone {m['model_tokens']:,}"
    return line
