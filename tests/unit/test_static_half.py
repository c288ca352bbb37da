"""`validate` is plan's static half for the mistakes a new user made, every fix it prints works
when applied as written, one mistake is one error, and the schema teaches every field.

Each test here is a symptom an operator reported: `validate` passed what `plan` rejected, a fix
named a value the engine rejects, two errors for one mistake, advice that skipped the largest
term's own lever, internal tracker references in output, `128K` refused where the README
promises K/M units.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.paths import data_dir
from orchestrator.planner.build import build_plan, load_context
from orchestrator.planner.jsonschema import profile_schema
from orchestrator.planner.static import check_profile
from orchestrator.profile.inventory import Inventory
from orchestrator.profile.jsonschema import json_schema

PROFILES = data_dir("profiles")
TP8 = (PROFILES / "mxfp4-tp8.yaml").read_text()
DEFAULT = (PROFILES / "default.yaml").read_text()


def _write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    path = tmp_path / name
    path.write_text(text)
    return path


def _edit(tmp_path: Path, base: str, old: str, new: str) -> Path:
    assert base.count(old) == 1, old
    return _write(tmp_path, base.replace(old, new))


def _set(tmp_path: Path, base: str, changes: dict[str, object]) -> Path:
    prof = yaml.safe_load(base)
    for dotted, value in changes.items():
        node = prof
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return _write(tmp_path, yaml.safe_dump(prof, sort_keys=False))


def _errors(checks) -> list:  # type: ignore[no-untyped-def]
    return [c for c in checks if c.severity == "error"]


def _plan(path: Path):  # type: ignore[no-untyped-def]
    return build_plan(load_context(path, None))


# ------------------------------------------------------------- validate = plan's static half


def test_ep_that_is_neither_1_nor_tp_is_refused_by_validate_with_its_fix_once(tmp_path: Path
                                                                            ) -> None:
    path = _edit(tmp_path, TP8, "    ep: 8\n", "    ep: 4\n")
    _, checks = check_profile(path)
    [err] = _errors(checks)
    assert err.id == "capacity.layout" and "ep=4 with tp=8" in err.message
    assert err.location and err.location.startswith(f"{path}:")
    assert err.fix == "set topology.engine.ep: 1, or ep: 8" and "Fix:" not in err.message  # once
    assert [c.id for c in _errors(_plan(path).checks)] == ["capacity.layout"]
    fixed = _edit(tmp_path, TP8, "    ep: 8\n", "    ep: 1\n")  # the fix, applied as written
    assert not [c for c in _errors(_plan(fixed).checks) if c.id == "capacity.layout"]


def test_a_role_env_setting_cuda_visible_devices_is_a_located_error_in_validate_and_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _edit(tmp_path, TP8, "    cuda_graph_max_bs: 64\n",
                 "    cuda_graph_max_bs: 64\n    env:\n      CUDA_VISIBLE_DEVICES: '0'\n")
    line = path.read_text().splitlines().index("      CUDA_VISIBLE_DEVICES: '0'") + 1
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "profile.env-reserved" in out and f"{path.name}:{line}:" in out
    plan = _plan(path)  # a check with its location, not an unlocated render error
    [err] = _errors(plan.checks)
    assert err.id == "profile.env-reserved"
    assert err.field == "topology.engine.env.CUDA_VISIBLE_DEVICES"
    assert err.location and err.location.startswith(f"{path}:{line}:")
    assert err.fix == "remove CUDA_VISIBLE_DEVICES from topology.engine.env"


def test_validate_does_not_call_an_acknowledgement_of_a_host_check_unused(tmp_path: Path) -> None:
    """host.key-unpinned needs the inventory's host: only plan can say it matches nothing."""
    path = _set(tmp_path, TP8, {"acknowledge": [
        {"id": "host.key-unpinned", "reason": "a lab host, key checked by hand"}]})
    _, checks = check_profile(path)
    assert "profile.ack-unused" not in {c.id for c in checks}
    plan = _plan(path)
    assert "profile.ack-unused" not in {c.id for c in plan.checks}
    assert next(c for c in plan.checks if c.id == "host.key-unpinned").acknowledged
    stale = _set(tmp_path, TP8, {"acknowledge": [{"id": "host.no-such", "reason": "typo"}]})
    assert "profile.ack-unused" in {c.id for c in _plan(stale).checks}  # plan still tells


@pytest.mark.parametrize("written", ["bfloat16", "bf16", "fp8_e5m2"])
def test_every_kv_dtype_fix_names_a_dtype_that_starts(tmp_path: Path, written: str) -> None:
    """SGLang 0.5.23's V4 argument check accepts bfloat16, but CUDA has no BF16 V4 pool: no fix
    may offer it, and validate refuses it as plan does."""
    path = _edit(tmp_path, TP8, "kv_cache_dtype: fp8_e4m3", f"kv_cache_dtype: {written}")
    _, checks = check_profile(path)
    [err] = _errors(checks)
    assert err.field == "attention.kv_cache_dtype" and err.fix
    assert "bfloat16" not in err.fix.replace("its 'bfloat16' has no", "")
    assert [c.id for c in _errors(_plan(path).checks)] == [err.id]  # one error, in plan too
    offered = re.findall(r"fp8_e4m3|bfloat16|fp8_e5m2", err.fix)[0]
    fixed = _edit(tmp_path, TP8, "kv_cache_dtype: fp8_e4m3", f"kv_cache_dtype: {offered}")
    assert not _errors(_plan(fixed).checks)


def test_schema_enumerates_only_kv_dtypes_that_start() -> None:
    prop = profile_schema()["$defs"]["Attention"]["properties"]["kv_cache_dtype"]
    assert prop["enum"] == ["fp8_e4m3"]


def test_auto_runner_on_nvfp4_is_one_error(tmp_path: Path) -> None:
    path = _edit(tmp_path, DEFAULT, "runner_backend: flashinfer_cutlass", "runner_backend: auto")
    errors = _errors(_plan(path).checks)
    assert [c.field for c in errors] == ["moe.runner_backend"], [c.id for c in errors]
    fix = errors[0].fix or ""
    runner = fix.removeprefix("set moe.runner_backend: ").split()[0]
    fixed = _edit(tmp_path, DEFAULT, "runner_backend: flashinfer_cutlass",
                  f"runner_backend: {runner}")
    assert not _errors(_plan(fixed).checks)


def test_headroom_advice_names_the_cuda_graph_lever_first_and_it_works(tmp_path: Path) -> None:
    changes = {"topology.engine.cuda_graph_max_bs": 512, "serving.max_running_requests": 512}
    plan = _plan(_set(tmp_path, TP8, changes))
    c = next(c for c in plan.checks if c.id == "capacity.headroom")
    assert c.numbers["largest_term"] == "cuda_graphs"
    assert c.fix and c.fix.startswith("lower cuda_graph_max_bs to ")
    assert c.field == "topology.engine.cuda_graph_max_bs"
    bs = int(c.fix.removeprefix("lower cuda_graph_max_bs to ").split()[0])
    fixed = _plan(_set(tmp_path, TP8, {**changes, "topology.engine.cuda_graph_max_bs": bs}))
    assert "capacity.headroom" not in {x.id for x in fixed.checks}


# ------------------------------------------------------------- the schema and the words


def _properties(schema: dict) -> list[tuple[str, str, dict]]:
    out = [("root", k, v) for k, v in schema.get("properties", {}).items()]
    for name, d in schema.get("$defs", {}).items():
        out += [(name, k, v) for k, v in d.get("properties", {}).items()]
    return out


@pytest.mark.parametrize("which", ["profile", "inventory"])
def test_schema_describes_every_field(which: str) -> None:
    schema = profile_schema() if which == "profile" else json_schema(Inventory, "inv")
    missing = [f"{owner}.{k}" for owner, k, v in _properties(schema)
               if not v.get("description")]
    assert not missing


def test_schema_enumerates_catalog_values() -> None:
    d = profile_schema()["$defs"]
    assert "flashinfer_cutlass" in d["Moe"]["properties"]["runner_backend"]["enum"]
    assert "dsv4-flash-nvfp4" in d["Model"]["properties"]["variant"]["enum"]
    assert d["Attention"]["properties"]["kv_cache_dtype"]["enum"]


TRACKER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def test_no_internal_tracker_reference_reaches_the_user(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import cli

    texts = {"profile schema": json.dumps(profile_schema()),
             "inventory schema": json.dumps(json_schema(Inventory, "inv"))}
    for p in ("default.yaml", "mxfp4-tp8.yaml"):
        plan = _plan(PROFILES / p)
        texts.update({f"{p}:{f.path}": f.content or "" for f in plan.files})
        texts[f"{p} checks"] = " ".join(f"{c.message} {c.fix}" for c in plan.checks)
    for name in cli.commands:
        assert main([name, "--help"]) == 0
        texts[f"{name} --help"] = capsys.readouterr().out
    for kind in ("models", "gpus", "engines"):
        assert main(["catalog", kind, "--format", "json"]) == 0
        texts[f"catalog {kind}"] = capsys.readouterr().out
    found = {k: TRACKER.findall(v) for k, v in texts.items() if TRACKER.search(v)}
    assert not found


# ------------------------------------------------------------- K/M units


def test_128k_is_accepted_in_longest_request_tokens(tmp_path: Path) -> None:
    path = _edit(tmp_path, TP8, "  context_tokens: 65536\n",
                 "  context_tokens: 65536\n  longest_request_tokens: 128K\n")
    profile, _ = check_profile(path)
    assert profile.workload.longest_request_tokens == 131072


def test_every_token_count_of_the_schema_accepts_k_and_m() -> None:
    """The README: token counts in profiles accept 64K and 1M. A field named for tokens that
    takes a bare integer only breaks that promise."""
    def takes_units(v: dict) -> bool:
        alts = v.get("anyOf", [v])
        return any(a.get("type") == "string" or "anyOf" in a for a in alts)

    for schema in (profile_schema(),):
        bad = [f"{o}.{k}" for o, k, v in _properties(schema)
               if re.search(r"tokens|prefill_size", k) and not takes_units(v)]
        assert not bad
