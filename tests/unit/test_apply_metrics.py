"""Release records -> dsv4ctl's own metrics (orchestrator.apply.metrics), the history line for the
qualification figures, and the record's optional ``qualification`` field (issue 6 item 3/4)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from orchestrator.apply.history import qualification_line
from orchestrator.apply.metrics import operations, publish_textfile, release_metrics, textfile_path
from orchestrator.errors import RemoteError
from orchestrator.monitoring.selfmetrics import textfile_for
from orchestrator.release.record import JournalEntry, Qualification, ReleaseRecord, stamp

T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
APPLY = ("preflight", "upload", "kernels", "stop", "switch", "units", "start", "health", "smoke",
         "qualify", "record")
ROLLBACK = tuple("rollback:" + s for s in ("preflight", "stop", "switch", "units", "start",
                                           "health", "smoke", "record"))


def entries(steps: tuple[str, ...], start: float, *, lengths: dict[str, float] | None = None,
            fail: str | None = None) -> list[JournalEntry]:
    """Journal entries back to back from ``start`` seconds after T0; each step 1 s unless
    ``lengths`` says otherwise; ``fail`` fails that step and marks the rest not-run."""
    out, t, failed = [], start, False
    for s in steps:
        if failed:
            out.append(JournalEntry(step=s, start=stamp(T0 + timedelta(seconds=t)),
                                    end=stamp(T0 + timedelta(seconds=t)), result="not-run"))
            continue
        d = (lengths or {}).get(s, 1.0)
        out.append(JournalEntry(step=s, start=stamp(T0 + timedelta(seconds=t)),
                                end=stamp(T0 + timedelta(seconds=t + d)),
                                result="failed" if s == fail else "ok",
                                error="boom" if s == fail else None))
        t += d
        failed = s == fail
    return out


def record(rid: str, journal: list[JournalEntry], status: str = "healthy",
           **kw: Any) -> ReleaseRecord:
    fields: dict[str, Any] = {"id": rid, "created": "x", "host": "h", "deployment": "dep",
                              "profile_name": "p.yaml", "plan_id": "p", "base_release": None,
                              "status": status, "journal": journal}
    return ReleaseRecord(**{**fields, **kw})


QUAL_OK = Qualification(passed=True, reason="qualified: full recall to 8000 tokens",
                        figures={"recall_full_tokens": 8000, "recall_required_tokens": 8000,
                                 "load_output_tok_s": 812.5, "load_ttft_s_p50": 0.031,
                                 "load_ttft_s_p99": 0.12, "load_itl_s_p50": 0.0042,
                                 "load_concurrency": 2, "chat_reasoning_separated": "pass",
                                 "chat_tool_call_parsed": "pass"})
QUAL_BAD = Qualification(passed=False, reason="load: 40.0 output tok/s at concurrency 2, 500 "
                         "required", figures={"load_output_tok_s": 40.0,
                                              "load_required_tok_s": 500.0,
                                              "chat_tool_call_parsed": "fail"})


def history_records() -> list[ReleaseRecord]:
    # r1: a good apply (health 12 s), later the target of an explicit rollback (health 3 s)
    r1 = record("r1", entries(APPLY, 0, lengths={"health": 12.0})
                + entries(ROLLBACK, 1000, lengths={"rollback:health": 3.0}),
                qualification=QUAL_OK)
    # r2: qualification failed after the switch, rolled back to r1 automatically
    r2 = record("r2", entries(APPLY, 100, lengths={"health": 5.0}, fail="qualify")
                + entries(ROLLBACK, 130), status="rolled-back", qualification=QUAL_BAD)
    # r3: the upload failed (abort): nothing serving changed
    r3 = record("r3", entries(APPLY, 500, fail="upload"), status="failed")
    return [r1, r2, r3]


def test_journal_splits_into_operations() -> None:
    r1, r2, r3 = history_records()
    assert [len(op) for op in operations(r1.journal)] == [len(APPLY), len(ROLLBACK)]
    # the automatic rollback belongs to the failed apply
    assert [len(op) for op in operations(r2.journal)] == [len(APPLY) + len(ROLLBACK)]
    assert [len(op) for op in operations(r3.journal)] == [len(APPLY)]


def test_records_map_to_one_metric_per_operation() -> None:
    ms = release_metrics(history_records(), current="r1")
    by = [(m.release_id, m.result, m.rollbacks, m.active) for m in ms]
    assert by == [("r1", "success", 0, False), ("r1", "success", 1, True),
                  ("r2", "rolled_back", 1, False), ("r3", "failed", 0, False)]
    apply1, rb1, r2, r3 = ms
    # durations from the journal stamps: 10 steps of 1 s + health 12 s
    assert apply1.apply_duration_s == 22.0 and apply1.health_check_durations_s == {"all": 12.0}
    assert apply1.finished_at == (T0 + timedelta(seconds=22)).timestamp()
    assert rb1.apply_duration_s == 10.0 and rb1.health_check_durations_s == {"all": 3.0}
    assert rb1.qualify_passed is None  # an explicit rollback runs no qualification
    assert apply1.qualify_passed is True and apply1.qualify_figures["recall_full_tokens"] == 8000
    # the failed apply's own health check (5 s), not its rollback's, and its qualification
    assert r2.health_check_durations_s == {"all": 5.0} and r2.qualify_passed is False
    assert r2.apply_duration_s == 130 + len(ROLLBACK) - 100
    assert r3.health_check_durations_s == {} and r3.apply_duration_s == 2.0


def test_first_apply_without_rollback_target_is_rollback_failed() -> None:
    rec = record("r1", entries(APPLY, 0, fail="health"), status="rollback-failed")
    (m,) = release_metrics([rec], current=None)
    assert m.result == "rollback_failed" and m.rollbacks == 0 and not m.active
    # the same journal under an abort-style status stays "failed"
    (m,) = release_metrics([rec.model_copy(update={"status": "failed"})], current=None)
    assert m.result == "failed"


def test_textfile_from_records() -> None:
    recs = history_records()
    recs.append(record("x1", entries(APPLY, 0), deployment="other"))
    text = textfile_for(release_metrics(recs, current="r1", deployment="dep"))
    s = {(x.name, tuple(sorted(x.labels.items()))): x.value
         for fam in text_string_to_metric_families(text) for x in fam.samples}
    dep = (("deployment", "dep"),)
    # the newest operation is the explicit rollback to r1 (finished at 1010 s)
    assert s[("dsv4ctl_release_info", (("deployment", "dep"), ("profile", "p.yaml"),
                                       ("release", "r1"), ("result", "success")))] == 1
    assert s[("dsv4ctl_active_release_info", (("deployment", "dep"), ("profile", "p.yaml"),
                                              ("release", "r1")))] == 1
    assert s[("dsv4ctl_last_apply_success", dep)] == 1
    assert s[("dsv4ctl_last_apply_duration_seconds", dep)] == 10.0
    assert s[("dsv4ctl_last_health_check_duration_seconds", (*dep, ("role", "all")))] == 3.0
    assert ("dsv4ctl_last_qualify_passed", dep) not in s  # the rollback ran no qualification
    assert s[("dsv4ctl_applies_total", (*dep, ("result", "success")))] == 2
    assert s[("dsv4ctl_applies_total", (*dep, ("result", "failed")))] == 1
    assert s[("dsv4ctl_applies_total", (*dep, ("result", "rolled_back")))] == 1
    assert s[("dsv4ctl_rollbacks_total", dep)] == 2
    assert not any(dict(k[1]).get("deployment") == "other" for k in s)
    # an unreadable record (no journal) is left out rather than invented
    empty = record("r9", [], status="failed")
    assert release_metrics([empty], current=None) == []


def test_old_records_without_qualification_still_load() -> None:
    doc = json.loads(history_records()[2].to_json())
    del doc["qualification"]
    rec = ReleaseRecord.model_validate_json(json.dumps(doc))
    assert rec.qualification is None
    again = ReleaseRecord.model_validate_json(history_records()[0].to_json())
    assert again.qualification == QUAL_OK
    assert isinstance(again.qualification.figures["recall_full_tokens"], int)


def test_qualification_line_shows_the_figures_and_why() -> None:
    ok = qualification_line(QUAL_OK.model_dump(mode="json"))
    assert ok == ("PASS: recall 8000/8000 tok, 812.5 tok/s @c2, TTFT p50/p99 31.0/120 ms, "
                  "ITL p50 4.2 ms, chat ok")
    bad = qualification_line(QUAL_BAD.model_dump(mode="json"))
    assert bad.startswith("FAIL: 40.0 tok/s (min 500), chat FAIL tool_call_parsed -- load: 40.0")
    assert qualification_line({"passed": False, "reason": "could not run", "figures": {}}) == \
        "FAIL -- could not run"


class _Store:
    def __init__(self, records: list[ReleaseRecord], fail: bool = False) -> None:
        self.records, self.fail = records, fail

    def read_records(self) -> list[ReleaseRecord]:
        if self.fail:
            raise RemoteError("connection to host 'h' lost")
        return self.records

    def current(self) -> str | None:
        return "r1"


class _Remote:
    def __init__(self) -> None:
        self.commands: list[str] = []
        self.files: dict[str, bytes] = {}

    def check(self, command: str, **kw: Any) -> str:
        self.commands.append(command)
        return ""

    def replace_bytes(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        self.files[path] = data


def test_publish_writes_atomically_and_only_warns_on_failure() -> None:
    remote, lines = _Remote(), []
    path = publish_textfile(remote, _Store(history_records()), "/var/lib/ne/", "dep", lines.append)
    assert path == textfile_path("/var/lib/ne", "dep") == "/var/lib/ne/dsv4ctl-dep.prom"
    assert b'dsv4ctl_active_release_info{deployment="dep",profile="p.yaml",release="r1"} 1.0' \
        in remote.files[path] and lines == []
    assert remote.commands == ["mkdir -p /var/lib/ne/"]
    remote2, lines2 = _Remote(), []
    assert publish_textfile(remote2, _Store([], fail=True), "/d", "dep", lines2.append) is None
    assert remote2.files == {}
    assert lines2 == ["warning: could not write dsv4ctl's metrics textfile /d/dsv4ctl-dep.prom: "
                      "connection to host 'h' lost"]
