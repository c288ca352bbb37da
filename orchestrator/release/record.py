"""The release record: what an apply (or rollback) did to a host, step by step, as it happened.

``<root>/releases/<id>/record.json`` is rewritten (atomically) after every step, so whatever kills
dsv4ctl, the host keeps an honest account: which steps finished, which failed and why, which never
ran. Terraform users asked for exactly this after partial failures (terraform#17681, #20718).
The record is data only; :mod:`orchestrator.release.store` reads and writes it on the host.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import DsvError
from orchestrator.facts import PoolMeasurement
from orchestrator.host_data import HostDataError, bounded_json, release_id, slug
from orchestrator.planner_model import Plan
from orchestrator.release_ids import is_release_id

RECORD_FORMAT = 1

StepResult = Literal["running", "ok", "failed", "skipped", "interrupted", "not-run"]
Status = Literal[
    "applying",  # in progress (or dsv4ctl died without a chance to record more)
    "healthy",  # passed health checks; a rollback target
    "failed",  # failed before anything serving changed; the previous release kept serving
    "rolled-back",  # failed after the switch; the previous healthy release was restored
    "rollback-failed",  # failed, and restoring the previous release failed too
    "interrupted",  # Ctrl-C, or the run was lost (killed, host unreachable): see the journal
    "unhealthy",  # was healthy, but a later restore of it failed its checks (see its events)
]


def utcnow() -> datetime:
    return datetime.now(UTC)


def stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


class JournalEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: str
    start: str
    end: str | None = None
    result: StepResult = "running"
    error: str | None = None
    detail: str | None = None


class Event(BaseModel):
    """Something that happened to a release after its apply: rolled back to / from, superseded."""

    model_config = ConfigDict(extra="forbid")

    time: str
    kind: Literal["rollback-to", "rolled-back-from", "health", "reconciled"]
    other: str | None = None  # the other release involved
    result: Literal["ok", "failed"] = "ok"
    detail: str | None = None


class Qualification(BaseModel):
    """The outcome of the ``qualify`` step (issue 6): kept structured so ``dsv4ctl history`` and the
    node-exporter textfile can show the figures per release (a regression is visible at a glance)."""

    model_config = ConfigDict(extra="forbid")

    passed: bool
    reason: str = ""
    # recall_full_tokens, load_output_tok_s, load_ttft_s_p50, chat_<check> ("pass"/"fail"), ...
    figures: dict[str, float | int | str] = Field(default_factory=dict)


class KernelsSeen(BaseModel):
    """The kernels one engine process loaded, read from its log when the release was verified
    healthy (issue 20): ``release <id>, sha256 <12 hex>``, a path outside the releases, or
    "none loaded (...)"; :mod:`orchestrator.apply.kernels_seen` reads it."""

    model_config = ConfigDict(extra="forbid")

    role: str
    pid: int
    loaded: str


class ReleaseRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = RECORD_FORMAT
    id: str
    created: str
    host: str
    deployment: str
    profile_name: str
    plan_id: str
    base_release: str | None  # what was current when the apply started
    status: Status = "applying"
    reason: str = "apply"
    restarted_roles: list[str] = Field(default_factory=list)
    rollback_target: str | None = None
    journal: list[JournalEntry] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    user: str | None = None
    controller: str | None = None
    # set by the qualify step, passed or not; absent when it did not run (and in older records)
    qualification: Qualification | None = None
    # set by the measure step (issue 22): per role, the KV pool the plan predicted and the one the
    # engine reported after its start; empty when it did not run (and in older records)
    pool: list[PoolMeasurement] = Field(default_factory=list)
    # per engine process, the kernels it loaded when this release was last verified healthy (its
    # apply's record step, or a rollback or restore to it); empty when kernels are disabled (and
    # in older records)
    kernels: list[KernelsSeen] = Field(default_factory=list)
    # per role, the path each hooked op runs in this release (engine | bundled), as its plan
    # decided (orchestrator/kernel_paths.py); empty in older records
    kernel_paths: dict[str, dict[str, Literal["engine", "bundled"]]] = Field(default_factory=dict)

    def begin(self, step: str, now: datetime) -> JournalEntry:
        entry = JournalEntry(step=step, start=stamp(now))
        self.journal.append(entry)
        return entry

    @staticmethod
    def finish(entry: JournalEntry, result: StepResult, now: datetime, *, error: str | None = None,
               detail: str | None = None) -> None:
        entry.end = stamp(now)
        entry.result = result
        entry.error = error
        if detail is not None:
            entry.detail = detail

    @classmethod
    def from_host(cls, text: str | bytes, what: str) -> ReleaseRecord:
        """A record read back from a host (or the controller's state directory): bounded JSON,
        then this model; :class:`HostDataError` naming ``what`` otherwise."""
        data = bounded_json(text, what)
        fix = ("it was changed outside dsv4ctl (or is damaged); inspect it on the host, move it "
               "aside and re-run")
        try:
            rec = cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top)"
            raise HostDataError(f"{what} is not a valid dsv4ctl record: {where}: {first['msg']}",
                                fix=fix) from None
        # ids and names in their grammar (issue 31): a hostile record named '../../x' as its
        # host or id, and the controller built paths from it
        named = [("id", rec.id, release_id), ("host", rec.host, slug),
                 ("base_release", rec.base_release, release_id),
                 ("rollback_target", rec.rollback_target, release_id),
                 *((f"events.{i}.other", e.other, release_id) for i, e in enumerate(rec.events))]
        for where, value, grammar in named:
            if value is None:
                continue
            try:
                grammar(value)
            except ValueError as exc:
                raise HostDataError(f"{what} is not a valid dsv4ctl record: {where}: {exc}",
                                    fix=fix) from None
        return rec

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    def steps(self, result: StepResult) -> list[str]:
        return [e.step for e in self.journal if e.result == result]


def plan_id(plan: Plan) -> str:
    """Content hash of a plan: identifies "this exact plan" in records (already-applied check)."""
    blob = json.dumps(plan.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def last_healthy(records: Iterable[ReleaseRecord], *, exclude: Iterable[str] = (),
                 before: str | None = None) -> str | None:
    """The newest release that passed its health checks (by sequence), excluding ``exclude``
    and, with ``before``, only releases older than that one."""
    from orchestrator.release_ids import sequence

    skip = set(exclude)
    limit = sequence(before) if before else None
    ok = [r.id for r in records if r.status == "healthy" and r.id not in skip
          and (limit is None or sequence(r.id) < limit)]
    return max(ok, key=sequence) if ok else None


def rollback_target(records: list[ReleaseRecord], current: str | None, *,
                    failed: str | None = None) -> str | None:
    """The one rule for which release a rollback restores.

    After a failed apply (``failed``: the release that failed; ``current``: the one serving when
    the apply began): that one if it was healthy, else the newest healthy release, never the
    failed one. ``dsv4ctl rollback`` without a release (``failed`` None): the newest healthy
    release before ``current``.
    """
    if failed is None:
        return last_healthy(records, exclude=[current] if current else [], before=current)
    by_id = {r.id: r for r in records}
    if current and current != failed and by_id.get(current) and by_id[current].status == "healthy":
        return current
    return last_healthy(records, exclude=[failed])


def chosen_rollback_target(records: list[ReleaseRecord], current: str | None,
                           release: str | None, host_name: str) -> str:
    """The release ``dsv4ctl rollback [RELEASE]`` restores on ``host_name``: RELEASE when it is one
    of the host's releases, else (none given) :func:`rollback_target`'s pick. The one owner of
    that choice and of its refusals, so the transition shown before the prompt is the one run."""
    if release is None:
        target = rollback_target(records, current)
        if target is None:
            raise DsvError(f"no healthy release before {current or 'none'} on host "
                           f"'{host_name}'", fix=f"see `dsv4ctl history --host {host_name}`")
        return target
    if not is_release_id(release) or release not in {r.id for r in records}:
        raise DsvError(f"release {release!r} does not exist on host '{host_name}'",
                       fix=f"pick one from `dsv4ctl history --host {host_name}`")
    return release
