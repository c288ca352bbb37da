"""history's events read the right way round and in time order (the symptom: rollback events
read backwards: r1's row said `rollback-to r2` after a rollback from r2 to r1)."""

from __future__ import annotations

from orchestrator.apply.history import event_line
from orchestrator.release.record import Event


def test_rollback_events_say_which_way_the_rollback_went() -> None:
    to = Event(time="2026-12-02T06:00:00Z", kind="rollback-to", other="r0002")
    back = Event(time="2026-12-02T06:00:00Z", kind="rolled-back-from", other="r0001")
    assert event_line(to) == "2026-12-02T06:00:00Z rolled back to this release from r0002"
    assert event_line(back) == "2026-12-02T06:00:00Z rolled back from this release to r0001"
    bad = Event(time="t", kind="rollback-to", other="r0002", result="failed", detail="health")
    assert event_line(bad) == "t rollback to this release from r0002 failed: health"
