"""The indexer function SGLang 0.5.23 really calls on sm_120 under the env dsv4ctl renders.

End to end on a CPU: the default profile is rendered by dsv4ctl's own renderer and each engine's
``env/<role>.env`` is read back as systemd would (the unit's ``EnvironmentFile=``); with exactly
that environment, SGLang's real code runs in order:

1. the V4 model hook's sm_120 block (``srt/arg_groups/model_hook.py``, ``if
   get_platform().is_sm120:``: ``if not envs.X.is_set(): envs.X.set(...)``), compiled from the
   installed file with ``ast``;
2. the bundled kernels' import hook (``dsv4_kernels.sglang_hook.patch_module``) on a module
   holding SGLang's real ``fp8_paged_mqa_logits_torch_sm120``, as it patches the real
   ``dsv4.indexer`` module after its import;
3. the indexer's dispatch (``srt/layers/attention/dsv4/indexer.py``, the ``if use_fp4_indexer
   and not use_aiter_fp4: ... else: from deep_gemm import fp8_paged_mqa_logits as fn`` chain in
   ``forward``), compiled from the installed file and run with that module's globals, as the
   real method looks its names up per call.

Stubbed (they cannot import on a CPU): ``get_platform()`` (an sm_120 platform), the TileLang
kernel module and ``deep_gemm`` (sentinels that say which branch was taken). The env vars are
read through SGLang's real ``envs`` (``os.getenv`` per ``.get()``).

Before the fix this failed: dsv4ctl rendered only ``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1``, the
hook then set ``SGLANG_OPT_USE_TILELANG_INDEXER=1`` (model_hook.py L501-502), and the dispatch
tests TileLang first (indexer.py L862 before L868): the bundled logits were never called.
"""

from __future__ import annotations

import ast
import builtins
import os
import sys
import types
from typing import Any

import pytest

from tests.parsers_real.sglang_pool_oracle import sglang_root
from tests.validate.helpers import PROFILES, render_path

MODEL_HOOK = "srt/arg_groups/model_hook.py"
INDEXER = "srt/layers/attention/dsv4/indexer.py"
INDEXER_MODULE = "sglang.srt.layers.attention.dsv4.indexer"


def _env_file(text: str) -> dict[str, str]:
    """``NAME="value"`` lines of a rendered env file (values dsv4ctl writes need no unescaping
    here: the names and values this test reads are plain words)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name] = value[1:-1] if value.startswith('"') else value
    return out


def _sm120_block() -> ast.If:
    """The ``if get_platform().is_sm120:`` statement of the DeepseekV4ForCausalLM branch."""
    tree = ast.parse((sglang_root() / MODEL_HOOK).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "get_platform().is_sm120":
            src = ast.unparse(node)
            if "SGLANG_OPT_USE_TILELANG_INDEXER" in src:
                return node
    raise AssertionError(f"{MODEL_HOOK}: no sm_120 block setting the indexer env any more")


def _dispatch_chain() -> ast.If:
    """The indexer's ``fn`` choice: the if/elif chain that starts at the FP4 indexer test."""
    tree = ast.parse((sglang_root() / INDEXER).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and \
                ast.unparse(node.test) == "use_fp4_indexer and (not use_aiter_fp4)":
            assert "fp8_paged_mqa_logits_torch_sm120" in ast.unparse(node)
            return node
    raise AssertionError(f"{INDEXER}: the MQA-logits dispatch chain moved")


def _run(node: ast.stmt, ns: dict[str, Any], label: str) -> None:
    mod = ast.Module(body=[node], type_ignores=[])
    exec(compile(mod, label, "exec"), ns)  # SGLang's own installed code


def _envs_read(node: ast.stmt) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "envs"}


def _indexer_module() -> types.ModuleType:
    """A module named as SGLang's indexer holding its real sm_120 torch function, patched by
    the bundled kernels' hook exactly as the hook patches the real module after import."""
    from dsv4_kernels import sglang_compat, sglang_hook

    mod = types.ModuleType(INDEXER_MODULE)
    real = sglang_compat.load_sglang_functions(
        sglang_root() / INDEXER, ["fp8_paged_mqa_logits_torch", "fp8_paged_mqa_logits_torch_sm120"])
    vars(mod).update(real)
    if os.environ.get(sglang_hook.ENV_VAR):  # the .pth line activates the hook only then
        sglang_hook.patch_module(mod)  # patches only the ops DSV4_KERNELS_OPS names
    return mod


def _chosen_fn(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """What ``fn`` SGLang's indexer picks on sm_120 when its process starts with ``env``."""
    from sglang.srt.environ import envs

    hook, chain = _sm120_block(), _dispatch_chain()
    for name in _envs_read(hook) | _envs_read(chain) | set(env) | {"DSV4_KERNELS_SGLANG"}:
        # set first, so that monkeypatch records the original and removes what SGLang sets
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    platform = types.SimpleNamespace(is_sm120=True, is_hip=False)
    _run(hook, {"__builtins__": builtins, "envs": envs, "get_platform": lambda: platform},
         MODEL_HOOK)
    tilelang = types.ModuleType("sglang.kernels.ops.attention.dsa.tilelang_kernel")
    tilelang.tilelang_fp8_paged_mqa_logits = "TileLang"  # type: ignore[attr-defined]
    deep_gemm = types.ModuleType("deep_gemm")
    deep_gemm.fp8_paged_mqa_logits = "DeepGEMM"  # type: ignore[attr-defined]
    deep_gemm.fp8_fp4_paged_mqa_logits = "DeepGEMM FP4"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, tilelang.__name__, tilelang)
    monkeypatch.setitem(sys.modules, "deep_gemm", deep_gemm)
    ns = vars(_indexer_module())
    ns.update(__builtins__=builtins, envs=envs, get_platform=lambda: platform,
              is_xpu=lambda: False, _aiter_fp8_paged_mqa_logits="AITER",
              use_fp4_indexer=False, use_aiter_fp4=False, weights=None)
    _run(chain, ns, INDEXER)
    return ns["fn"]


def _rendered_envs(indexer: str = "bundled") -> dict[str, dict[str, str]]:
    """The engine env files of the default profile with ``kernels.indexer`` set."""
    import tempfile
    from pathlib import Path

    import yaml

    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["kernels"] = {"indexer": indexer}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
        (Path(tmp) / "p.yaml").write_text(yaml.safe_dump(data))
        _, dep, tree = render_path(Path(tmp) / "p.yaml")
    assert dep.kernels_enabled, "kernels.indexer: bundled ships the bundled kernels"
    envs = {rel: _env_file(f.content) for rel, f in tree.files.items()
            if rel.startswith("env/") and rel.endswith(".env")}
    assert envs, "no engine env file rendered"
    return envs


@pytest.mark.parametrize("rel", sorted(_rendered_envs()))
def test_rendered_env_reaches_the_bundled_logits(rel: str, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    from dsv4_kernels import sglang_compat

    env = _rendered_envs()[rel]
    assert env["DSV4_KERNELS_SGLANG"] == "1" and "indexer" in env["DSV4_KERNELS_OPS"].split(",")
    fn = _chosen_fn(env, monkeypatch)
    assert fn is sglang_compat.fp8_paged_mqa_logits_sm120, (
        f"{rel}: SGLang's indexer calls {fn!r}, not the bundled logits the hook installed")
    # the env SGLang ends with after its hook, as the planner's headroom model reads it
    assert os.environ["SGLANG_OPT_USE_TILELANG_INDEXER"] == "0"
    assert os.environ["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == "1"


def test_without_the_tilelang_switch_sglang_takes_tilelang(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The defect, pinned: the torch switch alone (what dsv4ctl rendered before) loses to the
    TileLang default the model hook turns on."""
    env = {"DSV4_KERNELS_SGLANG": "1", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1"}
    assert _chosen_fn(env, monkeypatch) == "TileLang"


def test_kernels_off_leaves_sglangs_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _chosen_fn({}, monkeypatch) == "TileLang"  # sglang 0.5.23 on sm_120 out of the box


@pytest.mark.parametrize("rel", sorted(_rendered_envs("auto")))
def test_the_default_profile_keeps_sglangs_tilelang_indexer(rel: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # engine first: with no measurement the default renders nothing for the indexer
    env = _rendered_envs("auto")[rel]
    assert "indexer" not in env.get("DSV4_KERNELS_OPS", "").split(",")
    assert _chosen_fn(env, monkeypatch) == "TileLang"


def test_the_planner_reads_the_env_render_writes() -> None:
    """One owner: the engine env the planner models is the one the env file holds."""
    from orchestrator.render import engine_env

    _, dep, tree = render_path(PROFILES / "default.yaml")
    for role in dep.roles:
        written = _env_file(tree.files[f"env/{role.name}.env"].content)
        assert dict((k, v) for k, v, _ in engine_env(dep, role, f"topology.{role.name}")) \
            == written
