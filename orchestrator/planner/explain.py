"""`dsv4ctl plan --explain`: the arithmetic behind the plan's numbers, per role, in labelled sections.

Owns the explanation text. Everything it shows comes from the Plan (``RoleCapacity``'s terms), so
it explains exactly the numbers the plan used and never recomputes them. Each section is a function
``(plan, role capacity) -> Section | None`` in :data:`ROLE_SECTIONS`; adding a model to the planner
(e.g. the headroom terms) means appending one function there.

The memory section adds up to the GPU's capacity exactly (integers, bytes):
``preload + weights + KV pools + req_to_token + headroom = capacity``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.planner.report import kernel_lines, symbol_legend
from orchestrator.planner_model import Plan, RoleCapacity

LEGEND = f"Legend: {symbol_legend()}  mfs = mem_fraction_static"

# bytes_per_full_token terms: label and SGLang 0.5.23's expression (pool_configurator.py
# L1372-1446; docs/kvpool-sglang-0.5.23.md §2 derives each).
BPT_TERMS = {
    "swa_window_latent": ("SWA window latent", "r*584*L"),
    "c4_state_ring": ("c4 state ring", "r*ring4/page*(2*2*512*dt)*n4"),
    "c4_indexer_state_ring": ("c4 indexer state ring", "r*ring4/page*(2*2*128*dt)*n4"),
    "c4_latent": ("C4 latent", "584/(4*h)*n4"),
    "c4_indexer_keys": ("C4 indexer keys", "132/4*n4"),
    "c128_latent": ("C128 latent", "584/128*n128"),
    "page_padding": ("page padding", "576-B page rounding"),
    "speculative_reserve": ("speculative reserve", "x(L+1)/L (draft layer)"),
}
BPT_SYMBOLS = ("r = SWA/full token ratio, L = layers, n4/n128 = c4/c128 layers,",
               "dt = state dtype bytes, h = HiSparse ratio (1 when off)")

POOLS = {
    "swa_kv": "SWA latent", "c4_kv": "C4 latent", "c128_kv": "C128 latent",
    "c4_indexer": "C4 indexer keys", "c4_state": "c4 state", "c4_indexer_state": "c4 indexer state",
    "c128_state": "c128 state (fixed, per request slot)", "draft_swa_kv": "draft SWA latent",
}


@dataclass(frozen=True)
class Section:
    title: str
    lines: list[str] = field(default_factory=list)


SectionFn = Callable[[Plan, RoleCapacity], "Section | None"]


def _b(n: float) -> str:
    return f"{n:,.0f} B"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def _row(label: str, n: int, width: int = 56) -> str:
    return f"{label:<{width}}{_b(n):>19} {_gib(n):>10}"


def memory_section(plan: Plan, c: RoleCapacity) -> Section | None:
    if not c.kv_pools:
        return Section("Memory per GPU", ["not sized: the error checks say why"])
    kv = sum(c.kv_pools.values())
    terms = [
        ("preload: CUDA context, NCCL before SGLang's baseline", c.preload_bytes),
        ("weights: this rank's shard (below)", c.weights_per_rank_bytes),
        ("KV pools, as allocated (below)", kv),
        ("req_to_token table: (requests+1) x context x 4 B", c.req_to_token_bytes),
        ("headroom: free for activations, CUDA graphs, NCCL", c.headroom_bytes),
    ]
    if c.calibration_bytes:
        terms.insert(2, ("calibration: measured on the host, not in the model",
                         c.calibration_bytes))
    total = sum(n for _, n in terms)
    lines = [_row(label, n) for label, n in terms]
    lines.append(_row("= GPU capacity" if total == c.gpu_total_bytes
                      else f"= {total:,} B, NOT the GPU's {c.gpu_total_bytes:,} B", total))
    beyond = -c.kv_unused_bytes if c.kv_unused_bytes < 0 else 0
    lines.append(f"headroom ~ SGLang's slack pre*(1-mfs) {_b(c.slack_bytes)} - req_to_token")
    lines.append(f"           - pools beyond the budget {_b(beyond)}" if beyond else
                 f"           + unused KV budget {_b(c.kv_unused_bytes)}")
    lines.append("unused (plan table) = KV budget the page rounding left; part of headroom")
    return Section(f"Memory per GPU ({c.gpu_model}, mfs {c.mem_fraction_static:.2f})", lines)


def weights_section(plan: Plan, c: RoleCapacity) -> Section | None:
    if not c.weights_per_rank:
        return None
    groups = sorted(c.weights_per_rank, key=lambda g: (-g.bytes, g.name))
    cells = [f"{g.name} {_gib(g.bytes)}" for g in groups]
    lines, line = [], ""
    for cell in cells:
        if line and len(line) + len(cell) + 2 > 90:
            lines.append(line)
            line = ""
        line = f"{line}, {cell}" if line else cell
    lines.append(line)
    lines.append(f"= {_b(c.weights_per_rank_bytes)} per rank (TP{c.tp}, EP{c.ep}, "
                 f"attention-DP {c.attn_dp})")
    return Section("Weights per rank", lines)


def kv_section(plan: Plan, c: RoleCapacity) -> Section | None:
    if not c.kv_pools or not c.bytes_per_token_terms:
        return None
    t = c.kv_tokens
    lines = ["bytes per full-context token, per rank (bytes_per_full_token):"]
    for key, (label, expr) in BPT_TERMS.items():
        v = c.bytes_per_token_terms.get(key, 0.0)
        if v or key != "speculative_reserve":
            lines.append(f"  {label:<24}{expr:<32}{v:>12,.2f}")
    lines.append(f"  {'= total':<56}{c.bytes_per_token:>12,.2f} B")
    lines.append(f"  where {BPT_SYMBOLS[0]}")
    lines.append(f"        {BPT_SYMBOLS[1]}")
    lines.append(_row("budget = pre*mfs - weights (SGLang's rest)", c.kv_budget_bytes))
    slots = t.get("c128_state_slots", 0)
    lines.append(_row(f"fixed = c128 state ring, {slots:,} rows", c.fixed_bytes_per_rank))
    raw = int((c.kv_budget_bytes - c.fixed_bytes_per_rank) / c.bytes_per_token) \
        if c.bytes_per_token else 0
    lines.append(f"full tokens = floor((budget - fixed) / {c.bytes_per_token:,.2f}) = {raw:,}")
    lines.append(f"            down to a {c.page_size}-token page: {t.get('full', 0):,} "
                 "(max_total_num_tokens)")
    lines.append(f"pools: swa {t.get('swa', 0):,} tokens, c4 {t.get('c4', 0):,}, "
                 f"c128 {t.get('c128', 0):,}, c4 state {t.get('c4_state_slots', 0):,} slots")
    for key, label in POOLS.items():
        if key in c.kv_pools:
            lines.append(_row(f"  {label}", c.kv_pools[key]))
    kv = sum(c.kv_pools.values())
    lines.append(_row("= KV pools allocated", kv))
    if c.kv_unused_bytes < 0:
        lines.append(f"  {-c.kv_unused_bytes:,} B more than the budget: one extra page per pool")
        lines.append("  and ring+1 state rows that bytes_per_full_token does not price")
    lines.append("derivation, term by term with sources: docs/kvpool-sglang-0.5.23.md")
    return Section("KV pool (SGLang 0.5.23 DSV4PoolConfigurator.calculate_pool_sizes)", lines)


HEADROOM_LABELS = {
    "cuda_context": "CUDA context, cuBLAS workspaces",
    "nccl": "NCCL communicator buffers",
    "custom_allreduce": "custom all-reduce buffers",
    "activations": "activations of the worst step",
    "cuda_graphs": "CUDA graphs (captured batch sizes)",
    "indexer_logits": "DSA indexer logits workspace",
}


def headroom_section(plan: Plan, c: RoleCapacity) -> Section | None:
    """What lives outside mem_fraction_static (planner/headroom.py), term by term."""
    if not c.headroom_terms:
        return None
    lines = [f"worst moment: the longest request, {c.longest_request_tokens:,} tokens, "
             f"chunked_prefill_size {c.chunked_prefill_size:,}"]
    for phase, title, total in (
            ("before-baseline", "before SGLang's baseline (= preload above)", c.preload_bytes),
            ("runtime", "at run time, out of the headroom", c.headroom_need_bytes)):
        lines.append(f"{title}:")
        for t in (t for t in c.headroom_terms if t.phase == phase):
            kind = "exact" if t.exact else "estimate"
            lines.append(_row(f"  {HEADROOM_LABELS.get(t.id, t.id)} ({kind})", t.bytes))
            lines += textwrap.wrap(t.detail, 90, initial_indent="      ",
                                   subsequent_indent="        ")
            lines += textwrap.wrap(f"source: {t.source}", 90, initial_indent="      ",
                                   subsequent_indent="        ")
        lines.append(_row("  = sum", total))
    if c.calibrated:
        lines += textwrap.wrap(f"KV pool {c.calibrated}", 90)
    verdict = ("fits" if c.headroom_need_bytes <= c.headroom_bytes else
               "does NOT fit (capacity.headroom)")
    lines.append(_row(f"headroom left by the KV pool: need {_gib(c.headroom_need_bytes)}, "
                      f"{verdict}", c.headroom_bytes, width=56))
    lines.append("derivation, term by term with sources: docs/headroom-sglang-0.5.23.md")
    return Section("Outside mem_fraction_static (headroom model)", lines)


#: Sections shown per role, in order. Append a function to add one.
ROLE_SECTIONS: list[SectionFn] = [memory_section, weights_section, kv_section, headroom_section]


def render_explain(plan: Plan, sections: list[SectionFn] | None = None) -> str:
    """The explanation of every role of ``plan``, with the legend first."""
    out = [LEGEND, ""]
    for c in plan.capacity:
        gpus = next((r.gpus for r in plan.deployment.roles if r.name == c.role), [])
        where = f"GPUs {','.join(map(str, gpus))}" if gpus else "no GPUs"
        out.append(f"Role {c.role} ({where}; every GPU of the role holds the same):")
        for fn in sections if sections is not None else ROLE_SECTIONS:
            sec = fn(plan, c)
            if sec is None:
                continue
            out.append(f"  {sec.title}:")
            out += [f"    {line}" for line in sec.lines]
        out.append("")
    out += kernel_lines(plan, sources=True)
    return "\n".join(out).rstrip("\n") + "\n"
