"""Presenting a FleetPlan: the fleet summary (hosts x fits / checks / changes) first, then each
host's plan as ``dsv4ctl plan`` prints a single host (:mod:`orchestrator.planner.report`).

The fleet of one prints exactly its one plan, byte for byte as before fleets existed: the single
host is the fleet of one, not a second format.
"""

from __future__ import annotations

import json

from orchestrator.planner.report import (
    _table,
    check_lines,
    render_json,
    render_markdown,
    render_text,
    summary_line,
)
from orchestrator.planner_model import FleetPlan


def _single(fp: FleetPlan) -> bool:
    return len(fp.plans) == 1


def _router_line(fp: FleetPlan) -> str:
    if fp.router_on is None:
        return "  router: none"
    r = next((p.deployment.router for p in fp.plans if p.host == fp.router_on), None)
    if r is None:  # a plan narrowed to some hosts (apply --host): the router's is not shown
        return f"  router: on {fp.router_on}"
    where = "a host of its own" if fp.router_only_host else "a fleet host"
    if r.pd:
        what = f"PD, {len(r.prefill)} prefill + {len(r.decode)} decode"
    else:
        what = f"{len(r.worker_urls)} engines"
    return f"  router: on {fp.router_on} ({where}), {r.host}:{r.port}, {what}"


def fleet_summary_lines(fp: FleetPlan) -> list[str]:
    rows = [[s.host, ",".join(s.roles) or "-", "yes" if s.fits else "NO", str(s.errors),
             str(s.warnings), str(s.changes), str(s.restarts)] for s in fp.summary()]
    failed = fp.failed_hosts
    own = [c for c in fp.checks if c.severity != "info"]
    lines = [
        f"dsv4ctl plan: {fp.profile_name}  (fleet of {len(fp.hosts)} engine host"
        f"{'s' if len(fp.hosts) != 1 else ''}: {', '.join(fp.hosts)})",
        _router_line(fp),
        "",
        *_table(["host", "runs", "fits", "errors", "warnings", "changes", "restarts"], rows),
        "",
    ]
    if fp.checks:
        lines.append("Fleet checks:")
        for c in fp.checks:
            lines += check_lines(c)
        lines.append("")
    if failed:
        lines.append(f"Host{'s' if len(failed) > 1 else ''} {', '.join(failed)} do"
                     f"{'es' if len(failed) == 1 else ''} not fit: the fleet plan has errors "
                     "there (details below); the other hosts' plans stand.")
    elif any(c.severity == "error" for c in own):
        lines.append("The fleet plan has errors (fleet checks above).")
    else:
        lines.append(f"Fleet: {len(fp.plans)} host plans, {sum(1 for p in fp.plans if p.actions)}"
                     " with changes.")
    if fp.downtime and not fp.errors:
        lines.append(f"  downtime: {fp.downtime}")
    return lines


def render_fleet_text(fp: FleetPlan, *, verbose: bool = False) -> str:
    if _single(fp):
        return render_text(fp.plans[0], verbose=verbose)
    parts = ["\n".join(fleet_summary_lines(fp)) + "\n"]
    for p in fp.plans:
        parts.append(f"\n=== host {p.host} ===\n" + render_text(p, verbose=verbose))
    errors = error_lines(fp)
    if errors:
        parts.append(f"\nThe fleet plan has {len(errors)} error{'s' if len(errors) > 1 else ''}; "
                     "nothing can be applied until they are fixed:\n"
                     + "".join(f"  {line}\n" for line in errors))
    return "".join(parts)


def error_lines(fp: FleetPlan) -> list[str]:
    """Each unacknowledged error of the fleet, with the host it is about in front."""
    out = [f"fleet: {c.id}: {c.title}" for c in fp.checks
           if c.severity == "error" and not c.acknowledged]
    out += [f"host {p.host}: {c.id}: {c.title}" for p in fp.plans for c in p.errors]
    return out


def render_fleet_markdown(fp: FleetPlan) -> str:
    if _single(fp):
        return render_markdown(fp.plans[0])
    rows = ["| host | runs | fits | errors | warnings | changes | restarts |",
            "|---|---|---|---:|---:|---:|---:|"]
    rows += [f"| `{s.host}` | {','.join(s.roles) or '-'} | {'yes' if s.fits else '**NO**'} | "
             f"{s.errors} | {s.warnings} | {s.changes} | {s.restarts} |" for s in fp.summary()]
    head = [f"## dsv4ctl plan: `{fp.profile_name}` on fleet {', '.join(fp.hosts)}", "",
            _router_line(fp).strip(), "", *rows, ""]
    for c in fp.checks:
        if c.severity != "info":
            head.append(f"- **{c.severity}** `{c.id}`: {c.message}")
    return "\n".join(head) + "\n" + "".join(render_markdown(p) for p in fp.plans)


def render_fleet_json(fp: FleetPlan) -> str:
    """A fleet of one is its plan's JSON as before; a larger fleet is one document with every
    host's plan (as ``render_json`` gives it) under ``plans``."""
    if _single(fp):
        return render_json(fp.plans[0])
    data = fp.model_dump(mode="json", exclude={"plans"})
    data["plans"] = [json.loads(render_json(p)) for p in fp.plans]
    data["summary"] = {
        "hosts": [s.model_dump(mode="json") for s in fp.summary()],
        "failed_hosts": fp.failed_hosts,
        "errors": len(fp.errors),
        "error_lines": error_lines(fp),
        "changes": sum(len(p.actions) for p in fp.plans),
        "line": "; ".join(f"{p.host}: {summary_line(p)}" for p in fp.plans),
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
