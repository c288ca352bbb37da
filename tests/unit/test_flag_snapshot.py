"""Fast tests of the version-pinned flag snapshots and their pure-python validator.

Owns the offline half of command-line validation: ``orchestrator.catalog.flags`` must accept the
rendering sketches (research/sglang.md §7, adapted to sglang 0.5.23) and reject the spellings that
broke or would break a launch. No sglang import here; ``tests/parsers_real`` proves the same corpus
against the real parsers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.catalog.flags import (
    FlagTable,
    UnknownFlagTableError,
    available_flag_tables,
    load_flag_table,
)
from orchestrator.catalog.flags import validator as flag_validator
from orchestrator.errors import DsvError
from tests.parsers.corpus import CASES, Case

REPO = Path(__file__).resolve().parents[2]
FLAGS_DIR = REPO / "orchestrator" / "catalog" / "flags"
VERSIONS = {"sglang": "0.5.23", "sglang-router": "0.3.2"}

# Flags the render templates of issue 3 emit; each must exist in sglang 0.5.23.
RENDERED_SGLANG_FLAGS = [
    "--cuda-graph-max-bs-decode", "--attn-dp-size", "--moe-runner-backend", "--kv-cache-dtype",
    "--enable-metrics", "--nccl-port", "--disaggregation-bootstrap-port",
    "--engine-info-bootstrap-port", "--disaggregation-transfer-backend",
    "--swa-full-tokens-ratio", "--speculative-algorithm", "--enable-deepseek-v4-fp4-indexer",
    "--watchdog-timeout", "--chunked-prefill-size", "--max-running-requests",
    "--mem-fraction-static", "--context-length", "--page-size", "--enable-cache-report",
    "--served-model-name", "--trust-remote-code", "--base-gpu-id", "--api-key",
    "--json-model-override-args", "--reasoning-parser", "--tool-call-parser",
    "--disaggregation-mode", "--tp-size", "--ep-size", "--port", "--host", "--model-path",
    "--preferred-sampling-params", "--sampling-defaults",
]


def _table(tool: str) -> FlagTable:
    return load_flag_table(tool, VERSIONS[tool])


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.tool}:{c.name}")
def test_corpus(case: Case) -> None:
    problems = _table(case.tool).check(case.argv)
    kinds = [p.kind for p in problems]
    if case.expect == "ok":
        assert problems == [], [str(p) for p in problems]
    elif case.expect == "deprecated":
        assert kinds and set(kinds) == {"deprecated"}, kinds
        assert all(p.severity == "warning" for p in problems)
        assert _table(case.tool).errors(case.argv) == []
    else:
        assert case.expect in kinds, (case.expect, [str(p) for p in problems])
        assert _table(case.tool).errors(case.argv), "an error-kind case must have errors"


def test_problem_names_option_value_and_fix() -> None:
    (problem,) = _table("sglang").check(["--model-path", "/m", "--kv-cache-dtype", "bf17"])
    assert problem.option == "--kv-cache-dtype"
    assert problem.value == "bf17"
    assert problem.index == 2
    assert "fp8_e4m3" in problem.fix
    assert str(problem).startswith("error: ") and "Fix: " in str(problem)


def test_ambiguous_abbreviation_lists_both_candidates() -> None:
    (problem,) = _table("sglang").check(["/m", "--cuda-graph-max-bs", "64"])
    assert problem.kind == "abbreviation"
    assert "--cuda-graph-max-bs-decode" in problem.message
    assert "--cuda-graph-max-bs-prefill" in problem.message
    assert "ambiguous" in problem.message


def test_has() -> None:
    sglang = _table("sglang")
    for flag in RENDERED_SGLANG_FLAGS:
        assert sglang.has(flag), flag
    for gone in ("--cuda-graph-max-bs", "--nsa-decode-backend", "--nsa-prefill-backend",
                 "--gpu-memory-utilization", "--tp", "tp-size", "--enable-metrics-typo"):
        assert not sglang.has(gone), gone
    assert sglang.has("--enable-dp-attention")  # deprecated but still an option
    assert sglang.spec("--enable-dp-attention").deprecated  # type: ignore[union-attr]
    assert sglang.spec("--tensor-parallel-size").dest == "tp_size"  # type: ignore[union-attr]
    router = _table("sglang-router")
    for flag in ("--pd-disaggregation", "--prefill", "--decode", "--prometheus-port",
                 "--prometheus-host", "--host", "--port", "--policy"):
        assert router.has(flag), flag
    assert router.spec("--prometheus-port").default == "29000"  # type: ignore[union-attr]


def test_available_tables() -> None:
    assert available_flag_tables() == [("sglang", "0.5.23"), ("sglang-router", "0.3.2")]


def test_unknown_version_is_a_clear_error() -> None:
    with pytest.raises(UnknownFlagTableError) as info:
        load_flag_table("sglang", "0.5.22")
    assert isinstance(info.value, DsvError)
    assert "0.5.22" in info.value.message and "sglang 0.5.23" in info.value.message
    assert info.value.fix and "snapshot_flags.py" in info.value.fix
    with pytest.raises(UnknownFlagTableError):
        load_flag_table("../flags/sglang", "0.5.23")


@pytest.mark.parametrize("name", ["sglang-0.5.23.json", "sglang-router-0.3.2.json"])
def test_snapshot_is_canonical(name: str) -> None:
    """Deterministic file: sorted keys, sorted options and choices, one fixed layout."""
    text = (FLAGS_DIR / name).read_text(encoding="utf-8")
    data = json.loads(text)
    assert json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n" == text
    firsts = [o["option_strings"][0] for o in data["options"]]
    assert firsts == sorted(firsts)
    for option in data["options"]:
        if option["choices"] is not None:
            key = [(type(c).__name__, c) for c in option["choices"]]
            assert key == sorted(key), option["option_strings"]
        assert option["takes_value"] == (option["nargs"] != 0)
    assert not re.search(r"at 0x[0-9a-f]{6,}", text)  # no object addresses in default reprs


def test_every_snapshot_type_has_a_converter() -> None:
    """A type the validator cannot convert would silently skip value checks: fail instead."""
    for engine, version in available_flag_tables():
        for spec in load_flag_table(engine, version).options:
            if spec.takes_value:
                assert spec.type in flag_validator._CONVERTERS, (engine, spec.name, spec.type)


def test_plan_path_imports_nothing_heavy() -> None:
    code = (
        "import sys; from orchestrator.catalog.flags import load_flag_table; "
        "t = load_flag_table('sglang', '0.5.23'); t.check(['/m', '--tp-size', '8']); "
        "heavy = sorted(m for m in ('torch', 'triton', 'sglang', 'sglang_router', 'fabric', "
        "'numpy') if m in sys.modules); print(heavy); sys.exit(1 if heavy else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(["--tp-size", "--port", "--enable-metrics", "--", "-1", "--tp", "=",
                             "--kv-cache-dtype", "--model-type", "--prefill", "none", "8"]),
            st.text(max_size=12),
        ),
        max_size=8,
    ),
    st.sampled_from(["sglang", "sglang-router"]),
)
def test_check_never_raises(argv: list[str], tool: str) -> None:
    """Hostile or garbled argv gives problems, never a traceback."""
    for problem in _table(tool).check(argv):
        assert problem.message and problem.fix
