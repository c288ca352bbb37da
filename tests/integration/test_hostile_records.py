"""Hostile release records on a harness host (issue 31, Deliver 1; the parsers' unit and property
tests are tests/unit/test_hostile_host_data.py).

Before: a record's ``host:`` field with an absolute or ``../`` path made the controller create
directories, write files, read a controller file, upload it and delete it (the local copy of a
record the host could not take is kept under ``$XDG_STATE_HOME/dsv4ctl/records/<host>/``, and the
host name came from the record); a record id that is not a release id crashed ``history`` and
``rollback``. Now every record read back is checked against its grammar, the controller builds
its paths from its own names, and a hostile record reads as unreadable.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_apply import ROOT, Env, env  # noqa: F401  (env is a fixture)

pytestmark = pytest.mark.integration

RID = "r0001-20261201T120000Z-0123abcd"
RID2 = "r0002-20261201T120000Z-0123abcd"


def _plant(e: Env, rid: str, doc: dict) -> None:
    import shlex

    e.fake.exec(f"mkdir -p {ROOT}/releases/{rid} && printf '%s' {shlex.quote(json.dumps(doc))} "
                f"> {ROOT}/releases/{rid}/record.json", check=True)


def test_hostile_records_change_nothing_outside_the_state_directory(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.json").write_text("mine")
    escape = "../" * 12 + str(outside).lstrip("/")
    base = {"created": "2026-12-01T12:00:00Z", "deployment": "itest", "profile_name": "itest",
            "plan_id": "p", "base_release": None, "status": "applying"}
    _plant(env, RID, {**base, "id": RID, "host": escape})  # an "applying" record: reconciled
    _plant(env, RID2, {**base, "id": "../../victim", "host": "h"})
    capsys.readouterr()
    assert env.cli("history", "--host", "h") == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert RID in out and RID2 in out
    # apply reconciles the "applying" records under the lock: with the hostile host it used to
    # read and write $XDG_STATE_HOME/dsv4ctl/records/<host>/ wherever <host> pointed
    assert env.apply(env.profile()) == 0, capsys.readouterr()
    assert sorted(p.name for p in outside.iterdir()) == ["victim.json"]
    assert (outside / "victim.json").read_text() == "mine"
    stray = [p for p in tmp_path.rglob("*") if p.is_file()
             and not p.is_relative_to(state) and p.parent != outside
             and p.suffix in (".json",) and "r000" in p.name]
    assert not stray, stray
