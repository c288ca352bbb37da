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

``load_sglang_functions`` pulls named top-level functions out of an SGLang source file with
``ast`` so the CPU test and the benchmark can run SGLang's own fallbacks without importing the
rest of the engine (its ``dsv4.indexer`` module needs GPU-only packages at import).
"""

from __future__ import annotations

import ast
import pathlib
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
    idx = indices.reshape(t, 1, -1).to(torch.int32)
    ex = extra_indices.reshape(t, 1, -1).to(torch.int32) if extra_indices is not None else None
    return sparse_mla_decode(
        q.reshape(t, 1, q.shape[-2], q.shape[-1]), k_cache.view(torch.uint8), idx,
        _i32(topk_length), float(softmax_scale),
        attn_sink.float() if attn_sink is not None else None,
        extra_k_cache.view(torch.uint8) if extra_k_cache is not None else None, ex,
        _i32(extra_topk_length),
    )


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
