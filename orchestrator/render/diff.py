"""The review diff of two profiles: what changed, what it does to the service, then the files.

Owns ``dsv4ctl diff``'s content (the CLI only loads inputs and prints). Why not a text diff of the
YAML: a reviewer needs the consequences (which roles restart, and that an engine restart reloads
the model, i.e. minutes of downtime; how per-GPU memory and KV capacity move; which checks appear
or clear), and a profile line like ``index_topk: 1024`` hides the launch-line change it causes. The
order is summary first, details after (helm-diff / Terraform habit), concise by default.

Capacity and checks come from two Plans (:class:`orchestrator.planner_model.Plan`) when the caller
has them. What starts, stops and restarts is not decided here: the caller passes the actions of
:func:`orchestrator.planner.transition.between`, the function ``plan`` and ``apply`` use too, so the
diff's consequences are the ones an apply of NEW on a host running OLD executes.
"""

from __future__ import annotations

import difflib
import html
import json
import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.planner_model import Action, Plan, count_actions, downtime_text, plan_line
from orchestrator.profile.schema import Profile
from orchestrator.render import ReleaseTree

_MISSING = object()


@dataclass(frozen=True)
class FieldChange:
    path: str
    old: Any
    new: Any


@dataclass(frozen=True)
class FileChange:
    path: str
    kind: str  # added | removed | changed | mode
    roles: tuple[str, ...]
    diff: str  # unified diff text


@dataclass
class ReviewDiff:
    fields: list[FieldChange]
    files: list[FileChange]
    actions: list[Action]  # the transition A -> B (planner.transition.between)
    outage: bool  # no engine of A keeps serving through the change
    # a fleet's downtime from its rollout strategy (planner/rollout.py); None: one host's actions
    downtime: str | None = None
    capacity: list[str] = field(default_factory=list)  # human lines, from plans
    checks_added: list[str] = field(default_factory=list)
    checks_cleared: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)  # kernel path changes, with why
    plans_compared: bool = False

    @property
    def has_changes(self) -> bool:
        return bool(self.fields or self.files or self.actions)

    def units(self, kind: str) -> list[Action]:
        return [a for a in self.actions if a.kind == kind]

    @property
    def restarts(self) -> list[str]:
        """Roles restarted, in the actions' order."""
        return [r for a in self.units("restart") for r in a.roles]


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k in value:
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def profile_changes(a: Profile, b: Profile) -> list[FieldChange]:
    """Changed fields (defaults included), as dotted paths, in schema order. A field that is unset
    (null) on one side and absent on the other did not change: switching topology modes used to
    list every unset field of the other mode as ``null -> (absent)``, 45 of 47 lines."""
    fa: dict[str, Any] = {}
    fb: dict[str, Any] = {}
    _flatten(a.model_dump(mode="json", by_alias=True), "", fa)
    _flatten(b.model_dump(mode="json", by_alias=True), "", fb)
    keys = list(fa) + [k for k in fb if k not in fa]
    out = []
    for k in keys:
        old, new = fa.get(k, _MISSING), fb.get(k, _MISSING)
        if {id(old), id(new)} & {id(_MISSING)} and None in (old, new):
            continue
        if old != new:
            out.append(FieldChange(k, old, new))
    return out


def _unified(path: str, old: str, new: str, context: int) -> str:
    return "".join(difflib.unified_diff(
        old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}", n=context))


def file_changes(a: ReleaseTree, b: ReleaseTree, *, context: int = 3) -> list[FileChange]:
    fa, fb = a.files, b.files
    out = []
    for path in sorted(set(fa) | set(fb)):
        old, new = fa.get(path), fb.get(path)
        if old is not None and new is not None and (old.content, old.mode) == (
                new.content, new.mode):
            continue
        roles = tuple(sorted(set(old.roles if old else ()) | set(new.roles if new else ())))
        if old is None:
            kind = "added"
        elif new is None:
            kind = "removed"
        elif old.content == new.content:
            kind = "mode"
        else:
            kind = "changed"
        text = _unified(path, old.content if old else "", new.content if new else "", context)
        if kind == "mode" and old and new:
            text = f"mode {old.mode:04o} -> {new.mode:04o}\n"
        out.append(FileChange(path, kind, roles, text))
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _delta_gib(old: float, new: float) -> str:
    d = (new - old) / 2**30
    return f"{_gib(old)} -> {_gib(new)} ({d:+.1f} GiB)"


def _kernel_lines(pa: Plan, pb: Plan) -> list[str]:
    """A change of kernel path per role and op (orchestrator/kernel_paths.py decided both)."""
    out = []
    ka = {(r.name, k.op): k for r in pa.deployment.roles for k in r.kernels}
    for r in pb.deployment.roles:
        for k in r.kernels:
            old = ka.get((r.name, k.op))
            if old is not None and old.path != k.path:
                out.append(f"{r.name} {k.op}: {old.path} ({old.runs}) -> {k.path} ({k.runs}): "
                           f"{k.why}")
    return out


def _plan_lines(pa: Plan, pb: Plan) -> tuple[list[str], list[str], list[str]]:
    cap: list[str] = []
    ga = {g.index: g for g in pa.gpus}
    gb = {g.index: g for g in pb.gpus}
    for i in sorted(set(ga) | set(gb)):
        x, y = ga.get(i), gb.get(i)
        if x is None or y is None:
            cap.append(f"GPU {i}: {'now used' if x is None else 'no longer used'}"
                       f" ({(y or x).role or 'idle'})")  # type: ignore[union-attr]
            continue
        parts = []
        for name, attr in (("weights", "weights_bytes"), ("KV", "kv_bytes"),
                           ("headroom", "headroom_bytes")):
            o, n = getattr(x, attr), getattr(y, attr)
            if _gib(o) != _gib(n):  # below display precision is noise, not a change
                parts.append(f"{name} {_delta_gib(o, n)}")
        if x.role != y.role:
            parts.insert(0, f"role {x.role or 'idle'} -> {y.role or 'idle'}")
        if parts:
            cap.append(f"GPU {i} ({y.role or 'idle'}): " + ", ".join(parts))
    ra = {r.role: r for r in pa.capacity}
    rb = {r.role: r for r in pb.capacity}
    for role in [r.role for r in pb.capacity] + [r for r in ra if r not in rb]:
        x, y = ra.get(role), rb.get(role)
        if x is None or y is None:
            continue
        parts = []
        if x.token_capacity != y.token_capacity:
            parts.append(f"KV capacity {x.token_capacity:,} -> {y.token_capacity:,} tokens "
                         f"({y.token_capacity - x.token_capacity:+,})")
        if x.weights_per_rank_bytes != y.weights_per_rank_bytes:
            w = _delta_gib(x.weights_per_rank_bytes, y.weights_per_rank_bytes)
            parts.append(f"weights per GPU {w}")
        if x.kv_pool_bytes_per_rank != y.kv_pool_bytes_per_rank:
            kv = _delta_gib(x.kv_pool_bytes_per_rank, y.kv_pool_bytes_per_rank)
            parts.append(f"KV pool per GPU {kv}")
        if parts:
            cap.append(f"{role}: " + ", ".join(parts))

    def key(c: Any) -> tuple[str, str]:
        return (c.id, c.subject or "")

    def show(c: Any) -> str:
        subj = f" [{c.subject}]" if c.subject else ""
        ack = " (acknowledged)" if c.acknowledged else ""
        return f"{c.severity} {c.id}{subj}: {c.title}{ack}"

    ca = {key(c): c for c in pa.checks}
    cb = {key(c): c for c in pb.checks}
    added = [show(c) for k, c in cb.items() if k not in ca or ca[k].severity != c.severity]
    cleared = [show(c) for k, c in ca.items() if k not in cb or cb[k].severity != c.severity]
    return cap, added, cleared


def review(a: Profile, b: Profile, tree_a: ReleaseTree, tree_b: ReleaseTree, *,
           actions: list[Action], outage: bool = False, plans: tuple[Plan, Plan] | None = None,
           context: int = 3) -> ReviewDiff:
    d = ReviewDiff(
        fields=profile_changes(a, b),
        files=file_changes(tree_a, tree_b, context=context),
        actions=actions,
        outage=outage,
    )
    if plans is not None:
        d.capacity, d.checks_added, d.checks_cleared = _plan_lines(*plans)
        d.kernels = _kernel_lines(*plans)
        d.plans_compared = True
    return d


def _show(v: Any) -> str:
    if v is _MISSING:
        return "(absent)"
    return json.dumps(v, sort_keys=True)


_SYMBOL = {"restart": "~>", "start": "+", "stop": "-"}


def _consequences(d: ReviewDiff) -> list[str]:
    lines = [f"kernel path: {line}" for line in d.kernels]
    for a in (x for x in d.actions if x.kind in _SYMBOL):
        role = a.roles[0] if a.roles else a.target
        why = "; ".join(x for x in (a.reason, downtime_text(a)) if x)
        lines.append(f"{_SYMBOL[a.kind]} {a.kind} {role} ({a.target}): {why}")
    if d.downtime is not None:
        lines.append(f"downtime: {d.downtime}")
    elif d.outage:
        lines.append("downtime: a full outage; no engine of the old release keeps serving, so "
                     "requests fail until the new engines are ready (minutes)")
    elif any(a.downtime == "minutes" for a in d.actions):
        lines.append("downtime: requests fail until every restarted engine is ready again")
    elif not d.units("restart") and not d.units("stop") and d.files:
        lines.append("no restart: only files no running process reads changed")
    return lines


def format_text(d: ReviewDiff, *, verbose: bool = False) -> str:
    return "".join(text for text, _ in text_blocks(d, verbose=verbose))


def text_blocks(d: ReviewDiff, *, verbose: bool = False) -> list[tuple[str, bool]]:
    """The text review as ``(text, verbatim)`` blocks: the prose may be fitted to a terminal,
    each file's unified diff is verbatim (folding it would break it as a patch)."""
    if not d.has_changes:
        return [("No differences.\n", False)]
    blocks: list[tuple[str, bool]] = []
    out: list[str] = []
    restart_files = [f for f in d.files if f.roles]
    out.append(f"Diff: {len(d.fields)} field(s) changed, {len(d.files)} file(s) differ.")
    out.append(plan_line(d.actions))
    out.append("")
    out.append("Profile changes:")
    out += [f"  {c.path}: {_show(c.old)} -> {_show(c.new)}" for c in d.fields] or ["  (none)"]
    out.append("")
    out.append("Consequences:")
    out += [f"  {line}" for line in _consequences(d)] or ["  none"]
    if d.plans_compared:
        out.append("")
        out.append("Capacity:")
        out += [f"  {line}" for line in d.capacity] or ["  unchanged"]
        out.append("Checks:")
        out += [f"  + {c}" for c in d.checks_added] + [f"  - {c}" for c in d.checks_cleared] \
            or ["  unchanged"]
    else:
        out.append("")
        out.append("Capacity and checks: not compared (no plans)")
    out.append("")
    out.append("Files:")
    for f in d.files:
        roles = f" (restarts {', '.join(f.roles)})" if f.roles else ""
        out.append(f"  {f.kind:8} {f.path}{roles}")
    shown = d.files if verbose else restart_files
    for f in shown:
        if f.diff:
            out.append("")
            blocks.append(("\n".join(out) + "\n", False))
            out = []
            blocks.append((f.diff.rstrip("\n") + "\n", True))
    hidden = len([f for f in d.files if f.diff]) - len([f for f in shown if f.diff])
    if hidden:
        out.append("")
        out.append(f"({hidden} diff(s) of files that restart nothing hidden; -v shows them)")
    if out:
        blocks.append(("\n".join(out) + "\n", False))
    return blocks


def _longest_backticks(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def _md_code(text: str) -> str:
    """Inline code in a table cell: a fence longer than any backtick run, pipes escaped."""
    text = text.replace("|", "\\|").replace("\n", " ")
    fence = "`" * (_longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def format_json(d: ReviewDiff) -> str:
    """The same review for tools: the actions and their counts exactly as ``plan --format json``
    reports them."""
    data = {
        "fields": [{"path": c.path, "old": None if c.old is _MISSING else c.old,
                    "new": None if c.new is _MISSING else c.new,
                    "absent": [s for s, v in (("old", c.old), ("new", c.new)) if v is _MISSING]}
                   for c in d.fields],
        "files": [{"path": f.path, "kind": f.kind, "roles": list(f.roles)} for f in d.files],
        "actions": [a.model_dump(mode="json") for a in d.actions],
        "summary": {"fields": len(d.fields), "files": len(d.files), "outage": d.outage,
                    "downtime": d.downtime,
                    "changes": len(d.actions), "counts": count_actions(d.actions),
                    "restarts": d.restarts, "line": plan_line(d.actions)},
    }
    if d.plans_compared:
        data.update(capacity=d.capacity, checks_added=d.checks_added,
                    checks_cleared=d.checks_cleared, kernels=d.kernels)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def format_markdown(d: ReviewDiff, *, verbose: bool = False) -> str:
    if not d.has_changes:
        return "**dsv4ctl diff:** no differences.\n"
    out: list[str] = ["### dsv4ctl diff", ""]
    out.append(f"**{len(d.fields)}** field(s) changed, **{len(d.files)}** file(s) differ.")
    out += ["", f"**{plan_line(d.actions)}**"]
    out += ["", "#### Profile changes", "", "| field | old | new |", "|---|---|---|"]
    for c in d.fields:
        out.append(f"| {_md_code(c.path)} | {_md_code(_show(c.old))} | {_md_code(_show(c.new))} |")
    out += ["", "#### Consequences", ""]
    out += [f"- {line}" for line in _consequences(d)] or ["- none"]
    if d.plans_compared:
        out += ["", "#### Capacity", ""]
        out += [f"- {line}" for line in d.capacity] or ["- unchanged"]
        out += ["", "#### Checks", ""]
        out += [f"- added: {c}" for c in d.checks_added]
        out += [f"- cleared: {c}" for c in d.checks_cleared]
        if not (d.checks_added or d.checks_cleared):
            out.append("- unchanged")
    out += ["", "#### Files", ""]
    shown = d.files if verbose else [f for f in d.files if f.roles]
    for f in d.files:
        roles = f" (restarts {', '.join(f.roles)})" if f.roles else ""
        out.append(f"- {f.kind} `{f.path}`{roles}")
    for f in shown:
        if f.diff:
            fence = "`" * max(3, _longest_backticks(f.diff) + 1)
            out += ["", f"<details><summary>{html.escape(f.path)}</summary>", "", fence + "diff",
                    f.diff.rstrip("\n"), fence, "", "</details>"]
    return "\n".join(out) + "\n"
