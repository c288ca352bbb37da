"""`dsv4ctl plan --explain`: every GPU's memory adds up to its capacity, term by term, and the KV
pool's arithmetic is shown with the engine's own formula; the plan table labels every term."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.paths import data_dir
from orchestrator.planner.explain import ROLE_SECTIONS, Section, render_explain
from orchestrator.planner.fleet import load_fleet, plan_from_paths
from orchestrator.planner.report import render_text

PROFILES_DIR = data_dir("profiles")
def _first_engine_plan(path):
    """The plan of the profile's host, or of a fleet's first host."""
    return plan_from_paths(path, host_override=load_fleet(path, None).hosts[0][0])


SHIPPED = sorted(p for p in PROFILES_DIR.glob("*.yaml") if p.name != "inventory.yaml")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_gpu_row_adds_up_to_the_gpu(path: Path) -> None:
    plan = _first_engine_plan(path)
    for g in plan.gpus:
        parts = (g.preload_bytes, g.weights_bytes, g.kv_bytes, g.req_to_token_bytes,
                 g.headroom_bytes)
        assert sum(parts) == g.total_bytes, (g.index, parts, g.total_bytes)


def _gib(cell: str) -> float:
    return float(cell.removesuffix(" GiB"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_plan_table_columns_add_up_to_the_gpu(path: Path) -> None:
    """The text table, as printed: other + weights + KV pool + headroom = the GPU's size (to the
    display's 0.1 GiB per cell), and (unused) is a part of headroom, not a column of its own."""
    text = render_text(_first_engine_plan(path))
    head = re.search(r"GPU memory \(\S+, ([\d.]+) GiB each\)", text)
    assert head, text
    total = float(head.group(1))
    rows = re.findall(r"^  \d+\s+\S+\s+([\d.]+) GiB\s+([\d.]+) GiB\s+([\d.]+) GiB\s+([\d.]+) GiB",
                      text, re.M)
    assert rows
    for row in rows:
        assert abs(sum(map(float, row)) - total) <= 0.05 * 4 + 1e-9, (row, total)
    assert "other = CUDA context/NCCL" in text and "headroom = free" in text


def _explained_terms(text: str, role: str) -> tuple[list[int], int]:
    block = text.split(f"Role {role} ", 1)[1].split("Weights per rank", 1)[0]
    nums = [int(n.replace(",", "")) for n in re.findall(r"\s(\d{1,3}(?:,\d{3})+) B\s", block)]
    return nums[:5], nums[5]


def test_explain_snapshot_default_sums_exactly(golden) -> None:
    plan = plan_from_paths(PROFILES_DIR / "default.yaml")
    text = render_explain(plan)
    golden.check("plan/default.explain.txt", text)
    for c in plan.capacity:
        terms, total = _explained_terms(text, c.role)
        assert sum(terms) == total == c.gpu_total_bytes, (c.role, terms, total)
        assert "= GPU capacity" in text
    assert text.startswith("Legend: + add  ~ change  - remove  ~> restart  +> start  -< stop")
    assert "bytes_per_full_token" in text and "256-token page" in text
    assert "DSV4PoolConfigurator.calculate_pool_sizes" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_cli_plan_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(PROFILES_DIR / "mxfp4-tp8.yaml"), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "\nExplain:\nLegend:" in out and "Role engine (GPUs 0,1,2,3,4,5,6,7" in out
    terms, total = _explained_terms(out.split("Explain:", 1)[1], "engine")
    assert sum(terms) == total


def test_a_section_is_one_function() -> None:
    plan = plan_from_paths(PROFILES_DIR / "default.yaml")

    def extra(p, c) -> Section:
        return Section("Extra model", [f"{c.role}: 1 + 1 = 2"])

    text = render_explain(plan, [*ROLE_SECTIONS, extra])
    assert "  Extra model:\n    prefill: 1 + 1 = 2" in text
