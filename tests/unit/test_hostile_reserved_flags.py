"""extra_args may not override what dsv4ctl renders; install_root may not be a system directory
(issue 19, Deliver 4).

Before: `extra_args: [--host, 0.0.0.0]` silently overrode the rendered `--host 127.0.0.1` (argparse
keeps the last value) and `--model-path` could be redirected the same way; `install_root: /` or
`/etc` planned without a word.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.catalog.flags import load_flag_table
from orchestrator.deployment import resolve
from orchestrator.errors import DsvError
from orchestrator.paths import data_dir
from orchestrator.planner.build import load_context
from orchestrator.planner.fleet import plan_from_paths
from orchestrator.render.argv import engine_argv

PROFILES_DIR = data_dir("profiles")
SHIPPED = sorted(p for p in PROFILES_DIR.glob("*.yaml") if p.name != "inventory.yaml")


def _plan(tmp_path: Path, extra: list[str], role: str = "decode", install_root: str | None = None):
    prof = yaml.safe_load((PROFILES_DIR / "default.yaml").read_text())
    prof["topology"][role]["extra_args"] = extra
    inv = yaml.safe_load((PROFILES_DIR / "inventory.yaml").read_text())
    if install_root is not None:
        for h in inv["hosts"].values():
            h["install_root"] = install_root
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inv))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return plan_from_paths(path)


@pytest.mark.parametrize(("extra", "field"), [
    (["--host", "0.0.0.0"], "no profile field: engines listen on 127.0.0.1"),
    (["--host=0.0.0.0"], "no profile field: engines listen on 127.0.0.1"),
    (["--model-path", "/elsewhere"], "from model.path"),
    (["--model", "/elsewhere"], "from model.path"),  # an alias of --model-path
    (["--port", "31000"], "from topology.decode.port"),
    (["--tensor-parallel-size", "2"], "from topology.decode.tp"),
    (["--log-level", "debug", "--served-model-name", "x"], "from model.served_name"),
])
def test_rendered_flag_in_extra_args_is_refused_with_the_field_to_use(
        tmp_path: Path, extra: list[str], field: str) -> None:
    plan = _plan(tmp_path, extra)
    bad = [c for c in plan.errors if c.id == "engine.flag-reserved"]
    assert len(bad) == 1, [c.message for c in plan.errors]
    assert field in (bad[0].fix or ""), bad[0].fix
    assert bad[0].subject == "topology.decode.extra_args"
    assert repr(extra[-2] if "=" not in extra[-1] else extra[-1]) in bad[0].message


def test_other_extra_args_still_pass(tmp_path: Path) -> None:
    plan = _plan(tmp_path, ["--log-level", "debug", "--disable-radix-cache"])
    assert not [c for c in plan.errors if c.id == "engine.flag-reserved"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_rendered_engine_flag_has_an_owner(path: Path) -> None:
    """One owner: each flag engine_argv emits is in ENGINE_FLAG_FIELDS (or the refusal misses it)."""
    from orchestrator.render.argv import ENGINE_FLAG_FIELDS

    ctx = load_context(path, None)
    dep = resolve(ctx.profile, ctx.host_name, ctx.host, default_index_topk=1024,
                  max_context_length=1 << 20)
    table = load_flag_table("sglang", dep.engine_version)
    for role in dep.roles:
        rendered = [w for w in engine_argv(dep, role) if w.startswith("--") and table.has(w)]
        missing = sorted(set(rendered) - set(ENGINE_FLAG_FIELDS))
        assert not missing, f"{path.name}/{role.name}: rendered but not in ENGINE_FLAG_FIELDS"


@pytest.mark.parametrize(("root", "reason"), [
    ("/", "system directory"), ("/etc", "belongs to the operating system"),
    ("/etc/dsv4", "belongs to the operating system"), ("/usr/local", "system directory"),
    ("/proc/self", "belongs to the operating system"),
])
def test_install_root_system_directories_are_refused(tmp_path: Path, root: str, reason: str) -> None:
    with pytest.raises(DsvError) as exc:
        _plan(tmp_path, [], install_root=root)
    text = str(exc.value.render() if hasattr(exc.value, "render") else exc.value)
    assert "install_root" in text and root in text and reason in text, text
