"""Release records → dsv4ctl's own metrics, and the node-exporter textfile apply writes (issue 6).

Owns two things: :func:`release_metrics`, the pure mapping from the records kept on a host to
:class:`~orchestrator.monitoring.selfmetrics.ReleaseMetrics` (one per *operation*: an apply, with
the automatic rollback that may have followed it, or an explicit ``dsv4ctl rollback`` journaled into
its target's record), and :func:`publish_textfile`, which writes
``<textfile_dir>/dsv4ctl-<deployment>.prom`` on the host atomically after every apply and rollback.

Durations come from the journal's stamps (the record is the single source of truth, so the textfile
can be rebuilt from the host at any time); the health duration is the ``health`` step's (apply) or
``rollback:health`` step's (explicit rollback) wall time, exported under role ``all`` because the
step waits for all roles together and the journal does not time them one by one.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from orchestrator.monitoring.selfmetrics import ReleaseMetrics, Result, textfile_for
from orchestrator.release.record import JournalEntry, ReleaseRecord

ROLLBACK = "rollback:"
HEALTH_ROLE = "all"


def _ts(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def operations(journal: Sequence[JournalEntry]) -> list[list[JournalEntry]]:
    """Split a record's journal into operations. An apply starts at ``preflight``; a
    ``rollback:preflight`` continues the apply before it when that apply failed and has not rolled
    back yet (the automatic rollback), and otherwise starts an explicit rollback of its own."""
    ops: list[list[JournalEntry]] = []
    for e in journal:
        new = not ops or e.step == "preflight"
        if e.step == ROLLBACK + "preflight" and ops:
            cur = ops[-1]
            auto = (not cur[0].step.startswith(ROLLBACK)
                    and not any(x.step.startswith(ROLLBACK) for x in cur)
                    and any(x.result in ("failed", "interrupted") for x in cur))
            new = not auto
        if new:
            ops.append([e])
        else:
            ops[-1].append(e)
    return ops


def _result(op: list[JournalEntry], rec: ReleaseRecord, last_op: bool) -> tuple[Result, int]:
    """(result, rollbacks performed) of one operation."""
    by = {e.step: e for e in op}
    if op[0].step.startswith(ROLLBACK):  # explicit `dsv4ctl rollback` to this release
        ok = by.get(ROLLBACK + "record") is not None and by[ROLLBACK + "record"].result == "ok"
        return ("success" if ok else "rollback_failed"), 1
    if "record" in by and by["record"].result == "ok":
        return "success", 0
    if any(s.startswith(ROLLBACK) for s in by):
        ok = by.get(ROLLBACK + "record") is not None and by[ROLLBACK + "record"].result == "ok"
        return ("rolled_back" if ok else "rollback_failed"), 1
    if last_op and rec.status == "rollback-failed":  # nothing to roll back to: units stopped
        return "rollback_failed", 0
    return "failed", 0


def release_metrics(records: Sequence[ReleaseRecord], current: str | None,
                    deployment: str | None = None) -> list[ReleaseMetrics]:
    """One :class:`ReleaseMetrics` per operation journaled in ``records`` (of ``deployment`` when
    given). Records without a usable journal (unreadable, or never started) are left out."""
    out: list[ReleaseMetrics] = []
    for rec in records:
        if deployment is not None and rec.deployment != deployment:
            continue
        ops = operations(rec.journal)
        for i, op in enumerate(ops):
            last_op = i == len(ops) - 1
            stamps = [t for e in op for t in (_ts(e.start), _ts(e.end)) if t is not None]
            if not stamps:
                continue
            result, rollbacks = _result(op, rec, last_op)
            health_step = ROLLBACK + "health" if op[0].step.startswith(ROLLBACK) else "health"
            health = {}
            for e in op:
                start, end = _ts(e.start), _ts(e.end)
                if (e.step == health_step and e.result in ("ok", "failed", "interrupted")
                        and start is not None and end is not None):  # a not-run step took no time
                    health[HEALTH_ROLE] = max(0.0, end - start)
            qual = rec.qualification if not op[0].step.startswith(ROLLBACK) else None
            out.append(ReleaseMetrics(
                deployment=rec.deployment, release_id=rec.id, profile=rec.profile_name,
                finished_at=max(stamps), apply_duration_s=max(stamps) - min(stamps),
                result=result, health_check_durations_s=health, rollbacks=rollbacks,
                # only the newest operation of the current release is "active": one sample per
                # (deployment, release) label set
                active=last_op and rec.id == current,
                qualify_passed=qual.passed if qual else None,
                qualify_figures=dict(qual.figures) if qual else {},
                pool_tokens={m.role: (m.predicted_tokens, m.measured_tokens)
                             for m in rec.pool}))
    return out


def textfile_path(textfile_dir: str, deployment: str) -> str:
    return f"{textfile_dir.rstrip('/')}/dsv4ctl-{deployment}.prom"


def publish_textfile(remote: Any, store: Any, textfile_dir: str, deployment: str,
                     out: Callable[[str], None]) -> str | None:
    """Write the deployment's textfile on the host (temp file + rename, so the node exporter never
    reads half a file). Never raises: a failure is one warning line through ``out``, because the
    apply or rollback it reports on has already finished one way or the other. Returns the path
    written, or None."""
    path = textfile_path(textfile_dir, deployment)
    try:
        records, current = store.read_records(), store.current()
        text = textfile_for(release_metrics(records, current, deployment))
        remote.check(f"mkdir -p {shlex.quote(textfile_dir)}", timeout=30,
                     what="creating the node-exporter textfile dir")
        remote.replace_bytes(text.encode(), path, mode=0o644)
    except Exception as exc:  # a metrics file must never fail an apply or rollback
        why = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        out(f"warning: could not write dsv4ctl's metrics textfile {path}: {why}")
        return None
    return path
