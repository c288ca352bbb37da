"""``python -m dsv4_kernels.qualify``: every contender of each hooked op, checked, then timed.

Run by ``dsv4ctl qualify kernels`` in the engine's own environment on the host's GPU (and, the
same module, on a development GPU). For one role's shapes (``--shape``, the JSON of
``orchestrator.kernel_paths.role_shape``) it measures, per op:

* attention (sparse MLA with top-k plus the 128-token SWA window): decode at the CUDA-graph batch
  sizes up to ``cuda_graph_max_bs`` and, for a role that prefills, one chunk of
  ``chunked_prefill_size`` rows. Contenders: ``flashinfer`` (SGLang 0.5.23's sm_120 default,
  ``flash_mla_sm120._flash_mla_flashinfer`` / ``_flash_mla_sm120_prefill``), ``sglang-triton``
  (``flash_mla_sm120_triton.flash_mla_sparse_decode_triton``) and ``bundled``. Heads as the
  engine passes them (``deepseek_v4.py::_kernel_num_heads``, L1215-1235): decode pads to 64 unless
  FlashInfer takes the real count; prefill gets the real per-rank count. The bundled contender
  runs under ``sglang_compat.engine_layout`` (the shape's heads and ``attn_tp``), so on a padded
  call it computes the rank's real heads only, as the hook does in the engine; correctness is
  checked on the same call, over the real heads the engine's consumer keeps;
* indexer (paged MQA logits, C4 keys): at ``cuda_graph_max_bs`` rows and the declared context
  (capped, said in the shape). Contenders: ``tilelang`` (the sm_120 default),
  ``sglang-torch`` (``fp8_paged_mqa_logits_torch_sm120``) and ``bundled``;
* mhc_pre (the mHC boundary): ``sglang-fp32`` (``mhc.mhc_fused_post_pre``) and ``bundled``
  (``sglang_mhc``), both needing SGLang's TileLang finalization.

Each contender is first compared with the float32 reference (at a small batch), then timed as the
median of CUDA-graph replays with a 256 MiB buffer overwritten before each (cold L2); one that
cannot be captured is timed eagerly and says so. A contender that cannot run here (FlashInfer's
sm_120 kernel on another GPU, a package the env lacks) is ``unavailable`` with the reason, never an
error. Prints one JSON document (an ``orchestrator.facts.KernelQualification``); exit 0 unless
the arguments are wrong or no GPU is visible (2).

Past ~400 lines: the host runs this one module (``python -m``) and nothing else of the
package's tools; one section per op (cases, contenders, timing); the seam is a module per op.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

SWA = 128
FLASHINFER_DECODE_HEADS = (8, 16, 32, 64, 128)  # flashinfer 0.7.2 decode dispatch (catalog)
DECODE_MAX_ROWS = 64  # flash_mla_sm120.py L212 SM120_DECODE_MAX_TOKENS
INDEXER_MAX_CTX = 131072  # a qualify run must fit beside nothing else; the shape says so
GRAPH_BATCHES = (1, 8, 16, 32, 64, 128, 256)


class Timer:
    """Median µs of CUDA-graph replays, the L2 flushed before each replay."""

    def __init__(self) -> None:
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def _median(self, launch: Callable[[], Any], reps: int) -> float:
        times = []
        for _ in range(reps):
            self.flush.fill_(1)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            launch()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        return statistics.median(times)

    def time(self, fn: Callable[[], Any], reps: int = 20) -> tuple[float, str | None]:
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        try:
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(g):
                fn()
            g.replay()
            torch.cuda.synchronize()
            return self._median(g.replay, reps), None
        except Exception as exc:  # a host sync inside: time it as it runs eagerly
            torch.cuda.synchronize()
            return self._median(fn, max(3, reps // 4)), (
                f"timed eagerly: not capturable ({type(exc).__name__})")


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _row(op: str, who: str, shape: str, status: str, us: float | None = None,
         error: float | None = None, detail: str | None = None) -> dict[str, Any]:
    return {"op": op, "contender": who, "shape": shape, "status": status,
            "us": None if us is None else round(us, 2),
            "error": None if error is None else float(f"{error:.3g}"), "detail": detail}


def _import(name: str) -> tuple[Any, str | None]:
    try:
        return importlib.import_module(name), None
    except Exception as exc:
        return None, f"{name} does not import here: {_why(exc)}"


def _from_source(rel: str, names: list[str], why: str | None
                 ) -> tuple[Callable[..., Any] | None, str | None]:
    """SGLang's function compiled from its installed source file (sglang_compat), for a module
    that does not import here; the last name is the one returned."""
    import importlib.util
    import pathlib

    from .sglang_compat import load_sglang_functions

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None, why
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / rel
    try:
        return load_sglang_functions(path, names)[names[-1]], None
    except Exception as exc:
        return None, f"{why}; from {path}: {_why(exc)}"


def _original(fn: Any) -> Any:
    return getattr(fn, "__dsv4_original__", fn)  # SGLang's own, if the hook is active here


def _is_sm120() -> bool:
    return torch.cuda.get_device_capability() == (12, 0)


# ----------------------------------------------------------------------------------- attention ---

def _attention_contenders(shape: dict[str, int]
                          ) -> dict[str, tuple[Callable[..., Any] | None, str | None]]:
    from .sglang_compat import engine_layout
    from .sglang_compat import flash_mla_sparse_decode_triton as hooked

    # the hooked entry point learns the rank's real heads from the engine's layout; here the
    # shape states it, so a padded call computes the real heads only, as in the engine
    layout = (shape["heads_per_attn_rank"] * shape["attn_tp"], shape["attn_tp"])

    def bundled(*args: Any) -> Any:
        with engine_layout(*layout):
            return hooked(*args)

    out: dict[str, tuple[Callable[..., Any] | None, str | None]] = {}
    if not _is_sm120():
        cap = ".".join(map(str, torch.cuda.get_device_capability()))
        out["flashinfer"] = (None, f"FlashInfer's sparse MLA is built for sm_120a/120f only "
                                   f"(block-scaled FP8 mma.sync); this GPU is {cap}")
    else:
        mod, why = _import("sglang.kernels.ops.attention.flash_mla_sm120")
        if mod is None:
            out["flashinfer"] = (None, why)
        else:
            def flashinfer(*args: Any) -> Any:
                fn = (mod._flash_mla_sm120_prefill if args[0].shape[0] > DECODE_MAX_ROWS
                      else mod._flash_mla_flashinfer)
                return fn(*args)
            out["flashinfer"] = (flashinfer, None)
    mod, why = _import("sglang.kernels.ops.attention.flash_mla_sm120_triton")
    out["sglang-triton"] = ((_original(mod.flash_mla_sparse_decode_triton), None) if mod
                            else (None, why))
    out["bundled"] = (bundled, None)
    return out


def _width(who: str, rows: int, heads: int, attn_tp: int) -> int:
    """The query width the engine passes this contender (``deepseek_v4.py::_kernel_num_heads``):
    prefill and ``attn_tp == 1`` get the rank's heads; decode pads to 64 (all heads past 64 a
    rank) unless FlashInfer takes the real count."""
    if attn_tp <= 1 or rows > DECODE_MAX_ROWS:
        return heads
    if who == "flashinfer" and heads in FLASHINFER_DECODE_HEADS:
        return heads
    return 64 if heads <= 64 else heads * attn_tp


def _decode_case(g: torch.Generator, batch: int, heads: int, topk: int) -> Any:
    """Decode: each request its own keys (SWA pool pages of 256, compressed pool pages of 64)."""
    from .cases import make_decode_case

    if batch > DECODE_MAX_ROWS:
        return _prefill_case(batch, heads, topk)
    return make_decode_case(g, batch=batch, heads=heads, topk=SWA, extra_topk=topk,
                            page_size=256, extra_page_size=64, device="cuda")


def _prefill_case(rows: int, heads: int, topk: int) -> Any:
    """A prefill chunk: every row of one request draws its keys from the same pools (built on
    the GPU: a chunk of 8,192 rows with per-row pools would need ~20 GB of host memory)."""
    from .cases import DecodeCase
    from .layout import quantize_model1

    cg = torch.Generator(device="cuda").manual_seed(rows)

    def pool(tokens: int, page: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        pages = -(-tokens // page)
        kv = torch.randn(pages, page, 512, generator=cg, device="cuda")
        idx = torch.rand(rows, tokens, generator=cg, device="cuda").argsort(dim=1)[:, :k]
        return quantize_model1(kv), idx.to(torch.int32).view(rows, 1, k).contiguous()

    swa_cache, swa_idx = pool(rows + SWA, 256, SWA)
    ext_cache, ext_idx = pool(max(4 * topk, rows // 4 + topk), 64, topk)
    q = torch.randn(rows, 1, heads, 512, generator=cg, device="cuda").to(torch.bfloat16)
    full = torch.full((rows,), SWA, dtype=torch.int32, device="cuda")
    return DecodeCase(q, swa_cache, swa_idx, full, 512 ** -0.5,
                      torch.randn(heads, generator=cg, device="cuda"), ext_cache, ext_idx,
                      torch.full((rows,), topk, dtype=torch.int32, device="cuda"))


def _args(c: Any) -> tuple[Any, ...]:
    """SGLang's positional parameters of the sm_120 entry points (flash_mla_sm120.py L348-359)."""
    return (c.q, c.k_cache, c.indices, c.topk_length, c.attn_sink, 512, c.sm_scale,
            c.extra_k_cache, c.extra_indices, c.extra_topk_length)


def attention(shape: dict[str, int], timer: Timer, g: torch.Generator) -> list[dict[str, Any]]:
    from .reference import ref_sparse_decode

    heads, topk = shape["heads_per_attn_rank"], shape["index_topk"]
    contenders = _attention_contenders(shape)
    checked: dict[str, str | None] = {}
    errors: dict[str, float] = {}
    for who, (fn, why) in contenders.items():  # correctness: a small batch, the engine's call
        if fn is None:
            checked[who] = why
            continue
        try:
            # the padded heads hold what new_empty left (random here); the engine's consumer
            # keeps the rank's real heads only (tp_slice), so only those are compared
            c = _decode_case(g, 4, _width(who, 4, heads, shape["attn_tp"]), topk)
            ro, _ = ref_sparse_decode(**c.kwargs())
            ro = ro.reshape(4, -1, 512)[:, :heads]
            out = fn(*_args(c))[0].reshape(4, -1, 512)[:, :heads].float()
            err = float((out - ro).norm() / ro.norm())
            errors[who] = err
            checked[who] = None if err < 2e-2 else f"relative error {err:.3g} vs the reference"
        except Exception as exc:
            checked[who] = f"failed: {_why(exc)}"
    rows = []
    bmax = max(1, shape["cuda_graph_max_bs"])
    shapes = [(f"decode B={b}", b) for b in GRAPH_BATCHES
              if shape["cuda_graph_max_bs"] > 0 and b <= min(bmax, DECODE_MAX_ROWS)]
    if shape.get("prefill"):
        shapes.append((f"prefill T={shape['chunked_prefill_size']}", shape["chunked_prefill_size"]))
    for label, rows_n in shapes:
        for who, (fn, why) in contenders.items():
            h = _width(who, rows_n, heads, shape["attn_tp"])
            tag = f"{label} H={h}" + (f" ({heads} real)" if who == "bundled" and h != heads
                                      else "")
            if fn is None:
                rows.append(_row("attention", who, label, "unavailable", detail=why))
                continue
            if checked[who] is not None:
                status = "failed" if checked[who].startswith("failed") else "wrong"
                rows.append(_row("attention", who, label, status, errors.get(who),
                                 detail=checked[who]))
                continue
            try:
                cc = _decode_case(g, rows_n, h, topk)
                args = _args(cc)
                us, note = timer.time(lambda fn=fn, args=args: fn(*args))
                rows.append(_row("attention", who, label, "ok", us, errors.get(who),
                                 detail=note or tag))
            except Exception as exc:
                rows.append(_row("attention", who, label, "failed", detail=_why(exc)))
            torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------- indexer ---

def _indexer_contenders() -> dict[str, tuple[Callable[..., Any] | None, str | None]]:
    from .sglang_compat import fp8_paged_mqa_logits_sm120 as bundled

    out: dict[str, tuple[Callable[..., Any] | None, str | None]] = {}
    mod, why = _import("sglang.kernels.ops.attention.dsa.tilelang_kernel")
    out["tilelang"] = (mod.tilelang_fp8_paged_mqa_logits, None) if mod else (None, why)
    mod, why = _import("sglang.srt.layers.attention.dsv4.indexer")
    if mod is not None:
        out["sglang-torch"] = (_original(mod.fp8_paged_mqa_logits_torch_sm120), None)
    else:  # the module needs GPU-only packages at import; its function itself does not
        out["sglang-torch"] = _from_source("srt/layers/attention/dsv4/indexer.py",
                                           ["_arange_cache", "fp8_paged_mqa_logits_torch_sm120"],
                                           why)
    out["bundled"] = (bundled, None)
    return out


def indexer(shape: dict[str, int], timer: Timer, g: torch.Generator) -> list[dict[str, Any]]:
    from .cases import make_indexer_case
    from .reference import ref_indexer_logits

    contenders = _indexer_contenders()
    ctx = min(shape["context_tokens"], INDEXER_MAX_CTX)
    keys = max(1, ctx // 4)  # C4 compressed keys
    capped = f" (of {shape['context_tokens']})" if ctx < shape["context_tokens"] else ""
    small = make_indexer_case(g, batch=4, heads=64, lens=[1, 300, 2000, 5000], max_len=6000,
                              device="cuda")
    ref = ref_indexer_logits(small.q_fp8, small.index_cache, small.weights, small.seq_lens,
                             small.page_table, 6000)
    fin = torch.isfinite(ref)
    checked: dict[str, tuple[str, float | None, str | None]] = {}
    for who, (fn, why) in contenders.items():
        if fn is None:
            checked[who] = ("unavailable", None, why)
            continue
        try:
            # clean_logits=False as SGLang's one caller passes it (its torch function asserts it);
            # the comparison reads only each row's real keys
            got = fn(small.q_fp8.unsqueeze(1), small.index_cache, small.weights, small.seq_lens,
                     small.page_table, None, 6000, False).float()
            err = float((got[fin] - ref[fin]).norm() / ref[fin].norm())
            checked[who] = (("ok", err, None) if err < 2e-3 else
                            ("wrong", err, f"relative error {err:.3g} vs the reference"))
        except Exception as exc:
            checked[who] = ("failed", None, _why(exc))
    sizes = []
    if shape["cuda_graph_max_bs"] > 0:
        sizes.append(("decode", min(shape["cuda_graph_max_bs"], 256)))
    if shape.get("prefill") and shape["chunked_prefill_size"] > 0:
        sizes.append(("prefill", shape["chunked_prefill_size"]))
    rows = []
    for kind, n in sizes:
        label = f"indexer {kind} rows={n} ctx={ctx}{capped}"
        case = _indexer_rows(g, n, keys, shared=kind == "prefill")
        for who, (fn, _) in contenders.items():
            status, err, detail = checked[who]
            if status != "ok":
                rows.append(_row("indexer", who, label, status, error=err, detail=detail))
                continue
            try:
                us, note = timer.time(lambda fn=fn, c=case: fn(*c, keys, False))
                rows.append(_row("indexer", who, label, "ok", us, err, note))
            except Exception as exc:
                rows.append(_row("indexer", who, label, "failed", error=err, detail=_why(exc)))
        del case
        torch.cuda.empty_cache()
    return rows


def _indexer_rows(g: torch.Generator, rows: int, keys: int, *, shared: bool) -> tuple[Any, ...]:
    """(q, cache, weights, lens, page table, metadata) for ``rows`` query rows of ``keys`` keys:
    decode rows each with their own pages, a prefill chunk's rows on one request's pages."""
    from .cases import make_indexer_case

    if not shared:
        c = make_indexer_case(g, batch=rows, heads=64, lens=[keys] * rows, max_len=keys,
                              device="cuda")
        return (c.q_fp8.unsqueeze(1), c.index_cache, c.weights, c.seq_lens, c.page_table, None)
    one = make_indexer_case(g, batch=1, heads=64, lens=[keys], max_len=keys, device="cuda")
    cg = torch.Generator(device="cuda").manual_seed(rows)
    q = (torch.randn(rows, 1, 64, 128, generator=cg, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = torch.randn(rows, 64, generator=cg, device="cuda") * 64 ** -0.5
    lens = torch.full((rows,), keys, dtype=torch.int32, device="cuda")
    return (q, one.index_cache, w, lens, one.page_table.expand(rows, -1).contiguous(), None)


# ------------------------------------------------------------------------------------- mhc_pre ---

def mhc_pre(shape: dict[str, int], timer: Timer, g: torch.Generator) -> list[dict[str, Any]]:
    """Both contenders run SGLang's own TileLang finalization, so both need its mHC module."""
    label = f"mhc B={max(1, min(shape['cuda_graph_max_bs'], 64))}"
    mod, why = _import("sglang.kernels.ops.layernorm.mhc")
    if mod is None:
        return [_row("mhc_pre", who, label, "unavailable", detail=why)
                for who in ("sglang-fp32", "bundled")]
    # the call needs the engine's real hc parameters; not modelled outside an engine yet
    why = "not measured by this runner version (needs the engine's hc parameters)"
    return [_row("mhc_pre", who, label, "unavailable", detail=why)
            for who in ("sglang-fp32", "bundled")]


OPS = {"attention": attention, "indexer": indexer, "mhc_pre": mhc_pre}


def run(shape: dict[str, int], role: str, host: str, ops: list[str]) -> dict[str, Any]:
    from . import sglang_hook

    timer = Timer()
    g = torch.Generator().manual_seed(20261202)
    timings: list[dict[str, Any]] = []
    for op in ops:
        try:
            timings += OPS[op](shape, timer, g)
        except Exception as exc:  # a whole op that cannot be set up here is reported, not raised
            timings.append(_row(op, "all", "-", "failed", detail=_why(exc)))
    cap = torch.cuda.get_device_capability()
    return {
        "role": role, "host": host,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "engine_version": sglang_hook.sglang_version() or "none",
        "gpu": torch.cuda.get_device_name(), "compute_cap": f"{cap[0]}.{cap[1]}",
        "shape": shape, "timings": timings,
        "runner": f"dsv4_kernels.qualify (kernels from {sglang_hook.loaded_from()}; torch "
                  f"{torch.__version__})",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check and time each hooked op's contenders.")
    ap.add_argument("--shape", required=True, help="JSON of the role's shapes (role_shape)")
    ap.add_argument("--role", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--ops", default=",".join(OPS))
    args = ap.parse_args(argv)
    try:
        shape = {str(k): int(v) for k, v in json.loads(args.shape).items()}
    except (ValueError, AttributeError, TypeError) as exc:
        print(json.dumps({"error": f"--shape is not a JSON object of integers: {exc}"}))
        return 2
    ops = [o for o in args.ops.split(",") if o in OPS]
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible",
                          "fix": "run on the GPU host, in the engine's environment"}))
        return 2
    print(json.dumps(run(shape, args.role, args.host, ops), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
