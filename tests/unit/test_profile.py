"""Profile and inventory loading: valid documents load, invalid ones fail with located, actionable errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.errors import InputError
from orchestrator.paths import data_dir
from orchestrator.profile import Inventory, Profile, load_inventory, load_profile, load_text
from orchestrator.profile.types import parse_size

PROFILES = sorted(p for p in data_dir("profiles").glob("*.yaml") if p.name != "inventory.yaml")
DEFAULT = (data_dir("profiles") / "default.yaml").read_text()


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_shipped_profiles_load(path: Path) -> None:
    p = load_profile(path)
    assert p.name == path.stem or p.name == "default"


def test_shipped_inventory_loads() -> None:
    inv = load_inventory(data_dir("profiles") / "inventory.yaml")
    assert "gpu-host" in inv.hosts


def _errors(text: str) -> InputError:
    with pytest.raises(InputError) as info:
        load_text(Profile, text, "p.yaml")
    return info.value


def _edit(path: list[str | int], value: object, text: str = DEFAULT) -> str:
    data = yaml.safe_load(text)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return yaml.safe_dump(data, sort_keys=False)


def test_wrong_type_names_path_line_value_and_fix() -> None:
    text = DEFAULT.replace("    tp: 4\n    ep: 4\n    cuda_graph_max_bs: 64",
                           "    tp: four\n    ep: 4\n    cuda_graph_max_bs: 64")
    err = _errors(text)
    (p,) = err.problems
    assert p.path == "topology.decode.tp"
    assert p.value == "'four'"
    assert p.file == "p.yaml"
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "tp: four" in ln)
    assert p.line == line
    assert p.fix is not None and "whole number" in p.fix and "Tensor-parallel" in p.fix
    rendered = err.render()
    assert f"p.yaml:{line}" in rendered and "topology.decode.tp" in rendered


def test_unknown_key_suggests_the_close_one() -> None:
    err = _errors(DEFAULT.replace("  served_name: deepseek-v4-flash", "  servedname: deepseek-v4-flash"))
    (p,) = err.problems
    assert p.path == "model.servedname"
    assert "unknown key" in p.message
    assert p.fix is not None and "served_name" in p.fix


def test_missing_required_key_points_at_parent() -> None:
    text = DEFAULT.replace("  path: /models/DeepSeek-V4-Flash-NVFP4\n", "")
    (p,) = _errors(text).problems
    assert p.path == "model.path"
    assert "missing" in p.message
    assert p.line == next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("model:")) + 1


def test_bad_mode_lists_choices() -> None:
    (p,) = _errors(DEFAULT.replace("mode: pd", "mode: disaggregated")).problems
    assert p.path.startswith("topology")
    assert "colocated" in (p.fix or "") and "pd" in (p.fix or "")


def test_every_problem_is_reported_not_just_the_first() -> None:
    text = _edit(["serving", "mem_fraction_static"], 1.5)
    text = _edit(["model", "path"], "relative/path", text)
    paths = {p.path for p in _errors(text).problems}
    assert {"serving.mem_fraction_static", "model.path"} <= paths


@pytest.mark.parametrize("text,needle", [
    ("a: [1, 2", "YAML syntax"),
    ("model: {x: 1}\nmodel: {y: 2}\n", "duplicate key"),
    ("- just\n- a list\n", "mapping"),
    ("", "empty file"),
    ("a: 1\n---\nb: 2\n", "more than one YAML document"),
])
def test_malformed_documents(text: str, needle: str) -> None:
    assert needle in _errors(text).render()


def test_alias_bomb_is_refused() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i, prev in zip("bcdefgh", "abcdefg", strict=True):
        bomb += f"{i}: &{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
    assert "expands to more than" in _errors(bomb).render()


@pytest.mark.parametrize("raw,expected", [
    (1024, 1024), ("78GiB", 78 * 2**30), ("160GB", 160 * 10**9), ("1.5 TB", 1_500_000_000_000),
    ("512MiB", 512 * 2**20), ("10", 10),
])
def test_sizes(raw: object, expected: int) -> None:
    assert parse_size(raw) == expected


@pytest.mark.parametrize("raw", ["78 GiBs", "-1", True, "lots", -5])
def test_bad_sizes(raw: object) -> None:
    with pytest.raises(ValueError):
        parse_size(raw)


def test_inventory_free_larger_than_size_is_caught() -> None:
    text = """
hosts:
  h1:
    address: 10.0.0.1
    gpus: {model: rtx-pro-6000-se, count: 8}
    disks: [{path: /models, size: 100GB, free: 200GB}]
"""
    with pytest.raises(InputError) as info:
        load_text(Inventory, text, "inv.yaml")
    (p,) = info.value.problems
    assert p.path == "hosts.h1.disks.0"
    assert "check the units" in p.message


@pytest.mark.parametrize("field,value", [
    (["model", "path"], "/models/x\nExecStartPre=/bin/rm -rf /"),
    (["engine", "env"], "/opt/sglang; rm -rf /"),
    (["model", "served_name"], "name with spaces"),
    (["name"], "Default_Profile"),
])
def test_control_characters_and_unsafe_names_are_refused(field: list[str], value: str) -> None:
    err = _errors(_edit(field, value))
    assert any(p.path == ".".join(field) for p in err.problems)
