"""The attention and mHC functions SGLang 0.5.23 really calls on sm_120 under the env dsv4ctl renders.

For each profile below, dsv4ctl renders the engine env files; with exactly one file's environment
(as systemd's ``EnvironmentFile=`` gives it), SGLang's real code runs on the CPU:

* attention: ``kernels/ops/attention/flash_mla_sm120.py``'s module-level backend read
  (``_sm120_default_backend = envs.SGLANG_SM120_FLASHMLA_BACKEND.get()``, L209, evaluated as at
  import) and its dispatcher ``flash_mla_with_kvcache_sm120`` (L298-374), compiled from the
  installed file; the real ``flash_mla_sm120_triton`` module (it imports on a CPU), patched by the
  bundled kernels' import hook (``sglang_hook.patch_module``) as after its import in the engine;
* mHC: SGLang's real ``mhc_fused_post_pre`` in a module named as ``sglang.kernels.ops.layernorm.mhc``,
  patched by the same hook (``deepseek_v4.get_mhc_ops`` imports the module attribute).

Stubbed, because they need an sm_120 GPU: FlashInfer's two kernels (``_flash_mla_flashinfer``,
``_flash_mla_sm120_prefill``) and the torch fallback, as sentinels naming the branch taken; the
function the Triton branch finally calls is replaced by a recorder that says whether it is the
bundled kernel (``__dsv4_kernels__``) or SGLang's own. The indexer's dispatch is driven the same
way in test_indexer_path_vs_sglang.py.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.parsers_real.sglang_pool_oracle import sglang_root
from tests.validate.helpers import PROFILES, render_path

FLASH_MLA = "kernels/ops/attention/flash_mla_sm120.py"
TRITON_MODULE = "sglang.kernels.ops.attention.flash_mla_sm120_triton"
MHC = "kernels/ops/layernorm/mhc.py"
MHC_MODULE = "sglang.kernels.ops.layernorm.mhc"
HOOK_VARS = ("DSV4_KERNELS_SGLANG", "DSV4_KERNELS_OPS", "DSV4_KERNELS_BF16_GEMMS",
             "SGLANG_SM120_FLASHMLA_BACKEND", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",
             "SGLANG_OPT_USE_TILELANG_INDEXER")


def _env_file(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name] = value[1:-1] if value.startswith('"') else value
    return out


def _envs(base: str, kernels: dict[str, str] | None = None,
          engine: dict[str, Any] | None = None) -> dict[str, dict[str, str]]:
    """role -> env of every engine env file dsv4ctl renders for the profile."""
    data = yaml.safe_load((PROFILES / base).read_text())
    if kernels is not None:
        data["kernels"] = kernels
    if engine:
        data["topology"]["engine"].update(engine)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
        (Path(tmp) / "p.yaml").write_text(yaml.safe_dump(data))
        _, _, tree = render_path(Path(tmp) / "p.yaml")
    return {rel.removeprefix("env/").removesuffix(".env"): _env_file(f.content)
            for rel, f in tree.files.items() if rel.startswith("env/") and rel.endswith(".env")}


def _set_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*HOOK_VARS, *env):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


_REAL: dict[str, Any] = {}


def _attention_called(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """rows -> which kernel SGLang's sm_120 dispatcher ends in, for a decode call (1 row) and a
    prefill chunk (8,192 rows), in a process started with ``env``."""
    import torch
    from dsv4_kernels import sglang_compat, sglang_hook
    from sglang.srt.environ import envs

    _set_env(env, monkeypatch)
    triton_mod = importlib.import_module(TRITON_MODULE)
    # SGLang's own function, as a fresh engine process imports it (earlier calls replaced it)
    real = _REAL.setdefault("triton", triton_mod.flash_mla_sparse_decode_triton)
    monkeypatch.setattr(triton_mod, "flash_mla_sparse_decode_triton", real)
    if sglang_hook.ENV_VAR in env:
        sglang_hook.patch_module(triton_mod)
    fn = triton_mod.flash_mla_sparse_decode_triton
    label = "bundled" if fn is sglang_compat.flash_mla_sparse_decode_triton else "sglang-triton"

    def recorder(*args: Any) -> tuple[str, None]:
        return label, None

    monkeypatch.setattr(triton_mod, "flash_mla_sparse_decode_triton", recorder)
    ns = sglang_compat.load_sglang_functions(
        sglang_root() / FLASH_MLA, ["_sm120_default_backend", "SM120_DECODE_MAX_TOKENS",
                                    "flash_mla_with_kvcache_sm120"], extra_globals={
            "envs": envs,
            "_flash_mla_flashinfer": lambda *a: ("flashinfer-decode", None),
            "_flash_mla_sm120_prefill": lambda *a: ("flashinfer-prefill", None),
            "_sm120_sparse_decode_fwd": lambda *a: ("torch", None)})
    out = {}
    for rows in (1, 8192):
        q = torch.empty((rows, 1, 64, 512), device="meta")
        out[rows] = ns["flash_mla_with_kvcache_sm120"](
            q=q, k_cache=q, indices=q, head_dim_v=512, softmax_scale=0.04)[0]
    return out


def _mhc_called(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    from dsv4_kernels import sglang_compat, sglang_hook, sglang_mhc

    _set_env(env, monkeypatch)
    mod = types.ModuleType(MHC_MODULE)
    vars(mod).update(sglang_compat.load_sglang_functions(sglang_root() / MHC,
                                                         ["mhc_fused_post_pre"]))
    if sglang_hook.ENV_VAR in env:
        sglang_hook.patch_module(mod)
    return "bundled" if mod.mhc_fused_post_pre is sglang_mhc.mhc_fused_post_pre else "sglang"


def test_default_profile_reaches_flashinfer_and_the_bundled_mhc(monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    envs = _envs("default.yaml")
    assert set(envs) == {"prefill", "decode"}
    for role, env in envs.items():
        assert _attention_called(env, monkeypatch) == {1: "flashinfer-decode",
                                                       8192: "flashinfer-prefill"}, role
        assert _mhc_called(env, monkeypatch) == "bundled", role


def test_tp8_without_attention_dp_reaches_the_bundled_attention(monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    # FlashInfer's 8-head prefill limit: every call, decode and prefill, goes to the bundled one
    (env,) = _envs("mxfp4-tp8.yaml", engine={"attn_dp": 1}).values()
    assert _attention_called(env, monkeypatch) == {1: "bundled", 8192: "bundled"}
    (env,) = _envs("mxfp4-tp8.yaml").values()  # attn_dp 8: 64 heads per rank, FlashInfer serves
    assert _attention_called(env, monkeypatch) == {1: "flashinfer-decode", 8192: "flashinfer-prefill"}


def test_bundled_paths_are_reached_only_where_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    off = {"attention": "engine", "indexer": "engine", "mhc_pre": "engine"}
    for env in _envs("default.yaml", off).values():
        assert _attention_called(env, monkeypatch)[8192] == "flashinfer-prefill"
        assert _mhc_called(env, monkeypatch) == "sglang"
    only_attention = {"attention": "bundled", "indexer": "engine", "mhc_pre": "engine"}
    for env in _envs("default.yaml", only_attention).values():
        assert _attention_called(env, monkeypatch) == {1: "bundled", 8192: "bundled"}
        assert _mhc_called(env, monkeypatch) == "sglang"


def test_sglangs_own_triton_backend_is_not_the_bundled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # the recorder tells the two apart: the Triton backend without the hook is SGLang's kernel
    env = {"SGLANG_SM120_FLASHMLA_BACKEND": "triton"}
    assert _attention_called(env, monkeypatch) == {1: "sglang-triton", 8192: "sglang-triton"}
    assert TRITON_MODULE in sys.modules
