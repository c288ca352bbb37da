"""The REAL sglang 0.5.23 / sglang-router 0.3.2 parsers against the shared corpus and the snapshots.

Owns the CI proof behind offline flag validation: the real parsers accept and reject the same
hand-written corpus as ``tests/unit/test_flag_snapshot.py``; the pure validator agrees with the real
parsers on a generated corpus covering every option; and the committed snapshots equal the installed
parsers (``scripts/snapshot_flags.py --check``). Needs requirements/parsers.txt; never skips: a
missing or wrong-version package is a failure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from orchestrator.catalog.flags import load_flag_table
from tests.parsers import (
    ROUTER_VERSION,
    SGLANG_VERSION,
    ParserVersionError,
    check_router_argv,
    check_sglang_argv,
    check_sglang_many,
)
from tests.parsers import real as real_parsers
from tests.parsers.corpus import CASES, MONOLITHIC, Case, generated_cases

REPO = Path(__file__).resolve().parents[2]
FLAGS_DIR = REPO / "orchestrator" / "catalog" / "flags"

# What the real parser's message must say for each expected problem kind.
REAL_MESSAGE = {
    "abbreviation": r"abbreviated option",
    "unknown_option": r"unknown option",
    "invalid_choice": r"invalid choice",
    "invalid_type": r"invalid \w+ value|Decimals are not allowed|Invalid bootstrap port|"
    r"cuda-graph-config|tc_piecewise was removed",
    "missing_value": r"expected (one|1) argument",
    "unexpected_value": r"unexpected value|'--' ends option parsing",
    "explicit_value_on_flag": r"ignored explicit argument",
    "missing_required": r"arguments are required: --model-path",
    "help_requested": r"--help",
    "invalid_json": r"--json-model-override-args .*(not valid JSON|not an object)",
    "backend_selector": r"--model-type",
    "extra_values": r"silently ignore",
}


def _checker(tool: str) -> Callable[..., list[str]]:
    return check_sglang_argv if tool == "sglang" else check_router_argv


def test_installed_versions_are_pinned() -> None:
    import importlib.metadata

    assert importlib.metadata.version("sglang") == SGLANG_VERSION == "0.5.23"
    assert importlib.metadata.version("sglang-router") == ROUTER_VERSION == "0.3.2"
    with pytest.raises(ParserVersionError, match=r"sglang 0\.5\.23 is installed but dsv4ctl pins"):
        real_parsers._require_version("sglang", "0.5.99")
    with pytest.raises(ParserVersionError, match="not installed"):
        real_parsers._require_version("sglang-no-such-distribution", "1.0")


def test_real_triton_is_used() -> None:
    check_sglang_argv(["--model-path", "/m"])
    assert not real_parsers.TRITON_STUBBED, "triton is in requirements/parsers.txt; it must import"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.tool}:{c.name}")
def test_real_parser_corpus(case: Case) -> None:
    check = _checker(case.tool)
    problems = check(case.argv)
    if case.expect == "ok":
        assert problems == []
    elif case.expect == "deprecated":
        assert problems and all("deprecated option" in p for p in problems), problems
        assert check(case.argv, allow_deprecated=True) == []
    else:
        assert problems, f"the real parser accepted {case.argv}"
        pattern = REAL_MESSAGE[case.expect]
        assert any(re.search(pattern, p) for p in problems), (pattern, problems)


@pytest.mark.parametrize(
    ("tool", "version"), [("sglang", SGLANG_VERSION), ("sglang-router", ROUTER_VERSION)]
)
def test_snapshot_validator_agrees_with_real_parser(tool: str, version: str) -> None:
    """Differential test over every option: good value, '=value', missing value, a following
    option, a bogus value, a negative number, '=x' on flags, and a truncated option name."""
    snapshot = json.loads((FLAGS_DIR / f"{tool}-{version}.json").read_text(encoding="utf-8"))
    table = load_flag_table(tool, version)
    check = _checker(tool)
    cases = list(generated_cases(tool, snapshot))
    assert len(cases) > (2000 if tool == "sglang" else 400)
    disagreements: list[tuple[Sequence[str], list[str], list[str]]] = []
    accepted = 0
    for case in cases:
        real = check(case.argv, allow_deprecated=True, faithful=False)
        offline = [str(p) for p in table.errors(case.argv)]
        accepted += not real
        if bool(real) != bool(offline):
            disagreements.append((case.argv, real, offline))
    assert disagreements == []
    # The corpus must exercise both outcomes substantially, or agreement proves little.
    assert 0.2 < accepted / len(cases) < 0.8, accepted


def test_faithful_pass_matches_strict_pass_on_good_lines() -> None:
    """prepare_server_args (what `sglang serve` runs) accepts what the strict pass accepted."""
    good = [case.argv for case in CASES if case.tool == "sglang" and case.expect == "ok"]
    assert check_sglang_many(good) == [[] for _ in good]


def test_snapshot_matches_real_parsers() -> None:
    run = subprocess.run(
        [sys.executable, "scripts/snapshot_flags.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "sglang-0.5.23.json equals the real parser" in run.stdout


def test_snapshot_check_detects_drift(tmp_path: Path) -> None:
    for name in ("sglang-0.5.23.json", "sglang-router-0.3.2.json"):
        shutil.copy(FLAGS_DIR / name, tmp_path / name)
    path = tmp_path / "sglang-0.5.23.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["options"] = [o for o in data["options"] if o["option_strings"][0] != "--attn-dp-size"]
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "scripts/snapshot_flags.py", "--check", "--dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1
    assert "--attn-dp-size" in run.stdout and "STALE" in run.stderr


def test_cli_batch_and_single() -> None:
    batch = [list(MONOLITHIC), ["--model-path", "/m", "--tp", "8"]]
    run = subprocess.run(
        [sys.executable, "-m", "tests.parsers", "sglang"],
        cwd=REPO,
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr
    first, second = json.loads(run.stdout)
    assert first == [] and len(second) == 1 and "--tp-size" in second[0]
    run = subprocess.run(
        [sys.executable, "-m", "tests.parsers", "router"],
        cwd=REPO,
        input='["--pd-disaggregation", "--prefill", "http://a:1", "8998", "--decode", "http://b:2"]',
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (run.returncode, json.loads(run.stdout)) == (0, [])
    run = subprocess.run(
        [sys.executable, "-m", "tests.parsers", "sglang"],
        cwd=REPO,
        input='{"not": "an argv"}',
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "JSON list of strings" in run.stderr


def test_triton_stub_fallback_builds_the_same_parser() -> None:
    """If triton ever fails to import, the stub path must still yield the identical option set."""
    code = (
        "import sys, json; sys.modules['triton'] = None\n"  # makes `import triton` raise
        "from tests.parsers import real, sglang_parser\n"
        "p = sglang_parser(); assert real.TRITON_STUBBED\n"
        "print(json.dumps(sorted(p._option_string_actions)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "using a stub" in run.stderr
    stubbed = json.loads(run.stdout)
    table = load_flag_table("sglang", SGLANG_VERSION)
    assert stubbed == table.option_strings()


def test_fleet_router_command_lines_pass_the_real_router_parser(tmp_path: Path) -> None:
    """Issue 23: the one router of a fleet, in regular mode (--worker-urls, every host's engine)
    and in PD mode (every prefill with its bootstrap port, every decode), as rendered."""
    import yaml

    from orchestrator.planner.fleet import load_fleet, plan_fleet
    from orchestrator.render.argv import router_argv

    profiles = REPO / "profiles"
    regular = plan_fleet(load_fleet(profiles / "fleet-3x.yaml", None)).plan("router-1").deployment
    pd = yaml.safe_load((profiles / "default.yaml").read_text())
    pd.pop("host")
    pd["hosts"] = "fleet-3x"
    (tmp_path / "inventory.yaml").write_text((profiles / "inventory.yaml").read_text())
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pd))
    pd_dep = plan_fleet(load_fleet(tmp_path / "p.yaml", None)).plan("gpu-a").deployment
    for dep in (regular, pd_dep):
        argv = router_argv(dep, worker_startup_timeout_s=1800)
        assert check_router_argv(argv) == [], argv
    assert router_argv(regular).count("http://10.0.1.12:30000") == 1
    assert router_argv(pd_dep).count("--prefill") == 3
