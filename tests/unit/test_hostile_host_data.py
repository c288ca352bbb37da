"""Issue 31, Deliver 1: what comes back from a host is parsed by one bounded, typed reader per
format (orchestrator/host_data.py), and a hostile document is a clean error or a valid value.

Before: a record's ``host: ../../x`` made the controller build, write, read and delete paths
outside its state directory; a record id that is not a release id crashed ``history``;
``Infinity``, ``NaN`` and ``10**5000`` in ``calibration.json`` or a model index were tracebacks;
a hostile router worker list or fleet journal crashed ``status``/``history``. The unit tests go
through the entry points the commands call; the property tests feed every reader random and
hostile documents.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.calibration import parse_file
from orchestrator.errors import DsvError
from orchestrator.host_data import (
    bounded_json,
    fleet_journal,
    manifest_files,
    relative_name,
)
from orchestrator.release.record import ReleaseRecord
from orchestrator.release.store import ReleaseStore
from orchestrator.remote.probes import parse_index_total_size
from orchestrator.remote.router_api import RouterApi, RouterWorker, engine_inflight
from tests.unit.test_release import LocalShell

RID = "r0001-20261129T101500Z-00000000"
SHA = "a" * 64


def _record(**over: Any) -> dict[str, Any]:
    doc = {"id": RID, "created": "2026-11-29T10:15:00Z", "host": "gpu-host",
           "deployment": "default", "profile_name": "default", "plan_id": "p",
           "base_release": None, "status": "applying"}
    return {**doc, **over}


# ----------------------------------------------------------------------------- records ---

@pytest.mark.parametrize("host", ["../../etc", "/etc", "a/../../b", "..", "x\u200b", "A"])
def test_a_record_naming_a_path_as_its_host_is_refused(host: str) -> None:
    with pytest.raises(DsvError, match="host"):
        ReleaseRecord.from_host(json.dumps(_record(host=host)), "record.json")


@pytest.mark.parametrize(("field", "value"), [
    ("id", "../r0001"), ("id", "x"), ("base_release", "/etc/passwd"),
    ("rollback_target", "r1"),
])
def test_record_ids_are_matched_against_the_release_id_grammar(field: str, value: str) -> None:
    with pytest.raises(DsvError, match=field):
        ReleaseRecord.from_host(json.dumps(_record(**{field: value})), "record.json")


def test_a_hostile_record_on_the_host_reads_as_unreadable_not_as_a_path(tmp_path: Path) -> None:
    """The store (what history, rollback and apply's reconcile read) shows the release with an
    unreadable record; the hostile host and a record naming another release never come through."""
    root = tmp_path / "root"
    for rid, doc in [(RID, _record(host="../../../tmp/x")),
                     ("r0002-20261129T101500Z-00000000", _record()),  # names r0001: not its own
                     ("r0003-20261129T101500Z-00000000", "[" * 100_000)]:
        d = root / "releases" / rid
        d.mkdir(parents=True)
        (d / "record.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    records = ReleaseStore(LocalShell(), str(root)).read_records()
    assert [r.id for r in records] == [RID, "r0002-20261129T101500Z-00000000",
                                       "r0003-20261129T101500Z-00000000"]
    assert all(r.reason == "record missing or unreadable" and r.host == "local" for r in records)


def test_the_local_record_path_takes_only_a_host_name_and_a_release_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.apply.preflight import local_record_path

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert local_record_path("gpu-host", RID) == \
        tmp_path / "state" / "dsv4ctl" / "records" / "gpu-host" / f"{RID}.json"
    for host, rid in [("../../x", RID), ("/etc", RID), ("gpu-host", "../../x"),
                      ("gpu-host", "/etc/passwd")]:
        with pytest.raises(DsvError):
            local_record_path(host, rid)


# ---------------------------------------------------------------- numbers and documents ---

@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e999", "1" + "0" * 5000,
                                    "1" + "0" * 300, "-5"])
def test_calibration_with_a_non_finite_or_huge_number_is_a_clean_error(number: str) -> None:
    doc = ('{"format": 1, "measurements": [{"role": "decode", "engine_version": "0.5.23", '
           '"model_variant": "v", "measured_tokens": %s, "model_tokens": 1, '
           '"predicted_tokens": 1, "bytes_per_token": 7087.0, "source": "log", '
           '"measured_at": "t"}]}').replace("%s", number)
    with pytest.raises(DsvError) as exc:
        parse_file(doc, where="/srv/dsv4/calibration.json")
    assert "/srv/dsv4/calibration.json" in exc.value.render()


@pytest.mark.parametrize("size", ["Infinity", "NaN", "1e999", "1" + "0" * 5000, "-5",
                                  "10000000000000000000000"])
def test_a_model_index_with_a_non_finite_or_huge_size_is_a_clean_error(size: str) -> None:
    with pytest.raises(DsvError):
        parse_index_total_size(f'{{"metadata": {{"total_size": {size}}}, "weight_map": {{}}}}')
    with pytest.raises(DsvError):  # the truncated-file fallback too
        parse_index_total_size(f'{{"metadata": {{"total_size": {size}, "weight_map": {{')


def test_a_real_model_index_still_reads() -> None:
    assert parse_index_total_size('{"metadata": {"total_size": 160000000000}}') == 160_000_000_000


@pytest.mark.parametrize("entry", [
    {"id": "w", "url": "http://x", "load": "many"}, {"id": "w", "url": "http://x", "load": 1e300},
    {"id": ["w"], "url": "http://x"}, {"id": "w", "url": 5}, {"id": "w", "bootstrap_port": -1},
])
def test_a_hostile_router_worker_entry_is_a_router_error(entry: dict[str, Any]) -> None:
    from orchestrator.remote.router_api import RouterApiError

    with pytest.raises(RouterApiError):
        RouterWorker.from_json(entry)


class _Resp:
    def __init__(self, body: bytes) -> None:
        self.status, self.body = 200, body

    def json(self) -> Any:
        return json.loads(self.body)


@pytest.mark.parametrize("body", [b'{"workers": [{"id": "w", "url": "u", "load": Infinity}]}',
                                  b"[" * 100_000, b'{"workers": ' + b"1" * 5000 + b"}",
                                  b"\xff\xfe"])
def test_a_hostile_router_answer_is_a_router_error(body: bytes) -> None:
    api = RouterApi(lambda *a, **k: _Resp(body), 29000)
    with pytest.raises(DsvError):
        api.workers()


def test_non_finite_inflight_gauges_are_not_request_counts() -> None:
    text = "sglang:num_running_reqs{a=\"1\"} inf\nsglang:num_running_reqs{a=\"2\"} 3\n" \
           "sglang:num_queue_reqs NaN\n"
    assert engine_inflight(text) == 3


@pytest.mark.parametrize("doc", [
    {"profile": "../x", "started": "20261129T101500Z", "exit_code": 0},
    {"profile": "f", "started": "20261129T101500Z", "exit_code": 0,
     "releases": {"gpu-a": "../../etc"}},
    {"profile": "f", "started": "20261129T101500Z", "exit_code": 0,
     "outcomes": [{"host": "gpu-a", "wave": "x", "state": "moved"}]},
    {"profile": "f", "started": "now", "exit_code": 0},
    [1, 2],
])
def test_a_hostile_fleet_journal_is_a_clean_error(doc: Any) -> None:
    with pytest.raises(DsvError):
        fleet_journal(json.dumps(doc), "fleet journal 1")


def test_a_hostile_fleet_journal_does_not_crash_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """`history --profile FLEET` prints an unreadable journal as such and the others as before."""
    from orchestrator.cli.fleet_cmd import _rollout_lines

    lines: list[str] = []
    monkeypatch.setattr("orchestrator.cli.fleet_cmd.say", lines.append)
    _rollout_lines({"kind": "unreadable", "reason": "fleet journal 1 is not valid"}, "")
    assert lines == ["unreadable journal: fleet journal 1 is not valid"]


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "units/../../x", "a//b", "./a", "",
                                  "a\x1b[2Jb", "a\u200bb", "a\\b"])
def test_manifest_paths_are_relative_names_only(path: str) -> None:
    with pytest.raises(DsvError):
        manifest_files(json.dumps({"files": {path: {"sha256": SHA}}}), "manifest.json")


def test_a_real_manifest_reads() -> None:
    got = manifest_files(json.dumps({"files": {"units/a.service": {"sha256": SHA, "mode": 420,
                                                                   "roles": ["decode"]}}}), "m")
    assert got == {"units/a.service": (SHA, ("decode",))}


def test_documents_past_the_caps_are_refused_before_parsing() -> None:
    with pytest.raises(DsvError, match="bytes"):
        bounded_json(b" " * ((16 << 20) + 1), "x")
    with pytest.raises(DsvError, match="nests deeper"):
        bounded_json("[" * 40 + "]" * 40, "x")


# ------------------------------------------------------------------- property: hypothesis ---

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**40, 10**40),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
                     st.sampled_from(["../../x", "/etc/passwd", RID, "gpu-host", "\u200b", "1e999"]))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=6)),
    max_leaves=40)


def _mutated_record() -> st.SearchStrategy[Any]:
    return st.builds(lambda over: _record(**over), st.dictionaries(
        st.sampled_from(["id", "host", "base_release", "rollback_target", "status", "journal",
                         "events", "pool", "plan_id"]), _json, max_size=4))


def _text(doc: Any) -> str:
    try:
        return json.dumps(doc, allow_nan=True)
    except (ValueError, TypeError):
        return str(doc)


_documents = st.one_of(_json.map(_text), _mutated_record().map(_text), st.text(max_size=300),
                       st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                       st.integers(1, 200).map(lambda n: "[" * n * 10 + "]" * n * 10))


def _readers() -> list[Any]:
    def workers(text: str) -> Any:
        return RouterApi(lambda *a, **k: _Resp(text.encode("utf-8", "surrogatepass")),
                         29000).workers()

    return [
        lambda t: ReleaseRecord.from_host(t, "record.json"),
        lambda t: manifest_files(t, "manifest.json"),
        lambda t: parse_file(t, where="calibration.json"),
        parse_index_total_size,
        workers,
        lambda t: fleet_journal(t, "fleet journal"),
        _holder,
        lambda t: _sched(t),
    ]


def _holder(text: str) -> Any:
    from orchestrator.remote.lock import parse_holder

    h = parse_holder("12345\n" + text)
    assert h is None or all(isinstance(v, str) and len(v) <= 300 for v in h.info.values())
    if h is not None:
        h.describe()
    return h


def _sched(text: str) -> Any:
    from orchestrator.calibration import last_scheduler_line

    return last_scheduler_line(text, where="engine.log")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_documents, which=st.integers(0, 7))
def test_every_host_reader_gives_a_clean_error_or_a_valid_value(doc: str, which: int) -> None:
    """Never a traceback: a DsvError with a message, or a value of the reader's type."""
    reader = _readers()[which]
    try:
        value = reader(doc)
    except DsvError as exc:
        assert exc.render().strip()
        return
    if isinstance(value, ReleaseRecord):  # a valid record names only what the grammar allows
        from orchestrator.host_data import release_id, slug

        slug(value.host)
        release_id(value.id)
    elif which == 1:
        for path in value:
            relative_name(path)
    elif which == 3:
        assert isinstance(value, int) and 0 <= value <= 1 << 50


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(_mutated_record().map(_text), _documents))
def test_a_record_from_the_host_never_writes_outside_the_state_directory(
        tmp_path_factory: pytest.TempPathFactory, doc: str) -> None:
    """The whole local-record path: read from the host, saved on the controller when the host
    cannot take it, read back and removed by the next run's reconcile - every file it touches is
    under $XDG_STATE_HOME/dsv4ctl."""
    from orchestrator.apply.executor import _save_local
    from orchestrator.apply.preflight import _local_record, local_record_path

    base = tmp_path_factory.mktemp("xdg")
    state = base / "state"
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)
    try:
        try:
            rec = ReleaseRecord.from_host(doc, "record.json")
        except DsvError:
            return
        _save_local(rec)
        _local_record(rec.host, rec.id)
        local_record_path(rec.host, rec.id).unlink(missing_ok=True)
    finally:
        if old is None:
            del os.environ["XDG_STATE_HOME"]
        else:
            os.environ["XDG_STATE_HOME"] = old
    outside = [p for p in base.rglob("*") if not p.is_relative_to(state)]
    assert not outside, outside


# ------------------------------------------------------------- a saved plan binds its target ---

def test_a_saved_plan_is_refused_on_a_machine_with_another_host_key() -> None:
    """Same inventory entry, another machine behind the address (DNS or an IP moved): the key
    the machine proves it holds differs, and apply names both (the harness twin retargets the
    inventory: tests/integration/test_hostile_retarget.py)."""
    from orchestrator.apply.preflight import check_target
    from orchestrator.errors import StalePlan
    from orchestrator.facts import ConnectionFact
    from orchestrator.paths import default_profile
    from orchestrator.planner.build import load_context
    from orchestrator.planner.fleet import plan_from_paths

    ctx = load_context(default_profile(), None)
    made = plan_from_paths(default_profile())
    assert made.target is not None and made.target.address == ctx.host.address
    made = made.model_copy(update={"target": made.target.model_copy(update={
        "host_key": "ssh-ed25519 SHA256:aaaa", "peer": "10.0.0.5"})})

    class Remote:
        identity = ConnectionFact(host_key="ssh-ed25519 SHA256:aaaa", peer="10.0.0.5")

    check_target(made, Remote(), ctx.host_name, ctx.host)  # the same machine: passes
    Remote.identity = ConnectionFact(host_key="ssh-ed25519 SHA256:bbbb", peer="10.0.0.9")
    with pytest.raises(StalePlan) as exc:
        check_target(made, Remote(), ctx.host_name, ctx.host)
    text = exc.value.render()
    assert "SHA256:aaaa" in text and "SHA256:bbbb" in text and "a different machine" in text


def test_plan_shows_its_target_and_where_each_secret_comes_from(tmp_path: Path) -> None:
    import yaml

    from orchestrator.paths import data_dir
    from orchestrator.planner.fleet import plan_from_paths
    from orchestrator.planner.report import render_text

    profiles = data_dir("profiles")
    prof = yaml.safe_load((profiles / "default.yaml").read_text())
    inv = yaml.safe_load((profiles / "inventory.yaml").read_text())
    prof["host"] = inv["hosts"]["gpu-host"]  # an inline host: the inventory is not used
    prof["secrets"] = {"DSV4_SECRET_API_KEY": {"file": "/etc/dsv4/key"}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    text = render_text(plan_from_paths(tmp_path / "p.yaml"))
    assert "target: dsv4@gpu-host.internal:22 (an inline host in the profile; the inventory " \
           "is not used" in " ".join(text.split())
    assert "secret DSV4_SECRET_API_KEY: from file /etc/dsv4/key on the controller" in text
    plan = plan_from_paths(tmp_path / "p.yaml")
    (c,) = [c for c in plan.checks if c.id == "host.inline"]
    assert c.severity == "warning" and "-i included" in c.message


@pytest.mark.parametrize("tokens", ["1" + "0" * 5000, "9" * 40])
def test_huge_token_counts_in_an_engine_log_are_a_clean_error(tokens: str) -> None:
    from orchestrator.calibration import last_scheduler_line, server_info_pool

    log = (f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
           "max_running_requests=64, context_len=1048576, available_gpu_mem=12.5 GB\n")
    with pytest.raises(DsvError, match="no SGLang scheduler startup line"):
        last_scheduler_line(log, where="engine.log")
    assert server_info_pool({"max_total_num_tokens": 10 ** 400})[0] is None
