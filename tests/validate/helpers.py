"""Shared helpers of the render tests: load shipped profiles, render them, lay a tree out on disk.

Owns the one way the render, injection and validation tests turn a profile into files, so each test
states only what it checks. Rendering can point the install root and the engine env at a temporary
directory: ``systemd-analyze verify`` needs ExecStart= to exist, and the injection tests put a fake
``sglang`` where the launch script will exec it.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.deployment import Deployment
from orchestrator.profile.loader import load_inventory, load_profile, load_text
from orchestrator.profile.schema import Profile
from orchestrator.render import ReleaseTree, render_release

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "profiles"
INVENTORY = PROFILES / "inventory.yaml"


def resolve_profile(profile: Profile, inventory: object = None) -> Deployment:
    """The deployment exactly as ``dsv4ctl plan``/``render`` resolve it (planner + catalog)."""
    from orchestrator.planner.build import PlanContext, host_of, resolve_deployment
    from orchestrator.profile.inventory import Host

    if profile.hosts is not None:  # a fleet: its first host's part of it
        return resolve_fleet(profile)[0]
    inv = None if isinstance(profile.host, Host) else load_inventory(INVENTORY)
    name, host = host_of(profile, inv, INVENTORY)
    ctx = PlanContext(profile, None, "", name, host, INVENTORY)
    return resolve_deployment(ctx)


def resolve_fleet(profile: Profile) -> list[Deployment]:
    """Every host's deployment of a fleet profile, in rollout order (the router's own host last)."""
    from orchestrator.planner.build import resolve_deployment
    from orchestrator.planner.fleet import fleet_context

    fctx = fleet_context(profile, "", None, INVENTORY)
    return [resolve_deployment(fctx.context(n, h)) for n, h in fctx.all_hosts]


def render_fleet(path: Path) -> dict[str, ReleaseTree]:
    """Each host's release tree of a shipped fleet profile, by host."""
    profile = load_profile(path)
    return {d.host: render_release(profile, d) for d in resolve_fleet(profile)}


def shipped_profiles() -> list[Path]:
    """Every profile shipped in profiles/ (the inventory is not a profile)."""
    out = sorted(p for p in PROFILES.glob("*.yaml") if p.name != "inventory.yaml")
    assert out, "no shipped profiles found"
    return out


def with_host(profile: Profile, *, install_root: str | None = None, scope: str | None = None,
              engine_env: str | None = None) -> Profile:
    """The profile with its inventory host inlined and (optionally) a different install root,
    systemd scope or engine env; re-validated so nothing invalid slips through."""
    inv = load_inventory(INVENTORY)
    data = profile.model_dump(mode="json", by_alias=True)
    if isinstance(profile.host, str):
        data["host"] = inv.all_hosts()[profile.host].model_dump(mode="json")
    if profile.hosts is not None:  # a fleet: its first host, as the fleet of one
        from orchestrator.planner.fleet import fleet_hosts

        first = fleet_hosts(profile, inv, INVENTORY)[0][1]
        data["host"] = first.model_dump(mode="json")
        data.pop("hosts")
        if (data["topology"].get("router") or {}).get("runs_on"):
            data["topology"]["router"]["runs_on"] = None
    if install_root is not None:
        data["host"]["install_root"] = install_root
    if scope is not None:
        data["host"]["scope"] = scope
    if engine_env is not None:
        data["engine"]["env"] = engine_env
    return Profile.model_validate(data)


def render_text(text: str, filename: str = "<test>") -> tuple[Profile, Deployment, ReleaseTree]:
    profile = load_text(Profile, text, filename)
    dep = resolve_profile(profile)
    return profile, dep, render_release(profile, dep)


def render_path(path: Path, **host: str) -> tuple[Profile, Deployment, ReleaseTree]:
    profile = load_profile(path)
    if host:
        profile = with_host(profile, **host)
    dep = resolve_profile(profile)
    return profile, dep, render_release(profile, dep)


def materialize(tree: ReleaseTree, install_root: Path) -> Path:
    """Lay the tree out as apply would (releases/1, current link, logs/); returns current."""
    release = install_root / "releases" / "1"
    tree.write(release)
    (install_root / "logs").mkdir(parents=True, exist_ok=True)
    current = install_root / "current"
    if current.is_symlink():
        current.unlink()
    os.symlink("releases/1", current)
    return current
