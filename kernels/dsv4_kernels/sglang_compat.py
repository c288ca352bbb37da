"""Drop-in replacements for SGLang 0.5.23's sm_120 entry points, and a loader for its originals.

The activation hook (``sglang_hook``) swaps these in for

* ``sglang.kernels.ops.attention.flash_mla_sm120_triton.flash_mla_sparse_decode_triton``
  (the sm_120 Triton sparse-decode path, selected by ``SGLANG_SM120_FLASHMLA_BACKEND=triton``), and
* ``sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120`` (the sm_120
  paged MQA-logits path, selected by ``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1``).

They keep the originals' parameter lists and output shapes. Two deliberate differences, both
harmless to the 0.5.23 caller (``deepseek_v4_backend.py`` keeps only ``[0]``, the output):
the returned LSE is FlashMLA's sink-exclusive one (SGLang's Triton path returns a
sink-inclusive LSE, see research/kernels.md section 3.2), and rows without keys give LSE +inf.

Real heads only (:func:`real_heads`): with fewer than 64 heads per rank SGLang pads a decode
call's query to 64 heads (``deepseek_v4.py`` ``_kernel_num_heads`` and the ``q_padded`` it
fills with ``new_empty``: the padding holds whatever memory held) and its consumer reads only
``o[:, :n_local_heads]`` (``tp_slice``) after ``deepseek_v4_backend.py`` keeps ``[0]`` of the
result. The decode entry point computes only the rank's real heads and writes the padded ones
as a head without keys: output 0, LSE +inf. Outside the engine (``python -m
dsv4_kernels.qualify``, benchmarks) nothing publishes that layout; :func:`engine_layout` states
it for the calls made inside it, so they run exactly as the engine's would.

``load_sglang_functions`` pulls named top-level functions out of an SGLang source file with
``ast`` so the CPU test and the benchmark can run SGLang's own fallbacks without importing the
rest of the engine (its ``dsv4.indexer`` module needs GPU-only packages at import).
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import json
import pathlib
import sys
import typing
from typing import Any

import torch
import torch.nn.functional as F

from .indexer import indexer_logits
from .sparse_decode import sparse_mla_decode

# Parameter lists of the 0.5.23 entry points; the hook refuses to patch if they differ.
DECODE_PARAMS = (
    "q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v", "softmax_scale",
    "extra_k_cache", "extra_indices", "extra_topk_length",
)
LOGITS_PARAMS = (
    "q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table", "deep_gemm_metadata",
    "max_seq_len", "clean_logits",
)


def flash_mla_sparse_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    head_dim_v: int,
    softmax_scale: float,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang-compatible sparse decode: ``(out [T, 1, H, 512] bf16, lse [T, H, 1])``."""
    if head_dim_v != 512:
        raise ValueError(f"MODEL1 sparse decode has head_dim_v 512, got {head_dim_v}")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    t = q.shape[0]
    real = real_heads(q.shape[-2], t)
    idx = indices.reshape(t, 1, -1).to(torch.int32)
    ex = extra_indices.reshape(t, 1, -1).to(torch.int32) if extra_indices is not None else None
    return sparse_mla_decode(
        q.reshape(t, 1, q.shape[-2], q.shape[-1]), k_cache.view(torch.uint8), idx,
        _i32(topk_length), float(softmax_scale),
        attn_sink.float() if attn_sink is not None else None,
        extra_k_cache.view(torch.uint8) if extra_k_cache is not None else None, ex,
        _i32(extra_topk_length), real_heads=real,
    )


# SGLang 0.5.23's constants for the padding (``flash_mla_sm120.SM120_DECODE_MAX_TOKENS``: calls
# above it are prefill and get the native width; ``_kernel_num_heads``: pad to 64 heads, or to
# all heads past 64 a rank)
SM120_DECODE_MAX_TOKENS = 64
PADDED_HEADS = 64


def padded_real_heads(q_heads: int, num_tokens: int, n_heads: int, attn_tp_size: int) -> int | None:
    """The real heads of a call SGLang padded, or None when it did not pad this call.

    Mirrors ``DeepseekV4Attention._kernel_num_heads`` for the Triton backend: a rank holds
    ``n_heads // attn_tp_size`` heads; with ``attn_tp_size == 1``, or above
    ``SM120_DECODE_MAX_TOKENS`` tokens, the query has its native width; otherwise it is padded
    to 64 heads (to ``n_heads`` past 64 a rank). Any other width is not a padding this knows, and
    every head is computed."""
    if attn_tp_size <= 1 or num_tokens > SM120_DECODE_MAX_TOKENS or n_heads % attn_tp_size:
        return None
    local = n_heads // attn_tp_size
    padded = PADDED_HEADS if local <= PADDED_HEADS else n_heads
    return local if q_heads == padded and local < q_heads else None


_MODEL_HEADS: list[int] = []  # the served model's heads, once read


def _model_heads() -> int | None:
    """``num_attention_heads`` of the served model, read the way SGLang reads its config
    (``get_config`` on the published model arguments, the call ``ModelConfig`` makes, cached
    by SGLang); None where SGLang has not published them (outside the engine)."""
    if _MODEL_HEADS:
        return _MODEL_HEADS[0]
    try:
        from sglang.srt.runtime_context import get_model
        from sglang.srt.utils.hf_transformers_utils import get_config

        m = get_model()
        cfg = get_config(m.model_path, trust_remote_code=m.trust_remote_code,
                         revision=m.revision,
                         model_override_args=json.loads(m.json_model_override_args or "{}"),
                         model_config_parser=m.model_config_parser)
        cfg = getattr(cfg, "text_config", None) or cfg
        _MODEL_HEADS.append(int(cfg.num_attention_heads))
        return _MODEL_HEADS[0]
    except Exception:  # not in an engine, or a layout this cannot read: compute every head
        return None


def _attn_tp_size() -> int | None:
    """The attention TP width in force for this call: ``get_parallel().attn_tp_size``, or the
    CP decode width while SGLang's CP decode-attention-TP context is on (``deepseek_v4.py``
    ``maybe_use_decode_attn_tp`` then re-cuts the heads by it)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        cp = sys.modules.get("sglang.srt.layers.cp.cp_decode_attn_tp")
        ctx = getattr(cp, "_global_cp_decode_attn_tp_ctx", None) if cp else None
        if ctx is not None and getattr(ctx, "use_decode_attn_tp", False):
            return int(ctx.decode_tp_size)
        return int(get_parallel().attn_tp_size)
    except Exception:  # nothing published: not in an engine
        return None


_LAYOUT: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "dsv4_engine_layout", default=None)


@contextlib.contextmanager
def engine_layout(n_heads: int, attn_tp_size: int) -> typing.Iterator[None]:
    """Calls inside see this model head count and attention TP width instead of SGLang's.

    For a caller outside the engine that must make the engine's call (the qualify runner times
    the padded decode call with the real heads a rank would compute); the padding rule stays
    :func:`padded_real_heads`. Read when a call is made (and so when a CUDA graph captures it)."""
    if n_heads < 1 or attn_tp_size < 1:
        raise ValueError(f"engine_layout needs n_heads and attn_tp_size >= 1, got "
                         f"{n_heads} and {attn_tp_size}")
    token = _LAYOUT.set((int(n_heads), int(attn_tp_size)))
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def real_heads(q_heads: int, num_tokens: int) -> int | None:
    """Heads of this decode call that hold queries, learnt from SGLang's model config and
    parallel layout (or the :func:`engine_layout` in force); None (compute every head) where
    either is unknown."""
    stated = _LAYOUT.get()
    if stated is not None:
        return padded_real_heads(q_heads, num_tokens, *stated)
    n_heads = _model_heads()
    tp = _attn_tp_size() if n_heads is not None else None
    if n_heads is None or tp is None:
        return None
    return padded_real_heads(q_heads, num_tokens, n_heads, tp)


def _i32(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.reshape(-1)
    return t if t.dtype == torch.int32 else t.to(torch.int32)


def fp8_paged_mqa_logits_sm120(
    q_fp8: torch.Tensor,
    kvcache_fp8: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    deep_gemm_metadata: Any,
    max_seq_len: int,
    clean_logits: bool = True,
) -> torch.Tensor:
    """SGLang-compatible paged MQA logits ``[B, max_seq_len]``: O(real length) per row.

    Only ``[:, :seq_lens]`` is written unless ``clean_logits``; then ``-inf`` fills the tail.
    SGLang 0.5.23's one caller (``dsv4/indexer.py``, ``run_paged_indexer``) passes
    ``clean_logits=False`` and hands the logits to ``run_topk_transform``, whose consumers on
    sm_120 never read past a row's length: the default ``sgl-kernel`` backend with
    ``SGLANG_OPT_USE_TOPK_V2=0`` (the model hook's sm_120 setting) runs ``topk_transform_paged``
    -> ``jit/csrc/deepseek_v4/topk_v1.cuh``, whose ``naive_transform``/``radix_topk`` read
    ``scores[0, seq_len)`` only; the ``torch`` and unfused ``flashinfer`` backends
    (``_topk_transform_vectorized``) mask positions ``>= seq_lens`` with ``-inf`` themselves
    before their top-k. Writing the tail on every call cost O(max context): B=64 with 1K real
    keys took 9.6 µs at 1K max and 26.5 µs at 262K max (issue 24). SGLang's own torch version
    fills the tail although its caller asks it not to (it allocates with ``new_full(-inf)``).
    """
    _ = deep_gemm_metadata
    lens = seq_lens.reshape(-1)
    lens = lens if lens.dtype == torch.int32 else lens.to(torch.int32)
    pt = page_table if page_table.dtype == torch.int32 else page_table.to(torch.int32)
    return indexer_logits(q_fp8, kvcache_fp8.view(torch.uint8), weight, lens, pt,
                          int(max_seq_len), clean=bool(clean_logits))


def load_sglang_functions(path: str | pathlib.Path, names: list[str],
                          extra_globals: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compile the named top-level functions (and assignments) of an SGLang source file.

    Only those definitions run, in a namespace holding torch, ``F``, typing names and
    ``FP8_DTYPE`` (``float8_e4m3fn`` on NVIDIA, as in SGLang's indexer).
    """
    tree = ast.parse(pathlib.Path(path).read_text())
    wanted = set(names)
    body: list[ast.stmt] = []
    for node in tree.body:
        is_fn = isinstance(node, ast.FunctionDef) and node.name in wanted
        is_var = isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in wanted for t in node.targets
        )
        if is_fn or is_var:
            body.append(node)
    found = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    found |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name)}
    missing = wanted - found
    if missing:
        raise LookupError(f"{path} lacks {sorted(missing)}")
    ns: dict[str, Any] = {"torch": torch, "F": F, "FP8_DTYPE": torch.float8_e4m3fn}
    ns.update({k: getattr(typing, k) for k in ("Any", "Callable", "Dict", "List", "Optional",
                                                "Tuple", "Union")})
    ns.update(extra_globals or {})
    code = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec")
    exec(code, ns)
    return {n: ns[n] for n in names}
