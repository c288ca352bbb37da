"""`dsv4ctl validate`, `schema`, `plan` and `catalog`: the read-only commands.

None of them touches a host unless ``plan --live`` asks for live facts; none imports torch, triton or
fabric (``plan --live`` imports the remote layer only when it is used).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.common import accept_new_host_key_opt
from orchestrator.cli.options import (
    debug_option,
    detail_option,
    host_option,
    inventory_option,
    profile_option,
)
from orchestrator.cli.output import echo, echo_blocks, format_option, table
from orchestrator.cli.rerun import Target, complete_checks, complete_plan
from orchestrator.errors import ExitCode


def _profile_arg(required: bool = False) -> Callable[[Any], Any]:
    return click.argument("profile", required=required,
                          type=click.Path(dir_okay=False, path_type=Path))


_inventory_opt = inventory_option()


@click.command()
@_profile_arg(required=False)
@profile_option(operand="profile")
@_inventory_opt
@detail_option()
@format_option(("text", "json"))
def validate(profile: Path | None, inventory: Path | None, verbose: bool, fmt: str) -> int:
    """Check a profile without a host: its shape, and every check `plan` makes that needs no host
    facts (catalog ids and enums, engine rules and flags, topology, ports).

    Every finding names file:line:col, the field, the value, the reason and a fix. `dsv4ctl plan`
    runs the same checks and adds those that need the host (GPUs, disks, ports in use).
    """
    from orchestrator.paths import default_profile
    from orchestrator.planner.report import check_lines
    from orchestrator.planner.static import check_profile

    path = profile or default_profile()
    p, checks = check_profile(path, inventory)
    errors = [c for c in checks if c.severity == "error" and not c.acknowledged]
    if fmt == "json":
        echo(json.dumps({"ok": not errors, "profile": str(path), "name": p.name,
                         "checks": [c.model_dump(mode="json") for c in complete_checks(checks)]},
                        indent=2, sort_keys=True), raw=True)
        return int(ExitCode.ERROR) if errors else 0
    shown = [c for c in checks if verbose or c.severity != "info"]
    for c in shown:
        for line in check_lines(c, verbose=verbose):
            echo(line)
    if errors:
        echo(f"{path}: {len(errors)} error(s); `dsv4ctl plan` would refuse it too")
        return int(ExitCode.ERROR)
    echo(f"{path}: valid profile '{p.name}' ({p.topology.mode}, model {p.model.variant})")
    return 0


@click.command()
@click.option("--inventory-schema", is_flag=True, help="Print the inventory schema instead.")
def schema(inventory_schema: bool) -> int:
    """Print the JSON Schema of profiles (or inventories) for editor completion.

    \b
    VS Code / yaml-language-server: save it and add at the top of a profile
      # yaml-language-server: $schema=./dsv4ctl.schema.json
    """
    if inventory_schema:
        from orchestrator.profile import Inventory
        from orchestrator.profile.jsonschema import json_schema

        data = json_schema(Inventory, "dsv4ctl inventory")
    else:
        from orchestrator.planner.jsonschema import profile_schema

        data = profile_schema()
    echo(json.dumps(data, indent=2, sort_keys=True), raw=True)
    return 0


@click.command()
@_profile_arg(required=False)
@profile_option(operand="profile")
@_inventory_opt
@host_option()
@click.option("--live", is_flag=True,
              help="Probe the host over SSH and plan against its live facts (a fleet: every host, "
                   "in parallel; with --host, only that host or group). Default: the inventory's "
                   "declared facts.")
@format_option(help_text="json is versioned (field 'format'); markdown suits PR comments.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Save the plan (with file contents) for `dsv4ctl apply PLAN.json`.")
@click.option("--detailed-exitcode", is_flag=True,
              help="Exit 2 when the plan has changes, 0 when none (1 on errors).")
@detail_option()
@debug_option()
@click.option("--explain", is_flag=True,
              help="Also show the arithmetic per role: every term of a GPU's memory (adding up to "
                   "its capacity), the KV pool's bytes per token term by term, page rounding.")
@click.option("--replace", "replace_roles", metavar="ROLE", multiple=True,
              help="Restart ROLE even if nothing it reads changed (repeatable), shown as an "
                   "action like any other restart.")
@accept_new_host_key_opt
def plan(profile: Path | None, inventory: Path | None, host_name: str | None, live: bool,
         fmt: str, out: Path | None, detailed_exitcode: bool, verbose: bool,
         explain: bool, replace_roles: tuple[str, ...]) -> int:
    """Prove a profile fits its host (or every host of its fleet) and show what applying it would
    change.

    PROFILE defaults to the embedded profiles/default.yaml and its inventory's declared host, so it
    works with no host reachable; --live probes the host over SSH instead. The plan shows weights,
    KV pool and headroom per GPU, the checkpoint against free disk, every check (errors block apply;
    warnings can be acknowledged in the profile by id), and the files and restarts an apply would
    make. A fleet (`hosts:` in the profile) is planned host by host with each host's own facts, with
    a summary of the hosts first; there --host NAME (a member or a group) is the part --live probes.

    With --live, what was changed on the host outside dsv4ctl (a release file edited, an installed
    unit changed, the release directory removed) is listed as actions with that reason: apply
    repairs it, with the restarts it implies. --replace ROLE restarts a role nothing changed for.
    """
    from orchestrator.planner.fleet import load_fleet, plan_fleet, probe_fleet
    from orchestrator.planner.fleet_report import (
        render_fleet_json,
        render_fleet_markdown,
        render_fleet_text,
    )

    fctx = load_fleet(profile, inventory, host_override=host_name)
    facts = None
    if host_name is not None and not live and fmt == "text":
        # `plan --host NAME` probed before --host meant the same on every command: say what it does
        echo(f"note: --host {host_name} planned against declared facts; add --live to probe it "
             "over SSH", err=True)
    if live:
        from orchestrator.remote import gather_facts  # fabric: only when probing

        paths, env = [fctx.profile.model.path], fctx.profile.engine.env
        facts = probe_fleet(fctx, lambda name, host: gather_facts(name, host, model_paths=paths,
                                                                  engine_env=env),
                            only=fctx.focus)
    result = plan_fleet(fctx, facts, replace_roles=replace_roles)
    saved = None
    if out is not None:
        saved = _save(result, out, Target(profile, inventory, host_name))
    if fmt != "text":  # a document prints raw: its fixes' commands carry this run's target too
        result = complete_plan(result)
    if fmt == "json":
        echo(render_fleet_json(result), nl=False, raw=True)
    elif fmt == "markdown":  # a document: never folded to the terminal
        echo(render_fleet_markdown(result), nl=False, raw=True)
        if explain:
            from orchestrator.planner.explain import render_explain

            for p in result.plans:
                if p.capacity:
                    echo(f"<details><summary>Explain{'' if len(result.plans) == 1 else ' ' + p.host}"
                         f"</summary>\n\n```\n{render_explain(p)}```\n\n</details>", raw=True)
    else:
        echo(render_fleet_text(result, verbose=verbose), nl=False)
        if explain:
            from orchestrator.planner.explain import render_explain

            for p in result.plans:
                if not p.capacity:
                    continue
                echo("\nExplain:" if len(result.plans) == 1 else f"\nExplain ({p.host}):")
                echo(render_explain(p), nl=False)
        if saved is not None:  # the command on a line of its own, whole: copied, it runs
            echo_blocks([(saved[0] + "\n", False)] + ([("  " + saved[1] + "\n", True)]
                                                       if saved[1] else []))
    if result.errors:
        return int(ExitCode.ERROR)
    if detailed_exitcode and result.has_changes:
        return int(ExitCode.CHANGES)
    return 0


def _save(result: Any, out: Path, target: Target) -> tuple[str, str | None]:
    """Save the plan ``-o`` asked for when apply could run it, and say what was done (and the
    command to run next): a plan with errors is not written (apply refuses it), one of declared
    facts is written for review only (apply needs the live host's), and only an applyable one is
    advertised with the apply command."""
    from orchestrator.planner.build import save_plan

    if result.errors:
        return (f"Not saved to {out}: the plan has {len(result.errors)} error(s), and apply "
                "refuses a plan with errors; fix them and plan again.", None)
    save_plan(result.plans[0] if len(result.plans) == 1 else result, out)
    if any(p.facts_source != "probed" for p in result.plans):
        return (f"Saved plan to {out} for review only: it was made from the inventory's declared "
                "facts, and apply needs one made against the host:",
                target.command("plan", "--live", "-o", str(out)))
    return (f"Saved plan to {out}. Apply it with:",
            target.command("apply", str(out), with_profile=False))


@click.command()
@click.argument("what", type=click.Choice(["models", "gpus", "engines"]), default="models")
@format_option(("text", "json"))
def catalog(what: str, fmt: str) -> int:
    """List what the catalog knows: model variants, GPUs or engine versions."""
    from orchestrator.catalog import load_catalog

    cat = load_catalog()
    if what == "models":
        headers = ["variant", "checkpoint", "experts", "rest", "size", "modules"]
        rows = [[v.id, v.hf_repo, v.expert_format, v.dense_format,
                 f"{v.checkpoint_bytes.value / 1e9:.1f} GB ({v.checkpoint_bytes.confidence})",
                 "+".join(v.modules)] for v in cat.variants]
    elif what == "gpus":
        headers = ["gpu", "arch", "memory", "bandwidth", "link", "nvidia-smi names"]
        rows = [[g.id, g.arch, f"{g.memory_mib.value:,} MiB", f"{g.memory_bandwidth_gbps.value} GB/s",
                 "NVLink" if g.nvlink else "PCIe",
                 ", ".join(f"{n.value} ({n.confidence})" for n in g.nvidia_smi_names)]
                for g in cat.gpus]
    else:
        headers = ["package", "version", "kind"]
        rows = ([[e.engine, e.version, "engine"] for e in cat.engines]
                + [[r.engine, r.version, "router"] for r in cat.routers])
    if fmt == "json":
        echo(json.dumps([dict(zip(headers, r, strict=True)) for r in rows], indent=2), raw=True)
    else:
        table(headers, rows)
    return 0


def register(group: click.Group) -> None:
    for cmd in (validate, schema, plan, catalog):
        group.add_command(cmd)
