"""CI proof that ``orchestrator/planner/headroom.py`` computes its terms as SGLang 0.5.23 does.

Owns the cross-check behind every headroom term that sglang's own code sizes: the indexer's
logits workspace (row chunking on the paged DeepGEMM path, the SM120 row cap, the memory budget),
the sm_120 torch path's allocator peak (the real function run on CPU tensors under a dispatch mode
that counts live bytes), the default chunk and decode graph batch for the card, the captured batch
sizes, the CUDA-graph reserve and the activation constant, and the custom all-reduce switch. The
reference is sglang's installed code: modules that import on a CPU are imported
(``mqa_logits_utils``, ``dsv4/metadata``); the others are extracted with ``ast`` by the KV-pool
oracle's :func:`extract` and run with stubs for the runtime context only (never for a size).

Terms that no sglang code sizes (CUDA context, NCCL buffers, the per-token activations) are
estimates; the tests here pin what sglang fixes around them (the 512 MiB constant, the token count).
"""

from __future__ import annotations

import builtins
import copy
import logging
import types
import weakref
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from orchestrator.planner import headroom as H
from tests.parsers_real.sglang_pool_oracle import extract, sglang_root

MIB = 1 << 20
RTX_PRO_6000 = 97_887 * MIB


def _ns(**extra: Any) -> dict[str, Any]:
    return {"__builtins__": builtins, "logger": logging.getLogger("sglang-stub"), **extra}


# --- the indexer's logits (DeepGEMM paged / non-paged) ---------------------------------------------


def test_indexer_row_chunks_equal_sglang_plan_indexer_row_chunks() -> None:
    from sglang.srt.layers.attention import mqa_logits_utils as mq
    from sglang.srt.layers.attention.dsv4 import metadata as md

    assert md._SM120_INDEXER_M_CHUNK == H.SM120_INDEXER_ROW_CAP
    assert mq.MQA_LOGITS_ROW_ALIGN_ELEMS == H.MQA_ROW_ALIGN
    assert mq.MQA_LOGITS_STATIC_SKIP_ELEMS == H.MQA_STATIC_SKIP_ELEMS
    assert mq.MQA_LOGITS_TOTAL_MEM_FRACTION == H.MQA_TOTAL_MEM_FRACTION
    seen = set()
    for rows in (1, 64, 1000, 4096, 4097, 8192, 16384, 32768):
        for ctx in (4096, 65536, 131072, 550_000, 780_000, 1_048_576):
            cols = H.compressed_cols(ctx)
            for budget in (None, 1, 64 * MIB, 700 * MIB, 2 << 30, 3_000_000_000, 40 << 30):
                for sm120 in (False, True):
                    real = md.plan_indexer_row_chunks(
                        num_rows=rows, num_cols=cols, budget_bytes=budget,
                        sm120_row_cap=md._SM120_INDEXER_M_CHUNK if sm120 else None)
                    ours = H.indexer_rows_per_chunk(rows, cols, budget, sm120)
                    assert ours == (rows if real is None else min(real, rows)), (
                        rows, cols, budget, sm120)
                    largest = max(s.stop - s.start for s in md.iter_row_chunks(
                        num_rows=rows, rows_per_chunk=real))
                    assert ours == largest
                    seen.add(real is None)
                assert H.mqa_row_bytes(cols) == mq.mqa_logits_row_bytes(cols)
    assert seen == {True, False}  # both chunked and whole batches were compared


def test_logits_budget_equals_sglang_mqa_logits_budget_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.layers.attention import mqa_logits_utils as mq

    for mfs in (0.80, 0.85, 0.90, 0.93, 0.95):
        for free in (0, 1 << 30, 6 << 30, 14 << 30, 60 << 30):
            props = types.SimpleNamespace(total_memory=RTX_PRO_6000)
            monkeypatch.setattr(mq, "get_device_module", lambda p=props: types.SimpleNamespace(
                get_device_properties=lambda _i: p))
            monkeypatch.setattr(mq, "get_schedule",
                                lambda m=mfs: types.SimpleNamespace(mem_fraction_static=m))
            monkeypatch.setattr(mq, "is_hip", lambda: False)
            monkeypatch.setattr(mq, "is_xpu", lambda: False)
            monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _i, f=free: (f, RTX_PRO_6000))
            real = mq.mqa_logits_budget_bytes(device_index=0, allow_sync=True)
            assert mq.mqa_logits_static_budget_bytes(device_index=0) == \
                H.mqa_static_budget(RTX_PRO_6000, mfs)
            ours = min(H.mqa_static_budget(RTX_PRO_6000, mfs),
                       max(1, int(free * H.MQA_FREE_MEM_FRACTION)))
            assert ours == real, (mfs, free)


def test_env_defaults_the_indexer_term_assumes() -> None:
    from sglang.srt.environ import envs

    assert envs.SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION.get() == H.MQA_FREE_MEM_FRACTION
    assert envs.SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS.get() == \
        H.NONPAGED_MIN_QUERY_TOKENS
    assert envs.SGLANG_OPT_DSV4_NONPAGED_INDEXER.get() is True
    assert envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.get() is False  # DeepGEMM is the default


# --- the sm_120 torch path, run on CPU ------------------------------------------------------------


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of storages allocated inside the mode that are still referenced."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.seen: dict[int, weakref.ref[torch.Tensor]] = {}  # id -> the tensor counted
        self.cur = self.peak = 0

    def _drop(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.cur -= self.size.pop(key)
            del self.refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or (
                    id(t) in self.seen and self.seen[id(t)]() is t):
                continue
            key = t.untyped_storage().data_ptr()
            if key not in self.refs:
                if key in {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0]
                           if isinstance(a, torch.Tensor)}:
                    continue  # a view of an input allocated outside the mode
                self.refs[key] = 0
                self.size[key] = t.untyped_storage().nbytes()
                self.cur += self.size[key]
                self.peak = max(self.peak, self.cur)
            self.refs[key] += 1
            self.seen[id(t)] = weakref.ref(t)
            weakref.finalize(t, self._drop, key)
        return out


def _run_torch_sm120(rows: int, pages: int, heads: int) -> tuple[int, int]:
    path = sglang_root() / "srt/layers/attention/dsv4/indexer.py"
    ns = _ns(torch=torch, F=torch.nn.functional, FP8_DTYPE=torch.float8_e4m3fn, Any=Any)
    exec(extract(path, ["fp8_paged_mqa_logits_torch_sm120"]), ns)
    fn = ns["fp8_paged_mqa_logits_torch_sm120"]
    g = torch.Generator().manual_seed(1)
    kv = torch.randint(0, 60, (pages, 64, 1, 132), dtype=torch.uint8, generator=g)
    q = torch.randn(rows, 1, heads, 128, generator=g).to(torch.float8_e4m3fn)
    w = torch.rand(rows, heads, generator=g)
    seq = torch.full((rows,), pages * 64, dtype=torch.int32)
    table = torch.arange(pages, dtype=torch.int32).repeat(rows, 1)
    with _LiveBytes() as m:
        out = fn(q, kv, w, seq, table, None, pages * 64, clean_logits=False)
    assert out.shape == (rows, pages * 64) and out.dtype == torch.float32
    return m.peak, out.numel() * 4


@pytest.mark.parametrize(("rows", "pages", "heads"), [
    (16, 4, 8), (16, 12, 64), (7, 3, 32), (1040, 2, 8), (1100, 1, 64), (2100, 1, 16)])
def test_torch_sm120_peak_equals_the_real_functions_peak(rows: int, pages: int, heads: int) -> None:
    peak, _ = _run_torch_sm120(rows, pages, heads)
    assert H.torch_sm120_peak_bytes(rows, pages * 64, heads) == peak


def test_torch_sm120_slices_by_1024_rows_and_keeps_every_output() -> None:
    path = sglang_root() / "srt/layers/attention/dsv4/indexer.py"
    text = path.read_text()
    assert f"_QUERY_CHUNK = {H.TORCH_SM120_QUERY_CHUNK}" in text
    assert "torch.cat(" in text  # the slices' outputs are concatenated, all alive at once


# --- defaults, captured batches, the graph reserve, the activation constant -----------------------


def _memory_hook_ns(gpu_mib: float, args: types.SimpleNamespace) -> dict[str, Any]:
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase

    root = sglang_root()
    graph_ns = _ns(resolving_view=lambda s: s)
    exec(extract(root / "srt/arg_groups/cuda_graph_hook.py",
                 ["generate_prefill_cuda_graph_batch_sizes",
                  "generate_decode_cuda_graph_batch_sizes"]), graph_ns)
    qwen = types.ModuleType("sglang.srt.arg_groups.model_overrides.qwen3_vl")
    qwen.expand_multimodal_decode_graph_to_running_limit = lambda *_a: None  # multimodal only
    hook_mod = types.ModuleType("sglang.srt.arg_groups.cuda_graph_hook")
    hook_mod.generate_decode_cuda_graph_batch_sizes = graph_ns[
        "generate_decode_cuda_graph_batch_sizes"]
    hook_mod.generate_prefill_cuda_graph_batch_sizes = graph_ns[
        "generate_prefill_cuda_graph_batch_sizes"]
    hook_mod.generate_cpu_graph_batch_sizes = None
    stubs = {qwen.__name__: qwen, hook_mod.__name__: hook_mod}
    real_import = builtins.__import__

    def imp(name: str, *a: Any, **k: Any) -> Any:
        if name in stubs:
            return stubs[name]
        return real_import(name, *a, **k)

    def declare(server_args: Any, _src: str, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(server_args, k, v)

    ns = dict(_ns(
        copy=copy, Backend=Backend, Phase=Phase, resolving_view=lambda s: s,
        resolved_view=lambda s: s, declare_resolution=declare,
        get_device_memory_capacity=lambda *_a: gpu_mib,
        model_config_of=lambda _s: types.SimpleNamespace(is_multimodal=False),
        post_capture_kv_sizing_planned=lambda _s: False,
        # DeepSeek-V4 is AttentionArch.MHA in sglang 0.5.23 (test below)
        use_mla_backend=lambda _s: False,
        attn_dp_enabled_of=lambda c: c.attn_dp_size > 1,
        get_platform=lambda: types.SimpleNamespace(is_xpu=False),
        envs=types.SimpleNamespace(SGLANG_SYMM_MEM_PREALLOC_GB_SIZE=None),
        _DEFAULT_PP_PREFILL_CUDA_GRAPH_MAX_TOKENS=8192, Any=Any))
    ns["__builtins__"] = dict(vars(builtins), __import__=imp)
    exec(extract(root / "srt/arg_groups/memory_hook.py",
                 ["handle_gpu_memory_settings", "reserve_for_graph_mb",
                  "reserve_for_deepep_a2a_mb"]), ns)
    return ns


def _server_args(**kw: Any) -> types.SimpleNamespace:
    from sglang.srt.model_executor.cuda_graph_config import Backend, PhaseConfig

    cfg = types.SimpleNamespace(decode=PhaseConfig(backend=Backend.FULL),
                                prefill=PhaseConfig(backend=Backend.BREAKABLE))
    base = dict(cuda_graph_config=cfg, chunked_prefill_size=None, max_running_requests=None,
                tp_size=4, pp_size=1, attn_dp_size=1, disaggregation_mode="null",
                mem_fraction_static=0.85, device="cuda", disable_cuda_graph_padding=False,
                speculative_algorithm=None, speculative_num_draft_tokens=None,
                model_path="/models/DeepSeek-V4-Flash", max_total_tokens=None, pp_max_micro_batch_size=None,
                enable_symm_mem=False, moe_a2a_backend="none", language_only=False,
                language_model_only=False, max_prefill_tokens=16384,
                _cuda_graph_config_locked=set(), torch_compile_max_bs=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


CASES = [
    dict(tp_size=4, disaggregation_mode="prefill", chunked_prefill_size=8192),
    dict(tp_size=4, disaggregation_mode="decode", max_running_requests=64),
    dict(tp_size=2, disaggregation_mode="null"),
    dict(tp_size=8, attn_dp_size=8, disaggregation_mode="null", max_running_requests=64),
    dict(tp_size=8, attn_dp_size=8, disaggregation_mode="null", max_running_requests=512),
    dict(tp_size=4, disaggregation_mode="null", chunked_prefill_size=4096,
         speculative_algorithm="EAGLE", max_running_requests=48),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_defaults_capture_sizes_and_graph_reserve_equal_sglang(case: dict[str, Any]) -> None:
    for gpu_mib in (97_887, 81_559, 24_000, 183_000):
        args = _server_args(**case)
        ns = _memory_hook_ns(gpu_mib, args)
        ns["handle_gpu_memory_settings"](args)
        x = H.HeadroomInputs(
            gpu_total_bytes=gpu_mib * MIB, mem_fraction_static=0.85, tp=case["tp_size"],
            attn_dp=case.get("attn_dp_size", 1),
            disaggregation_mode=case["disaggregation_mode"],
            chunked_prefill_size=case.get("chunked_prefill_size"),
            max_running_requests=case.get("max_running_requests"),
            speculative=case.get("speculative_algorithm") is not None)
        model = H.build(x)
        assert model.chunked_prefill_size == args.chunked_prefill_size
        assert model.cuda_graph_max_bs == args.cuda_graph_config.decode.max_bs
        assert H.decode_capture_bs(model.cuda_graph_max_bs, x.speculative) == \
            args.cuda_graph_config.decode.bs
        assert H.prefill_capture_bs(model.chunked_prefill_size) == \
            args.cuda_graph_config.prefill.bs
        graphs = next(t for t in model.terms if t.id == "cuda_graphs")
        assert graphs.bytes == int(ns["reserve_for_graph_mb"](args) * MIB)


def test_activation_constant_is_sglangs_reserve_floor() -> None:
    """With mem_fraction_static unset, sglang reserves 512 MiB + tokens x 1.5 MiB + tp/8 GiB +
    the graph reserve (>= 10 GiB on big cards); the 512 MiB constant is the part the planner
    takes over, the per-token part it replaces by the V4 estimate."""
    args = _server_args(tp_size=4, disaggregation_mode="prefill", chunked_prefill_size=8192,
                        mem_fraction_static=None)
    ns = _memory_hook_ns(20_000, args)  # a small card: no 10 GiB floor
    ns["handle_gpu_memory_settings"](args)
    reserved = 512 + 8192 * 1.5 + 4 / 8 * 1024 + ns["reserve_for_graph_mb"](args)
    assert args.mem_fraction_static == round((20_000 - reserved) / 20_000, 3)
    assert H.ACTIVATION_CONSTANT_BYTES == 512 * MIB


def test_deepseek_v4_is_not_an_mla_arch_in_sglang() -> None:
    """reserve_for_graph_mb prices prefill graphs at 8 MiB each for non-MLA archs; sglang 0.5.23
    sets AttentionArch.MHA for the V4 architectures (configs/model_config.py)."""
    text = (sglang_root() / "srt/configs/model_config.py").read_text()
    at = text.index('"DeepseekV4ForCausalLMDSpark" in self.hf_config.architectures\n        ):')
    block = text[at:text.index("elif", at)]
    assert "self.attention_arch = AttentionArch.MHA" in block


def test_custom_allreduce_switch_is_sglangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``can_use_custom_all_reduce_with_nvlink`` decides on/off; the buffer sizes are
    ``CustomAllreduce``'s (three of ``_MAX_CAR_SIZE``: meta + buffer + rank_data)."""
    import sglang.srt.distributed.device_communicators.custom_all_reduce_utils as u

    src = (sglang_root() / "srt/distributed/device_communicators/custom_all_reduce.py").read_text()
    assert "_MAX_CAR_SIZE = 8192 * 1024" in src and "_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]" in src
    assert src.count("max_size, dtype=torch.uint8, device=self.device") >= 1
    assert "self.create_shared_buffer(max_size, group=group)" in src
    assert "ops.meta_size() + max_size, group=group" in src
    for world, nvlink in ((1, False), (2, False), (3, True), (4, False), (4, True), (8, False),
                          (8, True)):
        def gather(out: list[Any], t: Any, group: Any = None) -> None:
            for i, o in enumerate(out):
                o[0] = i

        monkeypatch.setattr(u, "dist", types.SimpleNamespace(
            get_backend=lambda _g: "gloo", get_rank=lambda group=None: 0,
            get_world_size=lambda group=None, w=world: w, all_gather=gather,
            Backend=types.SimpleNamespace(NCCL="nccl")))
        monkeypatch.setattr(u, "in_the_same_node_as", lambda g, source_rank=0, w=world: [True] * w)
        monkeypatch.setattr(u, "is_full_nvlink", lambda ids, w, nv=nvlink: nv)
        monkeypatch.setattr(u, "can_p2p", lambda r, w: True)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(world))))
        real = u.can_use_custom_all_reduce_with_nvlink(
            group=None, device=torch.device("cuda", 0), supported_world_size=[2, 4, 6, 8],
            cls_name="CustomAllreduce")
        m = H.build(H.HeadroomInputs(gpu_total_bytes=RTX_PRO_6000, mem_fraction_static=0.85,
                                     tp=world, full_nvlink=nvlink))
        car = next(t for t in m.terms if t.id == "custom_allreduce")
        assert car.bytes == (0 if real is None else 3 * H.CUSTOM_AR_MAX_SIZE), (world, nvlink)


def test_torch_env_disables_deepgemm_row_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    """With SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 (sglang's sm_120 default) the real
    PagedIndexerMetadata builds no DeepGEMM schedule and never chunks: TileLang scores all rows of
    an 8K chunk against a 1M context in one fp32 [rows, keys] piece."""
    from sglang.srt.layers.attention.dsv4.metadata import PagedIndexerMetadata

    monkeypatch.setenv("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "1")
    rows, pages = 8192, 4096
    meta = PagedIndexerMetadata(
        page_size=256, compressed_page_size=64,
        page_table=torch.zeros(rows, pages, dtype=torch.int32),
        compressed_seq_lens=torch.full((rows,), pages * 64, dtype=torch.int32),
        use_topk_v2=False, force_deep_gemm_metadata=False, use_prefill_cuda_graph=False,
        compress_ratio=4)
    assert meta.deep_gemm_metadata is None and meta.rows_per_chunk is None
    assert meta.max_compressed_seq_len == H.compressed_cols(1_048_576)
    tl = (sglang_root() / "kernels/ops/attention/dsa/tilelang_kernel.py").read_text()
    assert "logits = page_table.new_empty((batch_size, max_seq_len), dtype=torch.float32)" in tl
    m = H.build(H.HeadroomInputs(gpu_total_bytes=RTX_PRO_6000, mem_fraction_static=0.85, tp=4,
                                 disaggregation_mode="prefill", chunked_prefill_size=rows,
                                 longest_request_tokens=1_048_576, indexer_path="tilelang",
                                 torch_mqa_env=True))
    assert next(t for t in m.terms if t.id == "indexer_logits").bytes == \
        rows * meta.max_compressed_seq_len * 4


def test_sm120_hook_selects_tilelang_and_the_torch_env_by_default() -> None:
    text = (sglang_root() / "srt/arg_groups/model_hook.py").read_text()
    at = text.index("if get_platform().is_sm120:")
    block = text[at:text.index("elif get_platform().is_hip:", at)]
    for var in ("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "SGLANG_OPT_USE_TILELANG_INDEXER"):
        assert f"if not envs.{var}.is_set():\n                envs.{var}.set(True)" in block
    ind = (sglang_root() / "srt/layers/attention/dsv4/indexer.py").read_text()
    order = [ind.index(s) for s in ("elif envs.SGLANG_OPT_USE_TILELANG_INDEXER.get():",
                                    "elif envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.get():",
                                    "from deep_gemm import fp8_paged_mqa_logits as fn")]
    assert order == sorted(order)  # TileLang wins over the torch function, DeepGEMM comes last
