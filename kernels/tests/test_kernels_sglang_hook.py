"""Activation in the real SGLang 0.5.23 package: signatures, equal outputs, the .pth hook.

SGLang is installed in the test venv without its CUDA dependencies (requirements/parsers.txt),
so ``flash_mla_sm120_triton`` imports for real, while ``dsv4.indexer`` (which needs GPU-only
packages at import) is read from the installed file and only its fallback function compiled.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from dsv4_kernels import sglang_compat, sglang_hook
from dsv4_kernels.cases import make_decode_case, make_indexer_case

SGLANG_ROOT = pathlib.Path(importlib.util.find_spec("sglang").origin).parent  # type: ignore[union-attr]
INDEXER_FILE = SGLANG_ROOT / "srt/layers/attention/dsv4/indexer.py"


def test_installed_sglang_is_the_pinned_version() -> None:
    assert sglang_hook.sglang_version() == sglang_hook.SUPPORTED_VERSION


def _real_decode_module():
    import sglang.kernels.ops.attention.flash_mla_sm120_triton as mod

    return mod


def _real_logits_fn():
    return sglang_compat.load_sglang_functions(
        INDEXER_FILE, ["fp8_paged_mqa_logits_torch_sm120"])["fp8_paged_mqa_logits_torch_sm120"]


def test_signatures_match_the_pinned_entry_points() -> None:
    real_decode = _real_decode_module().flash_mla_sparse_decode_triton
    assert tuple(inspect.signature(real_decode).parameters) == sglang_compat.DECODE_PARAMS
    assert tuple(inspect.signature(sglang_compat.flash_mla_sparse_decode_triton).parameters) == \
        sglang_compat.DECODE_PARAMS
    assert tuple(inspect.signature(_real_logits_fn()).parameters) == sglang_compat.LOGITS_PARAMS
    assert tuple(inspect.signature(sglang_compat.fp8_paged_mqa_logits_sm120).parameters) == \
        sglang_compat.LOGITS_PARAMS


class _OneConfig:
    """Runs SGLang's autotuned kernel with one of its own configs (autotuning needs a GPU)."""

    def __init__(self, fn: object) -> None:
        self.fn = fn

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *a, **k: self.fn[grid](*a, BLOCK_T=16, **k)  # type: ignore[index]


def test_decode_equals_sglang_triton_path(gen: torch.Generator,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _real_decode_module()
    monkeypatch.setattr(mod, "_tiled_sparse_decode_kernel",
                        _OneConfig(mod._tiled_sparse_decode_kernel.fn))
    c = make_decode_case(gen, batch=2, heads=4, topk=16, extra_topk=24, page_size=7,
                         extra_page_size=5, lengths="random", invalid_frac=0.1)
    c.topk_length[0] = max(int(c.topk_length[0]), 1)  # keep a key so both LSEs are finite
    args = (c.q, c.k_cache, c.indices, c.topk_length, c.attn_sink, 512, c.sm_scale,
            c.extra_k_cache, c.extra_indices, c.extra_topk_length)
    theirs = mod.flash_mla_sparse_decode_triton(*args)
    ours = sglang_compat.flash_mla_sparse_decode_triton(*args)
    assert ours[0].shape == theirs[0].shape and ours[1].shape == theirs[1].shape
    assert torch.allclose(ours[0].float(), theirs[0].float(), atol=1e-2, rtol=2 / 128)
    # SGLang's LSE includes the sink; ours (FlashMLA's convention) does not
    has = torch.isfinite(ours[1])
    assert c.attn_sink is not None
    theirs_lse = theirs[1].float()
    want = torch.logaddexp(ours[1], c.attn_sink.view(1, -1, 1).expand_as(ours[1]))
    assert torch.allclose(theirs_lse[has], want[has], atol=1e-3)


def test_logits_equal_sglang_torch_path(gen: torch.Generator) -> None:
    c = make_indexer_case(gen, batch=3, heads=16, lens=[0, 70, 190], max_len=200, page_size=64)
    args = (c.q_fp8.unsqueeze(1), c.index_cache, c.weights, c.seq_lens, c.page_table, None, 200)
    theirs = _real_logits_fn()(*args, clean_logits=False)
    ours = sglang_compat.fp8_paged_mqa_logits_sm120(*args, clean_logits=True)
    assert ours.shape == theirs.shape == (3, 200)
    fin = torch.isfinite(theirs)
    assert torch.equal(fin, torch.isfinite(ours))
    # SGLang rounds the dot products to bf16; ours accumulate in fp32
    assert float((ours[fin] - theirs[fin]).norm() / theirs[fin].norm()) < 1e-2
    # what the caller asks for (clean_logits=False): the same values up to each length
    lazy = sglang_compat.fp8_paged_mqa_logits_sm120(*args, clean_logits=False)
    for r, n in enumerate([0, 70, 190]):
        assert torch.equal(lazy[r, :n], ours[r, :n])


def test_logits_tail_is_left_to_the_consumer(gen: torch.Generator,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24 (O(actual) through the hook): with ``clean_logits=False`` nothing past a row's
    length is written, and SGLang 0.5.23's consumers of those logits on sm_120 never read it.
    A poisoned tail (NaN, +inf) must not change the torch top-k backend's selection; the CUDA
    one (topk_v1.cuh, the sm_120 default) is pinned by its source: it reads [0, seq_len)."""
    from dsv4_kernels import indexer

    real = indexer.indexer_logits

    def poisoned(*a: object, **kw: object) -> torch.Tensor:
        rows, max_len = a[0].shape[0], a[5]  # type: ignore[attr-defined]
        out = torch.full((rows, max_len), float("nan"))  # type: ignore[arg-type]
        out[:, 1::3] = float("inf")
        assert kw.get("clean") is False
        return real(*a, out=out, **kw)  # type: ignore[arg-type]

    lens = [0, 30, 600, 1000]
    c = make_indexer_case(gen, batch=4, heads=16, lens=lens, max_len=1100, page_size=64)
    args = (c.q_fp8.unsqueeze(1), c.index_cache, c.weights, c.seq_lens, c.page_table, None,
            1100)
    clean = sglang_compat.fp8_paged_mqa_logits_sm120(*args, clean_logits=True)
    monkeypatch.setattr(sglang_compat, "indexer_logits", poisoned)
    lazy = sglang_compat.fp8_paged_mqa_logits_sm120(*args, clean_logits=False)
    for r, n in enumerate(lens):  # the poison past each length is left as it was
        assert not torch.isfinite(lazy[r, n:]).any() and torch.isfinite(lazy[r, :n]).all()
    fns = sglang_compat.load_sglang_functions(
        INDEXER_FILE, ["_arange_cache", "_topk_transform_vectorized",
                       "topk_transform_pytorch_vectorized"])
    picks = []
    for logits in (clean, lazy):
        slots = torch.empty(4, 512, dtype=torch.int32)
        raw = torch.empty(4, 512, dtype=torch.int32)
        fns["topk_transform_pytorch_vectorized"](logits, c.seq_lens, c.page_table.long(),
                                                 slots, 64, raw)
        picks.append([sorted(x for x in row.tolist() if x >= 0) for row in raw])
    assert picks[0] == picks[1]
    assert [len(p) for p in picks[1]] == [0, 30, 512, 512]
    # the sm_120 default consumer (sgl-kernel, SGLANG_OPT_USE_TOPK_V2=0): reads [0, seq_len)
    cuh = (SGLANG_ROOT / "kernels/jit/csrc/deepseek_v4/topk_v1.cuh").read_text()
    assert "radix_topk(score_ptr, s_topk_indices, seq_len, topk);" in cuh
    assert "if (const auto tx = threadIdx.x; tx < length) {" in cuh
    # and the 0.5.23 caller asks for no tail
    src = INDEXER_FILE.read_text()
    assert "indexer_metadata.max_compressed_seq_len,\n                    False,\n" in src


def _py(code: str, env_on: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != sglang_hook.ENV_VAR}
    if env_on:
        env[sglang_hook.ENV_VAR] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


PROBE = (
    "import sglang.kernels.ops.attention.flash_mla_sm120_triton as m; "
    "print(m.flash_mla_sparse_decode_triton.__module__)"
)


def test_pth_line_patches_only_when_enabled() -> None:
    on = _py(sglang_hook.PTH_LINE + PROBE, env_on=True)
    assert on.returncode == 0, on.stderr
    assert on.stdout.strip() == "dsv4_kernels.sglang_compat"
    # the engine's log names the kernels it runs (issue 20 item 6: dsv4ctl ships them per release)
    assert re.search(r"^\[dsv4_kernels\] active \(pid \d+\): kernels from "
                     + re.escape(sglang_hook.loaded_from()) + "$", on.stderr, re.M), on.stderr
    off = _py(sglang_hook.PTH_LINE + PROBE, env_on=False)
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "sglang.kernels.ops.attention.flash_mla_sm120_triton"


def test_activation_after_import_patches_loaded_module() -> None:
    code = PROBE.split(";")[0] + "; import dsv4_kernels.sglang_hook as h; h.activate(); " + \
        "print(m.flash_mla_sparse_decode_triton.__module__)"
    res = _py(code, env_on=True)
    assert res.stdout.strip() == "dsv4_kernels.sglang_compat", res.stderr


def test_other_sglang_version_is_refused() -> None:
    code = ("import dsv4_kernels.sglang_hook as h; h.sglang_version = lambda: '0.5.22'; "
            "print(h.activate()); " + PROBE)
    res = _py(code, env_on=True)
    assert res.stdout.split() == ["False", "sglang.kernels.ops.attention.flash_mla_sm120_triton"]
    assert "pinned" in res.stderr and "0.5.22" in res.stderr


def test_changed_signature_is_not_patched() -> None:
    import types

    mod = types.ModuleType("sglang.kernels.ops.attention.flash_mla_sm120_triton")

    def flash_mla_sparse_decode_triton(q, k_cache, indices):  # a different, future signature
        return q

    mod.flash_mla_sparse_decode_triton = flash_mla_sparse_decode_triton  # type: ignore[attr-defined]
    assert sglang_hook.patch_module(mod) == []
    assert mod.flash_mla_sparse_decode_triton is flash_mla_sparse_decode_triton


def test_install_and_uninstall_pth(tmp_path: pathlib.Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert sglang_hook.main(["install", "--site", str(tmp_path)]) == 0
    pth = tmp_path / sglang_hook.PTH_NAME
    assert pth.read_text() == sglang_hook.PTH_LINE
    assert sglang_hook.main(["uninstall", "--site", str(tmp_path)]) == 0
    assert not pth.exists()
    capsys.readouterr()


DSV4_MODEL_FILE = SGLANG_ROOT / "srt/models/deepseek_v4.py"


def _sglang_method(path: pathlib.Path, cls: str, name: str, globs: dict) -> object:
    """One method of an SGLang class, compiled from the installed source (the model module
    itself needs transformers and CUDA-only packages at import)."""
    import ast

    tree = ast.parse(path.read_text())
    node = next(m for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
                for m in c.body if isinstance(m, ast.FunctionDef) and m.name == name)
    ns = dict(globs)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), ns)
    return ns[name]


def _dsv4_heads_methods(monkeypatch: pytest.MonkeyPatch):
    """SGLang's own ``_kernel_num_heads`` and ``_local_attn_sink`` (DeepSeek-V4's attention), on
    an sm_120 platform with the Triton FlashMLA backend."""
    import types

    import sglang.kernels.ops.attention.flash_mla_sm120 as fm
    from sglang.srt.environ import envs

    monkeypatch.setenv("SGLANG_SM120_FLASHMLA_BACKEND", "triton")
    globs = {"get_platform": lambda: types.SimpleNamespace(is_sm120=True), "envs": envs,
             "SM120_DECODE_MAX_TOKENS": fm.SM120_DECODE_MAX_TOKENS, "Optional": object,
             "torch": torch}
    cls = "MqaAttentionBase"  # DeepSeek-V4's attention (MQALayer) in 0.5.23
    return (_sglang_method(DSV4_MODEL_FILE, cls, "_kernel_num_heads", globs),
            _sglang_method(DSV4_MODEL_FILE, cls, "_local_attn_sink", globs))


def test_padding_rule_mirrors_sglangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``padded_real_heads`` answers exactly where SGLang's ``_kernel_num_heads`` pads."""
    import types

    kernel_num_heads, _ = _dsv4_heads_methods(monkeypatch)
    for n_heads in (64, 128):
        for tp in (1, 2, 4, 8, 16):
            local = n_heads // tp
            me = types.SimpleNamespace(attn_tp_size=tp, n_local_heads=local, n_heads=n_heads)
            for tokens in (1, 8, 64, 65, 2048):
                width = kernel_num_heads(me, tokens)
                want = local if width != local else None
                assert sglang_compat.padded_real_heads(width, tokens, n_heads, tp) == want, \
                    (n_heads, tp, tokens, width)


def test_sglang_call_site_with_8_of_64_real_heads(gen: torch.Generator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's decode call site at TP8 without attention-DP: its own padding rule widens the
    query to 64 heads (the padding is ``new_empty`` garbage: NaN here), its own sink helper pads
    the sink, its sm_120 dispatcher (``flash_mla_with_kvcache_sm120``, Triton backend) reaches
    the hooked entry point, and its consumer keeps ``o[:, :8]``. The hooked kernel computes the
    8 real heads only (seen at the launch), they match the float32 reference, and the padded
    heads come back as heads without keys (0, LSE +inf), never as NaN."""
    import types

    import sglang.kernels.ops.attention.flash_mla_sm120 as fm
    from sglang.srt.runtime_context import get_parallel

    from dsv4_kernels import sparse_decode
    from dsv4_kernels.reference import ref_sparse_decode

    kernel_num_heads, local_attn_sink = _dsv4_heads_methods(monkeypatch)
    real, n_heads, tp, tokens = 8, 64, 8, 3
    c = make_decode_case(gen, batch=tokens, heads=n_heads, topk=64, extra_topk=64,
                         page_size=64, extra_page_size=64, lengths="random", invalid_frac=0.1)
    me = types.SimpleNamespace(attn_tp_size=tp, attn_tp_rank=2, n_local_heads=real,
                               n_heads=n_heads, attn_sink=c.attn_sink, _attn_sink_local=None)
    width = kernel_num_heads(me, tokens)
    assert width == 64  # SGLang pads this call
    q_real = c.q[:, 0, :real]
    q_padded = torch.full((tokens, width, 512), float("nan"), dtype=torch.bfloat16)
    q_padded[:, :real] = q_real  # what _forward_prepare writes through q_out = q_padded[:, :8]
    sink = local_attn_sink(me, width)
    assert sink.shape == (width,)

    mod = _real_decode_module()
    monkeypatch.setattr(mod, "flash_mla_sparse_decode_triton", mod.flash_mla_sparse_decode_triton)
    assert [p.rsplit(".", 1)[-1] for p in sglang_hook.patch_module(mod)] == [
        "flash_mla_sparse_decode_triton"]
    monkeypatch.setattr(fm, "_sm120_default_backend", "triton")
    monkeypatch.setattr(sglang_compat, "_model_heads", lambda: n_heads)  # the checkpoint's
    seen: list[int | None] = []
    launch = sparse_decode._Launch.rows

    def spy(self, *a, **k):
        seen.append(self.h)
        return launch(self, *a, **k)

    monkeypatch.setattr(sparse_decode._Launch, "rows", spy)
    with get_parallel().override(attn_tp_size=tp):
        o = fm.flash_mla_with_kvcache_sm120(
            q=q_padded.unsqueeze(1), k_cache=c.k_cache, head_dim_v=512,
            softmax_scale=c.sm_scale, indices=c.indices, topk_length=c.topk_length,
            attn_sink=sink, extra_k_cache=c.extra_k_cache,
            extra_indices_in_kvcache=c.extra_indices, extra_topk_length=c.extra_topk_length)[0]
    o = o.squeeze(1)
    assert seen == [real], "the kernel computed the padded heads too"
    assert o.shape == (tokens, width, 512)
    ref, _ = ref_sparse_decode(q_real.unsqueeze(1), c.k_cache, c.indices, c.topk_length,
                               c.sm_scale, sink[:real], c.extra_k_cache, c.extra_indices,
                               c.extra_topk_length)
    kept = o[:, slice(0, me.n_local_heads), :].float()  # the consumer's tp_slice
    assert not torch.isnan(kept).any()
    assert torch.all((kept - ref[:, 0]).abs() <= 4e-3 + (2 / 128) * ref[:, 0].abs())
    assert torch.equal(o[:, real:], torch.zeros_like(o[:, real:]))


def test_unknown_layout_computes_every_head(gen: torch.Generator,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside an engine (nothing published) the entry point computes every head, as before."""
    from dsv4_kernels import sparse_decode

    monkeypatch.setattr(sglang_compat, "_MODEL_HEADS", [])
    assert sglang_compat.real_heads(64, 4) is None
    seen: list[int] = []
    launch = sparse_decode._Launch.rows
    monkeypatch.setattr(sparse_decode._Launch, "rows",
                        lambda self, *a, **k: (seen.append(self.h), launch(self, *a, **k))[1])
    c = make_decode_case(gen, batch=2, heads=16, topk=16, page_size=16)
    sglang_compat.flash_mla_sparse_decode_triton(c.q, c.k_cache, c.indices, c.topk_length,
                                                 c.attn_sink, 512, c.sm_scale)
    assert seen == [16]
def test_only_the_ops_dsv4ctl_lists_are_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    # DSV4_KERNELS_OPS (rendered per role from its kernel paths): an op not listed keeps
    # SGLang's function, even with the hook active; unset, the pre-per-op behaviour
    monkeypatch.setenv(sglang_hook.OPS_ENV, "indexer,mhc_pre")
    res = _py(sglang_hook.PTH_LINE + PROBE, env_on=True)
    assert res.stdout.strip() == "sglang.kernels.ops.attention.flash_mla_sm120_triton", res.stderr
    assert "ops indexer,mhc_pre (from DSV4_KERNELS_OPS)" in res.stderr
    monkeypatch.setenv(sglang_hook.OPS_ENV, "attention")
    res = _py(sglang_hook.PTH_LINE + PROBE, env_on=True)
    assert res.stdout.strip() == "dsv4_kernels.sglang_compat", res.stderr
    monkeypatch.delenv(sglang_hook.OPS_ENV)
    monkeypatch.delenv(sglang_hook.BF16_GEMMS_ENV, raising=False)
    assert sglang_hook.active_ops() == {"attention", "indexer"}
    monkeypatch.setenv(sglang_hook.BF16_GEMMS_ENV, "1")
    assert sglang_hook.active_ops() == {"attention", "indexer", "mhc_pre"}
    monkeypatch.setenv(sglang_hook.OPS_ENV, "attention,typo")
    assert sglang_hook.active_ops() == {"attention"}


def test_engine_layout_states_the_layout_outside_the_engine(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Outside an engine nothing publishes the layout; ``engine_layout`` states it for the calls
    made inside it, through the same padding rule, and only there."""
    monkeypatch.setattr(sglang_compat, "_MODEL_HEADS", [])
    assert sglang_compat.real_heads(64, 4) is None
    with sglang_compat.engine_layout(64, 4):
        assert sglang_compat.real_heads(64, 4) == 16  # 16 real of the 64 SGLang pads to
        assert sglang_compat.real_heads(64, 65) is None  # prefill: native width
        assert sglang_compat.real_heads(16, 4) is None  # not a padded call
        with sglang_compat.engine_layout(64, 8):
            assert sglang_compat.real_heads(64, 4) == 8
        assert sglang_compat.real_heads(64, 4) == 16
    assert sglang_compat.real_heads(64, 4) is None
    with pytest.raises(ValueError, match="attn_tp_size >= 1"), \
            sglang_compat.engine_layout(64, 0):
        pass


def test_qualify_times_the_bundled_contender_as_the_engine_calls_it(
        gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The qualify runner gives each Triton-backend contender the query width SGLang's own
    ``_kernel_num_heads`` gives it, and the bundled contender, called with that padded query
    outside any engine, computes the rank's real heads only (seen at the launch), matching the
    float32 reference there; SGLang's own Triton contender gets the same padded call."""
    import types

    from dsv4_kernels import qualify, sparse_decode
    from dsv4_kernels.reference import ref_sparse_decode

    kernel_num_heads, _ = _dsv4_heads_methods(monkeypatch)
    for n_heads in (64, 128):
        for tp in (1, 2, 4, 8):
            local = n_heads // tp
            me = types.SimpleNamespace(attn_tp_size=tp, n_local_heads=local, n_heads=n_heads)
            for tokens in (1, 64, 65, 8192):
                for who in ("sglang-triton", "bundled"):
                    assert qualify._width(who, tokens, local, tp) == kernel_num_heads(me, tokens)

    monkeypatch.setattr(sglang_compat, "_MODEL_HEADS", [])  # outside an engine
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    shape = {"heads_per_attn_rank": 16, "attn_tp": 4, "index_topk": 64}
    contenders = qualify._attention_contenders(shape)
    fi, why = contenders["flashinfer"]
    assert fi is None and "sm_120a/120f only" in (why or "")
    width = qualify._width("bundled", 3, 16, 4)
    assert width == 64
    c = make_decode_case(gen, batch=3, heads=width, topk=64, extra_topk=64, page_size=64,
                         extra_page_size=64, lengths="random", invalid_frac=0.1)
    seen: list[int] = []
    launch = sparse_decode._Launch.rows
    monkeypatch.setattr(sparse_decode._Launch, "rows",
                        lambda self, *a, **k: (seen.append(self.h), launch(self, *a, **k))[1])
    o = contenders["bundled"][0](*qualify._args(c))[0].squeeze(1)
    assert seen == [16], "the bundled contender computed the padded heads too"
    ref, _ = ref_sparse_decode(**c.kwargs())
    kept, want = o[:, :16].float(), ref[:, 0, :16]
    assert torch.all((kept - want).abs() <= 4e-3 + (2 / 128) * want.abs())
    assert torch.equal(o[:, 16:], torch.zeros_like(o[:, 16:]))
    assert sglang_compat.real_heads(64, 3) is None  # the stated layout ends with the call
    assert qualify._width("flashinfer", 3, 16, 4) == 16  # FlashInfer takes 16 heads as they are
