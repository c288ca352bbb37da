"""``dsv4ctl qualify kernels``: measure, on the host's GPUs, which path of each hooked op is faster.

A thin adapter over :mod:`orchestrator.apply.qualify_kernels` (the host side) and the planner
(which reads the stored result back as a fact and decides from it). Beside ``calibrate``: both
store a measurement of the host that ``plan --live`` then uses.
"""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import accept_new_host_key_opt, say
from orchestrator.cli.options import host_option, inventory_option, profile_option, verbose_option
from orchestrator.errors import DsvError


@click.group()
def qualify() -> None:
    """Measure something on the host that plans then use."""


@qualify.command("kernels")
@host_option()
@profile_option()
@inventory_option()
@click.option("--role", "roles", multiple=True, type=click.Choice(["engine", "prefill", "decode"]),
              help="Measure only this role (repeatable; default: every engine role on the host).")
@click.option("--from-file", "from_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Store a measurement `python -m dsv4_kernels.qualify` printed "
              "elsewhere (its JSON) instead of running one.")
@click.option("--reset", is_flag=True,
              help="Remove the host's kernel measurement (<install_root>/kernels-qualification"
                   ".json): plans then decide from the catalog alone.")
@accept_new_host_key_opt
@verbose_option()
def kernels(host_name: str | None, profile_path: Path | None, inventory: Path | None,
            roles: tuple[str, ...], from_file: Path | None, reset: bool) -> int:
    """Check and time SGLang's own path and the bundled kernel of each hooked op on the host.

    \b
    For each engine role of the profile on the host (default: the profile's host), runs
    `python -m dsv4_kernels.qualify` in the engine's environment on the role's first GPU, at
    the role's shapes: sparse-MLA decode at the CUDA-graph batch sizes up to cuda_graph_max_bs
    (heads as the engine passes them), a prefill chunk of chunked_prefill_size rows, the
    indexer at the declared context. Each contender (FlashInfer, SGLang's Triton and torch
    functions, TileLang, the bundled kernel) is checked against the float32 reference, then
    timed with CUDA graphs and a cold L2; one that cannot run there is `unavailable`. The
    result is kept on the host in <install_root>/kernels-qualification.json; with
    `kernels.<op>: auto`, `plan --live` takes the bundled kernel only where it was faster at
    every measured shape, and says so. A measurement of another engine version, GPU or role
    shape is ignored (the plan says why). Stop the engines first: they hold the GPU memory.
    """
    from orchestrator.apply import qualify_kernels as Q
    from orchestrator.kernel_paths import role_shape
    from orchestrator.planner.build import build_plan, load_context, resolve_deployment
    from orchestrator.planner.report import kernel_lines
    from orchestrator.profile.loader import read_file
    from orchestrator.remote import gather_facts
    from orchestrator.remote.connection import connect

    if reset:
        from orchestrator.cli.common import resolve_host

        if from_file is not None:
            raise DsvError("--reset and --from-file together", fix="pass one of them")
        name, host = resolve_host(profile_path, inventory, host_name)
        with connect(name, host) as remote:
            removed = Q.reset_host(remote, host.install_root)
        say(f"host {name}: kernel measurement "
              + ("removed; plans decide from the catalog alone" if removed
                 else "was not set; nothing to remove"))
        return 0
    from orchestrator.paths import default_profile

    ctx = load_context(profile_path or default_profile(), inventory, host_override=host_name)
    dep = resolve_deployment(ctx)
    wanted = [r for r in dep.roles if not roles or r.name in roles]
    if not wanted:
        raise DsvError(f"no engine role {' or '.join(roles) or ''} of profile "
                       f"{ctx.profile.name!r} runs on host {ctx.host_name}".replace("  ", " "),
                       fix="pass --role with one of: "
                           + (", ".join(r.name for r in dep.roles) or "(none on this host)"))
    from orchestrator.catalog import load_catalog

    cat = load_catalog()
    heads = cat.config_of(cat.model(dep.model_variant)).num_attention_heads.value
    found = []
    with connect(ctx.host_name, ctx.host) as remote:
        if from_file is not None:
            m = Q.KQ.parse_measurement(read_file(from_file), where=str(from_file))
            found.append(m)
        else:
            from orchestrator.remote.probes import require_engine_env

            require_engine_env(remote, dep.engine_env, ctx.host_name)
            for role in wanted:
                say(f"measuring role {role.name} on GPU {role.gpus[0]} (Triton compiles the "
                      "contenders' kernels first: minutes)")
                found.append(Q.run_role(remote, ctx.host_name, ctx.host.install_root,
                                        dep.engine_env, role.gpus[0], role.name,
                                        role_shape(dep, role, heads)))
        Q.write_host(remote, ctx.host.install_root, found)
    for m in found:
        for line in Q.table(m):
            say(line)
    facts = gather_facts(ctx.host_name, ctx.host, model_paths=[ctx.profile.model.path],
                         engine_env=ctx.profile.engine.env)
    plan = build_plan(ctx, facts)
    say(f"stored in {Q.qualification_path(ctx.host.install_root)} on {ctx.host_name}; "
          "`dsv4ctl plan --live` now decides:")
    for line in kernel_lines(plan):
        say(line)
    return 0


def register(group: click.Group) -> None:
    group.add_command(qualify)
