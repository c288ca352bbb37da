"""The plan's static half: every check that needs no host facts, shared by `validate` and `plan`.

Owns which checks are static (topology and ports as written, the pinned engine's accepted values,
its rules and its command-line flags, the catalog's model and engine ids) and where in the YAML each
one points. `dsv4ctl validate` runs exactly :func:`static_checks`; `dsv4ctl plan` runs the same
function and adds what needs the host (GPU model and count, disks, ports in use, the MoE kernel path
and known-bad combinations of the host's GPU architecture), so the two cannot disagree. Also the
registry of the engine rules (:func:`rule_ids`: the static half's and the host GPU's), which the
suite holds each to its fix.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.catalog import Catalog, EngineRules, ModelVariant
from orchestrator.catalog.errors import UnknownCatalogData, UnsupportedLayout
from orchestrator.deployment import Deployment
from orchestrator.errors import remove
from orchestrator.planner import rules
from orchestrator.planner.checks import check, layout_check, topology_checks
from orchestrator.planner_model import Check
from orchestrator.profile.loader import locate
from orchestrator.profile.schema import Profile

# Every engine rule a plan raises, by id (ids are the interface: profiles acknowledge them by id):
# the static half's (what `validate` reports too) and those of the host's GPU architecture (plan,
# rules.gpu_engine_checks). Families come from where their members are defined (rule_ids).
# tests/unit/test_fix_texts.py applies each rule's fix as written and fails on a rule that the
# rule modules raise and this list lacks.
STATIC_RULES = (
    "topology.gpu-duplicate", "topology.gpu-overlap", "topology.tp-gpus", "topology.tp-heads",
    "topology.ep", "topology.attn-dp", "topology.port-conflict", "capacity.layout",
    "profile.env-reserved", "engine.context-length", "engine.speculative",
    "model.trust-remote-code", "kernels.deprecated-key", "engine.flag-table", "engine.render",
    "engine.flag-reserved", "engine.foreign-code-flag")
GPU_RULES = (
    "engine.moe-runner-unknown", "engine.moe-runner-unavailable", "engine.moe-runner-fallback",
    "engine.moe-runner", "kernels.engine-path-unsupported", "kernels.bundled-no-effect",
    "kernels.measurement-ignored")
RULE_FAMILIES = ("engine.", "engine.flag-", "known-bad.")  # id prefixes of rule_ids' families


def rule_ids(cat: Catalog) -> tuple[list[str], list[str]]:
    """(the static half's rule ids, the host GPU's): :data:`STATIC_RULES` and
    :data:`GPU_RULES` with their families' members: engine.<knob> for each value checked against
    the engine's accepted table, engine.flag-<kind> for each kind of flag problem, and
    known-bad.<id> for each catalog entry of a known-bad combination."""
    from typing import get_args

    from orchestrator.catalog.flags.validator import ProblemKind

    static = [*STATIC_RULES,
              *(f"engine.{knob.replace('_', '-')}" for knob, _, _ in rules.ACCEPTED),
              *(f"engine.flag-{kind.replace('_', '-')}" for kind in get_args(ProblemKind))]
    gpu = [*GPU_RULES, *dict.fromkeys(f"known-bad.{kb.id}" for e in cat.engines
                                      for kb in e.known_bad)]
    return static, gpu


def static_checks(cat: Catalog, engine: EngineRules, model: ModelVariant, dep: Deployment,
                  profile: Profile) -> list[Check]:
    """Topology, ports and engine rules, from the profile and the catalog alone."""
    heads = cat.config_of(model).num_attention_heads.value
    from orchestrator.planner.exposure import foreign_flag_checks

    return (topology_checks(dep, heads) + layout_checks(cat, model, dep) + env_checks(dep)
            + rules.engine_checks(cat, engine, model, dep, profile)
            + foreign_flag_checks(engine, dep))


def layout_checks(cat: Catalog, model: ModelVariant, dep: Deployment) -> list[Check]:
    """``capacity.layout``: a tp/ep/attn_dp no GPU could shard (the same rules the capacity
    arithmetic applies, minus the one that depends on the GPU's runtime formats)."""
    out = []
    for role in dep.roles:
        try:
            cat.check_layout(model, dep.expert_storage, role.tp, role.ep, role.attn_dp)
        except (UnsupportedLayout, UnknownCatalogData) as exc:
            out.append(layout_check(role.name, exc))
    return out


def env_checks(dep: Deployment) -> list[Check]:
    """``profile.env-reserved``: a role's env that sets what dsv4ctl renders itself."""
    from orchestrator.render import reserved_env_problems  # jinja2 only; plan imports it anyway

    return [check("profile.env-reserved", "error", "role env sets a variable dsv4ctl owns",
                  f"{where} = {dict(role.env)[where.rsplit('.', 1)[1]]!r}: {message}", then,
                  field=where, subject=role.name, change=[remove(where)])
            for role in dep.roles for where, message, then in reserved_env_problems(dep, role)]


def locate_checks(checks: list[Check], text: str, filename: str) -> list[Check]:
    """Each check with a ``field`` gets the file:line:col of that field in the profile (or of the
    nearest parent the profile writes, when the value is a default)."""
    out = []
    for c in checks:
        if c.field and c.location is None:
            pos = locate(text, c.field)
            where = f"{filename}:{pos[0]}:{pos[1]}" if pos else filename
            c = c.model_copy(update={"location": where})
        out.append(c)
    return out


def sort_checks(checks: list[Check]) -> list[Check]:
    return sorted(checks, key=lambda c: ({"error": 0, "warning": 1, "info": 2}[c.severity],
                                         c.id, c.subject or ""))


def check_profile(path: Path, inventory_path: Path | None = None) -> tuple[Profile, list[Check]]:
    """`dsv4ctl validate`: load the profile (schema errors raise, located) and run the static
    checks. The host is only named here, never contacted or needed: static checks read no host
    field, so a profile whose inventory is elsewhere validates all the same."""
    from orchestrator.catalog import load_catalog
    from orchestrator.planner.checks import apply_acknowledgements
    from orchestrator.planner.context import PlanContext, catalog_entries, resolve_deployment
    from orchestrator.profile.inventory import Host
    from orchestrator.profile.loader import load_text, read_file

    text = read_file(path)
    profile = load_text(Profile, text, str(path))
    cat = load_catalog()
    engine, model = catalog_entries(cat, profile, str(path), text)
    if isinstance(profile.host, Host):
        name, host = profile.name, profile.host
    else:  # deployment fields that come from the host (scope, install_root) are not checked here
        name, host = str(profile.host), Host.model_construct(scope="system",
                                                             install_root="/srv/dsv4")
    ctx = PlanContext(profile, path, text, name, host, inventory_path)
    dep = resolve_deployment(ctx, cat)
    checks = static_checks(cat, engine, model, dep, profile)
    checks = apply_acknowledgements(checks, [(a.id, a.reason) for a in profile.acknowledge],
                                    report_unused=False)
    return profile, sort_checks(locate_checks(checks, text, str(path)))
