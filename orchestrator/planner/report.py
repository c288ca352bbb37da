"""Presenting a Plan: concise text for terminals, markdown for pull requests, versioned JSON for tools.

Summary first, then the per-GPU capacity table, disks, checks, and the actions in Terraform's
vocabulary (``+`` create, ``~`` change, ``-`` remove, ``~>`` restart). Output is a pure function of the
Plan, so golden tests pin it byte for byte. Secrets never enter a plan (units read them from the
host's secrets file), so there is nothing to mask.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence

from orchestrator.planner_model import (
    ACTION_WORDS,
    Action,
    Check,
    Plan,
    count_actions,
    downtime_text,
    plan_line,
)

_SYMBOL = {"create": "+", "change": "~", "remove": "-", "restart": "~>", "start": "+>", "stop": "-<"}
# the symbols in legend order: file actions, then unit actions
_LEGEND_ORDER = ("create", "change", "remove", "restart", "start", "stop")
# What the GPU table's words mean; other + weights + KV pool + headroom = the GPU's memory.
GPU_TABLE_LEGEND = (
    "other = CUDA context/NCCL before SGLang's baseline + the req_to_token table; headroom = free",
    "for activations and CUDA graphs; (unused) = KV budget left by page rounding, inside headroom.",
    "`dsv4ctl plan --explain` shows every term in bytes.",
)
_SEV = {"error": "x error  ", "warning": "! warning", "info": "i info   "}


def symbol_legend() -> str:
    """``+ add  ~ change  ...``: what each action symbol of the plan means (one owner of both)."""
    return "  ".join(f"{_SYMBOL[k]} {ACTION_WORDS[k]}" for k in _LEGEND_ORDER)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = [indent + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in rows:
        out.append(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return out


def summary_line(plan: Plan) -> str:
    """The one summary text, markdown and JSON share (planner_model.plan_line)."""
    return plan_line(plan.actions, len(plan.errors))


def _action_line(a: Action) -> str:
    reason = "; ".join(x for x in (a.reason, downtime_text(a)) if x)
    return f"{_SYMBOL[a.kind]:>2} {a.target}" + (f"  ({reason})" if reason else "")


def transition_lines(actions: Sequence[Action], downtime: str | None = None) -> list[str]:
    """What a change does, as plan prints it: the summary line, each action with its reason and
    downtime, then the downtime (apply of a saved plan and rollback print it before asking)."""
    lines = [plan_line(actions), *(f"  {_action_line(a)}" for a in actions)]
    return lines + ([f"  downtime: {downtime}"] if downtime else [])


def _check_counts(checks: Sequence[Check]) -> str:
    err = sum(1 for c in checks if c.severity == "error")
    warn = [c for c in checks if c.severity == "warning"]
    acked = sum(1 for c in warn if c.acknowledged)
    text = f"{err} error{'s' if err != 1 else ''}, {len(warn)} warning{'s' if len(warn) != 1 else ''}"
    if acked:
        text += f" ({acked} acknowledged)"
    return text


def _topology(plan: Plan) -> str:
    dep = plan.deployment
    parts = []
    for r in dep.roles:
        extra = f" EP{r.ep}" if r.ep > 1 else ""
        extra += f" attn-DP{r.attn_dp}" if r.attn_dp > 1 else ""
        parts.append(f"{r.name} GPUs {','.join(map(str, r.gpus))} TP{r.tp}{extra}")
    if not parts and dep.router is not None:
        return f"router only (the fleet's sglang-router, {len(_workers(plan))} engines behind it)"
    mode = "pd" if dep.pd else "colocated"
    return f"{mode}: " + "; ".join(parts)


def _workers(plan: Plan) -> list[str]:
    r = plan.deployment.router
    if r is None:
        return []
    return [u for u, _ in r.prefill] + list(r.decode) + list(r.worker_urls)


def check_lines(c: Check, *, verbose: bool = False) -> list[str]:
    """One check as `plan` and `validate` print it: id and title, where in the profile, message,
    fix (or the acknowledgement), and with ``verbose`` the source."""
    tag = _SEV[c.severity] + (" (acknowledged)" if c.acknowledged else "")
    lines = [f"  {tag} {c.id}: {c.title}"]
    if c.location:
        lines.append(f"      at {c.location} ({c.field})")
    lines.append(f"      {c.message}")
    if c.fix and not c.acknowledged:
        lines.append(f"      fix: {c.fix}")
    if c.acknowledged and c.ack_reason:
        lines.append(f"      acknowledged: {c.ack_reason}")
    if c.source and verbose:
        lines.append(f"      source: {c.source}")
    return lines


def _target_lines(plan: Plan) -> list[str]:
    """Where the plan goes and where its secrets come from (issue 31: neither was shown, and a
    profile's inline host silently overrode the inventory)."""
    t = plan.target
    if t is None:
        return []
    src = ("an inline host in the profile; the inventory is not used" if t.source == "profile"
           else f"inventory host {plan.host}")
    key = "" if t.host_key else "; host key not probed"
    out = [f"  target: {t.describe()} ({src}{key})"]
    out += [f"  secret {name}: from {where} on the controller"
            for name, where in plan.secret_sources.items()]
    return out


def _stability_line(plan: Plan) -> str | None:
    """What apply waits for once every check passed: the stability window, and where its value
    comes from (the profile's, or the router's default the planner resolved)."""
    w = plan.deployment.stability_window_s
    if w is None or (not plan.restarts and not any(a.kind == "start" for a in plan.actions)):
        return None
    return (f"stability window: {w:g} s watched after every check passes"
            + (" (the router's default: health-check interval x failure threshold; "
               "health.stability_window_s sets it)" if plan.deployment.stability_window_default
               else " (health.stability_window_s)"))


def render_text(plan: Plan, *, verbose: bool = False) -> str:
    dep = plan.deployment
    lines = [
        f"dsv4ctl plan: {plan.profile_name}  (host {plan.host}, {plan.facts_source} facts)",
        f"  engine {dep.engine_name} {dep.engine_version} | model {dep.model_variant} | "
        f"experts {dep.expert_storage} | index_topk {dep.index_topk} | kv {dep.kv_cache_dtype} | "
        f"context {dep.context_length:,}",
        f"  topology {_topology(plan)}",
        f"  checks: {_check_counts(plan.checks)}",
        f"  {summary_line(plan)}",
        *_target_lines(plan),
        "",
    ]
    if plan.gpus:
        model = plan.gpus[0].model
        lines.append(f"GPU memory ({model}, {_gib(plan.gpus[0].total_bytes)} each):")
        rows = [[str(g.index), g.role or "-", _gib(g.preload_bytes + g.req_to_token_bytes),
                 _gib(g.weights_bytes), _gib(g.kv_bytes), _gib(g.headroom_bytes),
                 _gib(g.free_static_bytes)] for g in plan.gpus]
        lines += _table(["GPU", "role", "other", "weights", "KV pool", "headroom", "(unused)"],
                        rows)
        lines += [f"  {line}" for line in GPU_TABLE_LEGEND]
        lines.append("")
    if plan.capacity:
        lines.append("KV cache per role:")
        rows = []
        for c in plan.capacity:
            if not c.bytes_per_token:  # not sized: an error check says why
                rows.append([c.role, "-", "-", f"{c.attn_dp}", "-", "-", f"{c.mem_fraction_static:.2f}"])
                continue
            rows.append([c.role, f"{c.bytes_per_token:,.0f} B", f"{c.max_total_tokens_per_rank:,}",
                         f"{c.attn_dp}", f"{c.token_capacity:,}", f"{c.max_running_requests}",
                         f"{c.mem_fraction_static:.2f}"])
        lines += _table(["role", "bytes/token", "tokens/rank", "attn-DP", "capacity", "max reqs",
                         "mfs"], rows)
        w = plan.deployment
        lines.append(f"  context per request up to {w.context_length:,} tokens")
        for c in plan.capacity:  # calibration is never hidden (issue 22)
            if c.calibrated:
                lines += textwrap.wrap(f"{c.role}: {c.calibrated}", 98, initial_indent="  ",
                                       subsequent_indent="    ")
        lines.append("")
    lines += kernel_lines(plan)
    if plan.disks:
        lines.append("Disk:")
        rows = []
        for d in plan.disks:
            status = "present" if d.present else ("ok" if not d.shortfall_bytes else
                                                  f"SHORT {_gb(d.shortfall_bytes)}")
            rows.append([d.path, _gb(d.free_bytes), _gb(d.needed_bytes), status])
        lines += _table(["path", "free", "checkpoint", "status"], rows)
        lines.append("")
    shown = [c for c in plan.checks if verbose or c.severity != "info"]
    if shown:
        lines.append("Checks:")
        for c in shown:
            lines += check_lines(c, verbose=verbose)
        lines.append("")
    if plan.errors:
        pass  # nothing will be applied: listing what would change invites misreading it
    elif plan.actions:
        lines.append("Changes:")
        lines += [f"  {_action_line(a)}" for a in plan.actions]
        down = _downtime(plan)
        if down:
            lines.append(f"  downtime: {down}")
        window = _stability_line(plan)
        if window:
            lines.append(f"  {window}")
        lines.append("")
        if plan.facts_source == "declared":
            lines.append("  (declared facts: the host's current release is unknown, so changes are "
                         "shown against an empty host; plan with --live to compare with it)")
        lines.append("")
    else:
        lines.append("No changes.")
        lines.append("")
    if plan.errors:
        lines.append(f"The plan has {len(plan.errors)} error(s): nothing can be applied until they "
                     "are fixed.")
    else:
        lines.append(summary_line(plan))
    return "\n".join(lines) + "\n"


def _downtime(plan: Plan) -> str:
    """One line on what clients see, from the actions' downtime."""
    roles = [r for a in plan.actions if a.downtime != "none" for r in a.roles]
    if not roles:
        return ""
    engines = [r for r in roles if r != "router"]
    if not engines:
        return "the router restarts: clients see refused connections for seconds"
    return (f"{', '.join(dict.fromkeys(engines))} stop or restart and reload the model: requests "
            "to them fail for minutes, until they are ready again")


def kernel_lines(plan: Plan, *, sources: bool = False) -> list[str]:
    """Which path each hooked op runs per role, and why (orchestrator/kernel_paths.py decided;
    ``sources``: each reason's source as well, for ``--explain``)."""
    rows = [(r.name, p) for r in plan.deployment.roles for p in r.kernels]
    if not rows:
        return []
    out = ["Kernels per role (`kernels.<op>`: auto | engine | bundled):"]
    out += _table(["role", "op", "path", "runs"], [[r, p.op, p.path, p.runs] for r, p in rows])
    for r, p in rows:
        out += textwrap.wrap(f"{r} {p.op}: {p.why}", 98, initial_indent="  ",
                             subsequent_indent="    ")
        if p.measured and p.measured != p.why:
            out += textwrap.wrap(f"measurement: {p.measured}", 98, initial_indent="    ",
                                 subsequent_indent="      ")
        if sources:
            out += textwrap.wrap(f"source: {p.source}", 98, initial_indent="    ",
                                 subsequent_indent="      ")
    out.append("")
    return out


def render_markdown(plan: Plan) -> str:
    dep = plan.deployment
    lines = [
        f"### dsv4ctl plan: `{plan.profile_name}` on `{plan.host}`",
        "",
        f"**{summary_line(plan)}** Checks: {_check_counts(plan.checks)}.",
        "",
        f"- engine: {dep.engine_name} {dep.engine_version}; model `{dep.model_variant}` "
        f"(experts {dep.expert_storage}); index_topk {dep.index_topk}; KV {dep.kv_cache_dtype}",
        f"- topology: {_topology(plan)}",
        "",
    ]
    if plan.gpus:
        lines += ["| GPU | role | other | weights | KV pool | headroom | (unused) |",
                  "|---:|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {g.index} | {g.role or '-'} | {_gib(g.preload_bytes + g.req_to_token_bytes)} "
                  f"| {_gib(g.weights_bytes)} | {_gib(g.kv_bytes)} | "
                  f"{_gib(g.headroom_bytes)} | {_gib(g.free_static_bytes)} |" for g in plan.gpus]
        lines += ["", " ".join(GPU_TABLE_LEGEND), ""]
    lines += [f"- KV pool of {c.role} {c.calibrated}" for c in plan.capacity if c.calibrated]
    if any(c.calibrated for c in plan.capacity):
        lines.append("")
    paths = [(r.name, p) for r in plan.deployment.roles for p in r.kernels]
    if paths:
        lines += ["| role | op | path | why |", "|---|---|---|---|"]
        lines += [f"| {r} | {p.op} | {p.path} | {p.why.replace('|', '/')} |" for r, p in paths]
        lines.append("")
    shown = [c for c in plan.checks if c.severity != "info"]
    if shown:
        # a list, not a table: a message is a paragraph, and a table row cannot wrap in a pipe
        for c in shown:
            sev = c.severity + (" (acknowledged)" if c.acknowledged else "")
            where = f" at `{c.location}`" if c.location else ""
            lines.append(f"- **{sev}** `{c.id}`{where}: {c.message}")
            if c.fix and not c.acknowledged:
                lines.append(f"  fix: {c.fix}")
        lines.append("")
    if plan.actions and not plan.errors:
        lines += ["<details><summary>Changes</summary>", "", "```diff"]
        for a in plan.actions:
            sym = {"create": "+", "remove": "-", "start": "+", "stop": "-"}.get(a.kind, "!")
            lines.append(f"{sym} {a.kind} {a.target}" + (f" ({a.reason})" if a.reason else ""))
        lines += ["```", "", "</details>", ""]
        down = _downtime(plan)
        if down:
            lines += [f"Downtime: {down}", ""]
    return "\n".join(lines)


def render_json(plan: Plan, *, include_content: bool = False) -> str:
    data = plan.model_dump(mode="json")
    if not include_content:
        for f in data["files"]:
            f.pop("content", None)
    data["summary"] = {
        "errors": len(plan.errors),
        "warnings": sum(1 for c in plan.checks if c.severity == "warning"),
        "applicable": not plan.errors,
        "changes": len(plan.actions),
        "counts": count_actions(plan.actions),
        "restarts": plan.restarts,
        "line": summary_line(plan),
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
