"""Hostile input: every corpus payload in every rendered string field is refused with a message
naming the field, or renders to files that run exactly the intended argv and nothing injected.

Proofs, per rendered combination: every launch script passes ``bash -n``; run for real with a fake
``sglang``/``python`` in the engine env (they record their argv NUL-separated), the argv equals
``["serve", *engine_argv(...)]`` (router: ``["-m", "sglang_router.launch_router", *router_argv]``)
word for word, and no canary file appears; the units pass ``systemd-analyze verify`` with empty
stderr; every env-file line has the one quoted form systemd reads literally; ``profile.yaml`` loads
back with the same value. The env file's reading by a live ``systemd --user`` is checked in
tests/validate/test_systemd_live.py.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import InputError, RenderError
from orchestrator.profile.loader import load_inventory, load_text
from orchestrator.profile.schema import Profile
from orchestrator.render import ROUTER_WORKER_WAIT_S, render_release
from orchestrator.render.argv import engine_argv, router_argv
from orchestrator.render.quoting import CONTROL
from tests.validate.helpers import INVENTORY, PROFILES, materialize, resolve_profile

CORPUS = yaml.safe_load((Path(__file__).with_name("test_injection_corpus.yaml")).read_text())
BASE = yaml.safe_load((PROFILES / "default.yaml").read_text())
CASES = [(f, p) for f in CORPUS["fields"] for p in CORPUS["payloads"]]
FAKE = "#!/bin/bash\nprintf '%s\\0' \"$@\" > \"$FAKE_ARGV_OUT\"\n"
ENV_LINE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*="([^"\\`$]|\\["\\`$])*"$')


def _case_id(case: tuple[dict[str, str], str]) -> str:
    field, payload = case
    return f"{field['path']}:{field['how']}:{payload!r}"


@pytest.fixture(scope="module")
def fake_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = tmp_path_factory.mktemp("engine-env")
    (env / "bin").mkdir()
    for name in ("sglang", "python"):
        (env / "bin" / name).write_text(FAKE)
        (env / "bin" / name).chmod(0o755)
    return env


def _apply(data: dict[str, Any], field: dict[str, str], payload: str) -> tuple[str, Any]:
    """Put the payload into the profile data; returns the field path and the value as stored."""
    *parents, last = field["path"].split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    how = field["how"]
    value: Any = field.get("prefix", "") + payload
    if how == "set":
        node[last] = value
    elif how == "item":
        node.setdefault(last, []).append(value)
    elif how == "value":
        node.setdefault(last, {})["HOSTILE"] = value
    elif how == "key":
        entry = {"env": "HF_TOKEN"} if last == "secrets" else "1"
        node.setdefault(last, {})[value] = entry
    elif how == "ack":
        node.setdefault(last, []).append({"id": "recall.index-topk-512", "reason": value})
    else:
        raise AssertionError(how)
    return field["path"], value


def _render(data: dict[str, Any]) -> Any:
    profile = load_text(Profile, yaml.safe_dump(data), "hostile.yaml")
    dep = resolve_profile(profile)
    return profile, dep, render_release(profile, dep)


def _run_script(script: Path, cwd: Path) -> list[str]:
    out = cwd / "argv.bin"
    res = subprocess.run(["bash", str(script)], cwd=cwd, capture_output=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "FAKE_ARGV_OUT": str(out)})
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    return out.read_bytes().decode("utf-8").split("\0")[:-1]


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_hostile_value(case: tuple[dict[str, str], str], tmp_path: Path, fake_env: Path) -> None:
    field, payload = case
    data = copy.deepcopy(BASE)
    root = tmp_path / "root"
    data["host"] = load_inventory(INVENTORY).hosts["gpu-host"].model_dump(mode="json")
    data["host"]["install_root"] = str(root)
    data["engine"]["env"] = str(fake_env)
    path, value = _apply(data, field, payload)
    try:
        profile, dep, tree = _render(data)
    except InputError as exc:
        where = [p.path for p in exc.problems]
        assert any(w.startswith(path) for w in where), (where, exc.render())
        assert all(p.message for p in exc.problems)
        return
    except RenderError as exc:
        assert path in exc.message, exc.message
        assert exc.fix
        return

    # 1. The scripts are valid bash and run exactly the intended argv, nothing else.
    current = materialize(tree, root)
    work = tmp_path / "cwd"
    work.mkdir()
    for role in dep.roles:
        script = current / "bin" / f"launch-{role.name}.sh"
        subprocess.run(["bash", "-n", str(script)], check=True, capture_output=True)
        assert _run_script(script, work) == ["serve", *engine_argv(dep, role)]
    assert dep.router is not None
    argv = router_argv(dep, worker_startup_timeout_s=ROUTER_WORKER_WAIT_S)
    assert _run_script(current / "bin" / "launch-router.sh", work) == [
        "-m", "sglang_router.launch_router", *argv]
    assert sorted(p.name for p in work.iterdir()) == ["argv.bin"], "an injected command ran"
    if field["how"] == "item":
        role = dep.role(path.split(".")[1])
        assert engine_argv(dep, role)[-1] == value  # one word, unchanged

    # 2. Units still verify cleanly (hostile values never reach them unquoted).
    verify = shutil.which("systemd-analyze")
    assert verify, "systemd-analyze is required"
    res = subprocess.run([verify, "verify", *map(str, (current / "units").glob("*.service"))],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr

    # 3. Env files: one line per variable, in the quoted form systemd reads literally.
    for env_file in (current / "env").glob("*.env"):
        for line in env_file.read_text().split("\n")[:-1]:
            assert line.startswith("#") or ENV_LINE.match(line), line

    # 4. The resolved profile holds the same value (no YAML injection).
    resolved = load_text(Profile, tree.files["profile.yaml"].content, "profile.yaml")
    assert resolved.model_dump() == _resolved_expectation(profile, resolved)


def _resolved_expectation(profile: Profile, resolved: Profile) -> dict[str, Any]:
    """The original profile with the defaults profile.yaml writes out: the two must agree."""
    want = profile.model_dump()
    got = resolved.model_dump()
    want["attention"] = got["attention"]
    want["topology"] = {k: ({**v, **{f: got["topology"][k][f] for f in (
        "port", "nccl_port", "engine_info_bootstrap_port", "bootstrap_port") if f in v}}
        if isinstance(v, dict) else v) for k, v in want["topology"].items()}
    return want


def test_corpus_exercises_both_outcomes() -> None:
    """The corpus is not vacuous: some combinations render, some are refused, for both reasons."""
    outcomes: dict[str, int] = {"render": 0, "input": 0, "render_error": 0}
    for field, payload in CASES:
        data = copy.deepcopy(BASE)
        _apply(data, field, payload)
        try:
            _render(data)
            outcomes["render"] += 1
        except InputError:
            outcomes["input"] += 1
        except RenderError:
            outcomes["render_error"] += 1
    assert all(outcomes.values()), outcomes


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24)


@given(extra=st.lists(_TEXT, max_size=4), env_value=_TEXT)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_random_strings_reach_the_engine_unchanged(extra: list[str], env_value: str,
                                                   tmp_path: Path, fake_env: Path) -> None:
    """Beyond the corpus: arbitrary Unicode in extra_args and env values is refused with the field
    named, or reaches the engine's argv word for word with no command run."""
    data = copy.deepcopy(BASE)
    data["engine"]["env"] = str(fake_env)
    data["topology"]["decode"]["extra_args"] = extra
    data["topology"]["decode"]["env"] = {"RANDOM": env_value}
    try:
        _, dep, tree = _render(data)
    except RenderError as exc:
        assert "topology.decode.extra_args[" in exc.message or \
            "topology.decode.env.RANDOM" in exc.message, exc.message
        assert CONTROL.search("".join(extra) + env_value)
        return
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    root = work / "root"
    current = materialize(tree, root)
    role = dep.role("decode")
    assert _run_script(current / "bin" / "launch-decode.sh", work) == [
        "serve", *engine_argv(dep, role)]
    assert engine_argv(dep, role)[len(engine_argv(dep, role)) - len(extra):] == extra
    assert sorted(p.name for p in work.iterdir()) == ["argv.bin", "root"]
    line = next(ln for ln in tree.files["env/decode.env"].content.split("\n")
                if ln.startswith("RANDOM="))
    assert ENV_LINE.match(line), line
