"""`dsv4ctl render` and `dsv4ctl diff`: the release tree a host would receive, and the review diff.

Thin adapters over :mod:`orchestrator.render` and :mod:`orchestrator.render.diff`: load and resolve
the inputs, call the library, print. Nothing here touches a host; jinja2 is imported inside the
command bodies (through the renderer).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.options import detail_option, host_option, inventory_option, profile_option
from orchestrator.cli.output import echo, echo_blocks, format_option
from orchestrator.errors import DsvError, ExitCode, InputError, Problem

if TYPE_CHECKING:
    from orchestrator.render import ReleaseTree


class _Side:
    """One side of a render or diff: the profile, its deployment, its tree and (maybe) its plan.

    Resolution is the planner's (``orchestrator.planner.build``): the same host lookup and catalog
    defaults as ``dsv4ctl plan``, so render, diff and plan never disagree about a value. Text from
    ``git show`` is planned from memory; its inventory is the one the working copy would use.
    """

    def __init__(self, text: str, label: str, profile_path: Path | None, inventory: Path | None,
                 *, want_plan: bool, host_name: str | None = None, live: bool = False) -> None:
        from orchestrator.catalog.errors import CatalogError
        from orchestrator.planner.build import build_plan, resolve_deployment
        from orchestrator.planner.fleet import fleet_context, plan_fleet
        from orchestrator.profile.loader import load_text
        from orchestrator.profile.schema import Profile
        from orchestrator.render import render_release

        self.label = label
        self.profile = load_text(Profile, text, label)
        fctx = fleet_context(self.profile, text, Path(label), None if profile_path is None
                             else _inventory_for(profile_path, inventory))
        self.fleet = fctx
        names = [n for n, _ in fctx.all_hosts]
        name = host_name or names[0]
        if name not in names:
            raise DsvError(f"--host {name!r} is not a host of {label}'s fleet ({', '.join(names)})",
                           fix=f"use one of: {', '.join(names)}")
        ctx = fctx.context(name, dict(fctx.all_hosts)[name])
        try:
            self.deployment = resolve_deployment(ctx)
            if live:  # the host's probed facts: its stored kernel measurement decides paths
                from orchestrator.remote import gather_facts

                facts = gather_facts(ctx.host_name, ctx.host, model_paths=[ctx.profile.model.path],
                                     engine_env=ctx.profile.engine.env)
                self.deployment = build_plan(ctx, facts).deployment
            self.tree = render_release(self.profile, self.deployment)
            self.plan = None
            self.fleet_plan = None
            if want_plan and fctx.is_fleet:
                self.fleet_plan = plan_fleet(fctx)
                self.plan = self.fleet_plan.plan(name)
            elif want_plan:
                self.plan = build_plan(ctx)
        except CatalogError as exc:  # as plan_from_paths does: a typed error, never a traceback
            raise DsvError(f"{label}: {exc}", fix=getattr(exc, "fix", None)) from None


def _inventory_for(profile_path: Path, explicit: Path | None) -> Path | None:
    from orchestrator.planner.build import inventory_path_for

    return inventory_path_for(profile_path, explicit)


def _read(path: Path) -> str:
    from orchestrator.profile.loader import read_file

    return read_file(path)


_inventory_opt = inventory_option()
_host_opt = host_option()


@click.command()
@click.argument("profile", required=False, type=click.Path(dir_okay=False, path_type=Path))
@profile_option(operand="profile")
@_inventory_opt
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Write the release tree into this directory.")
@click.option("--stdout", "to_stdout", is_flag=True, hidden=True,
              help="Print the tree (the default without -o); kept for old scripts.")
@click.option("--textconv", is_flag=True,
              help="For git diff: print the profile followed by its rendered tree; a profile that "
                   "does not render prints its error instead of failing the whole git diff.")
@_host_opt
@click.option("--live", is_flag=True,
              help="Render from the host's probed facts, as `plan --live` does: each op's kernel "
                   "path follows the host's stored `dsv4ctl qualify kernels` measurement.")
def render(profile: Path | None, inventory: Path | None, out_dir: Path | None, to_stdout: bool,
           textconv: bool, host_name: str | None, live: bool) -> int:
    """Render the release tree a host would receive for PROFILE: into DIR with -o, else every file
    of the tree to stdout, one after another (for review; `-` reads the profile from stdin).

    \b
    Layout (relative to <install_root>/releases/<id>/):
      units/dsv4-<name>-<role>.service   systemd units (router after the engines)
      bin/launch-<role>.sh               launch scripts; every argument shell-quoted
      env/<role>.env                     non-secret environment (CUDA_VISIBLE_DEVICES, ...)
      monitoring/                        Prometheus scrape config (and rules, dashboards)
      profile.yaml                       the resolved profile (every default written out)
      manifest.json                      sha256, mode and restart roles of every file
    Secrets never enter a release: units read <install_root>/secrets/<name>.env (0600).
    Same profile, byte-identical files. A fleet profile renders every host (with -o, each into
    DIR/<host>/), or the one --host names.
    """
    from orchestrator.paths import default_profile

    to_stdout = to_stdout or out_dir is None
    path = profile or default_profile()
    text = _read(path)
    if textconv:
        echo(f"# ---- {path.name} (profile source) ----\n{text.rstrip()}\n", raw=True)
        try:
            side = _Side(text, str(path), path, inventory, want_plan=False)
        except DsvError as exc:
            echo(f"# ---- rendering failed ----\n{exc.render()}", raw=True)
            return 0
        echo("# ---- rendered release tree ----", raw=True)
        echo(side.tree.to_text(), nl=False, raw=True)
        return 0
    side = _Side(text, str(path), path, inventory, want_plan=False, host_name=host_name,
                 live=live)
    if live and side.fleet.is_fleet and host_name is None:
        raise DsvError("render --live of a fleet needs the host named",
                       fix="add --host NAME (one of: "
                           + ", ".join(n for n, _ in side.fleet.all_hosts) + ")")
    if side.fleet.is_fleet and host_name is None:
        return _render_fleet(side, text, path, inventory, out_dir, to_stdout)
    if to_stdout:
        echo(side.tree.to_text(), nl=False, raw=True)
    if out_dir is not None:
        written = _write_out(out_dir, side.tree)
        restarts = sorted({r for f in side.tree.files.values() for r in f.roles})
        echo(f"Rendered {len(written)} files of '{side.profile.name}' into {out_dir} "
                   f"(tree {side.tree.digest()}; roles {', '.join(restarts)})",
                   err=to_stdout)
    return 0


def _render_fleet(first: _Side, text: str, path: Path, inventory: Path | None,
                  out_dir: Path | None, to_stdout: bool) -> int:
    """Every host's tree of a fleet, in rollout order; into DIR/<host>/ with -o."""
    for name, _ in first.fleet.all_hosts:
        side = _Side(text, str(path), path, inventory, want_plan=False, host_name=name)
        if to_stdout:
            echo(f"# ==== host {name} ====", raw=True)
            echo(side.tree.to_text(), nl=False, raw=True)
        if out_dir is not None:
            target = out_dir / name
            written = _write_out(target, side.tree)
            echo(f"Rendered {len(written)} files of '{side.profile.name}' for host {name} into "
                 f"{target} (tree {side.tree.digest()})", err=to_stdout)
    return 0


def _write_out(out_dir: Path, tree: ReleaseTree) -> list[Path]:
    """Write ``tree`` into ``out_dir``: an empty directory or one render made, removing only the
    files render wrote there that the new tree no longer has (orchestrator.render.outdir)."""
    from orchestrator.render import outdir

    outdir.prepare(out_dir, set(tree.all_files()))
    written = tree.write(out_dir)
    outdir.record(out_dir, written)
    return written


def _git_show(rev: str, path: Path) -> tuple[str, str]:
    """(text, label) of ``path`` at git revision ``rev``."""
    folder = path.resolve().parent
    try:
        top = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except FileNotFoundError:
        raise DsvError("git is not installed",
                       fix="install git or use `dsv4ctl diff A B`") from None
    except subprocess.CalledProcessError as exc:
        raise DsvError(f"{path} is not inside a git repository: {exc.stderr.strip()}",
                       fix="use `dsv4ctl diff OLD NEW` with two files") from None
    rel = path.resolve().relative_to(Path(top).resolve()).as_posix()
    if rev.startswith("-"):
        raise DsvError(f"--git {rev!r}: a revision cannot start with '-' (git would read it as an "
                       "option, e.g. --output=FILE writes a file)",
                       fix="pass a commit, branch or tag, e.g. --git HEAD~1")
    # --end-of-options: whatever rev is, git reads it as a revision, never as an option (issue 19)
    res = subprocess.run(["git", "-C", top, "show", "--end-of-options", f"{rev}:{rel}"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise InputError(kind=f"{rev}:{rel}", problems=[Problem(
            "", f"git cannot show {rel} at {rev}: {res.stderr.strip()}", file=f"{rev}:{rel}",
            fix="check the revision (git log -- " + rel + ") and the path")])
    return res.stdout, f"{rev}:{rel}"


@click.command()
@click.argument("profiles", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@_host_opt
@click.option("--git", "rev", metavar="REV", default=None,
              help="Compare PROFILE as of git revision REV with the working copy.")
@_inventory_opt
@click.option("--context", "-U", "context", type=click.IntRange(0, 1000), default=3,
              show_default=True, help="Lines of context in the file diffs.")
@detail_option()
@format_option(("text", "markdown", "json"),
               help_text="markdown suits a pull-request comment; json has the actions and counts "
                         "`plan --format json` has.")
@click.option("--detailed-exitcode", is_flag=True,
              help="Exit 2 when the two differ, 0 when they do not (1 on errors).")
def diff(profiles: tuple[Path, ...], host_name: str | None, rev: str | None,
         inventory: Path | None, context: int, verbose: bool, fmt: str,
         detailed_exitcode: bool) -> int:
    """Review a profile change: fields, consequences, then the rendered files.

    \b
      dsv4ctl diff OLD.yaml NEW.yaml
      dsv4ctl diff --git HEAD profiles/default.yaml     working copy against HEAD
      dsv4ctl diff --git main profiles/x.yaml --format markdown > comment.md

    Shows which fields changed, which roles restart (an engine restart reloads the model: minutes of
    downtime), how weights, KV pool and KV capacity per GPU move and which checks appear or clear
    (from the two plans), then unified diffs of the rendered files. The operands are the two
    profiles (there is no -p: diff compares two). A fleet profile is compared on the host --host
    names (default: the fleet's first host).
    """
    from orchestrator.planner.transition import between, outage, release_from_planned
    from orchestrator.render.diff import format_json, format_markdown, review, text_blocks

    if rev is not None:
        if len(profiles) != 1:
            raise DsvError("--git REV takes exactly one PROFILE",
                           fix="dsv4ctl diff --git HEAD profiles/default.yaml")
        new_path = profiles[0]
        old_text, old_label = _git_show(rev, new_path)
        old_path_hint = new_path
    else:
        if len(profiles) != 2:
            raise DsvError("give two profiles (OLD NEW), or --git REV PROFILE",
                           fix="dsv4ctl diff profiles/default.yaml my.yaml")
        old_path_hint, new_path = profiles
        old_text, old_label = _read(old_path_hint), str(old_path_hint)
    new_text = _read(new_path)
    a = _Side(old_text, old_label, old_path_hint, inventory, want_plan=True, host_name=host_name)
    b = _Side(new_text, str(new_path), new_path, inventory, want_plan=True, host_name=host_name)
    assert a.plan is not None and b.plan is not None
    # what applying B to a host that runs A does: the transition plan and apply compute
    actions = between(a.plan.files, b.plan.files)
    d = review(a.profile, b.profile, a.tree, b.tree, actions=actions,
               outage=outage(actions, release_from_planned(a.plan.files)),
               plans=(a.plan, b.plan), context=context)
    if a.fleet_plan is not None and b.fleet_plan is not None:
        d = _fleet_downtime(d, a.fleet_plan, b.fleet_plan, b.profile)
    if fmt == "json":
        echo(format_json(d), nl=False, raw=True)
    elif fmt == "markdown":  # a document for a PR comment: never folded (tables, bullets, diffs)
        echo(format_markdown(d, verbose=verbose), nl=False, raw=True)
    else:
        echo_blocks(text_blocks(d, verbose=verbose))
    if detailed_exitcode and d.actions:  # exit 2 when applying NEW over OLD would do something
        return int(ExitCode.CHANGES)
    return 0


def _fleet_downtime(d: Any, a: Any, b: Any, profile: Any) -> Any:
    """A fleet's change: the downtime its rollout strategy gives (every host's transition from
    A to B, in B's waves), in place of the one host's."""
    import dataclasses

    from orchestrator.planner.rollout import fleet_downtime
    from orchestrator.planner.transition import between

    old = {p.host: p for p in a.plans}
    actions = {p.host: between(old[p.host].files if p.host in old else [], p.files)
               for p in b.plans}
    roles = {p.host: [r.name for r in p.deployment.roles] for p in b.plans}
    s = profile.rollout.strategy
    down = fleet_downtime(b.hosts, actions, roles, s.canary, s.max_unavailable,
                          s.drain_timeout_s)
    if down is None:
        return d
    return dataclasses.replace(d, outage=down.outage, downtime=down.text)


def register(group: click.Group) -> None:
    group.add_command(render)
    group.add_command(diff)
