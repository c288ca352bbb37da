"""Profile + inventory → Deployment for ``render`` and ``diff``, without the planner's host facts.

Owns the small resolution path the render and diff commands need: find the profile's host (an
inventory entry or an inline definition) and call :func:`orchestrator.deployment.resolve` with the
model's defaults. Why here and not in the CLI: ``diff`` resolves two profiles the same way, and
tests resolve hostile profiles without a terminal.

The two model facts (``index_topk`` default 512, maximum context 1,048,576 tokens) are the
catalog's ``models.yaml`` values for every DeepSeek-V4-Flash variant (research/model-hw.md §1.1);
they are constants here until the catalog's loader API lands, then read from it.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.deployment import Deployment, resolve
from orchestrator.errors import ProfileError
from orchestrator.profile.inventory import Host, Inventory
from orchestrator.profile.loader import load_inventory
from orchestrator.profile.schema import Profile

DEFAULT_INDEX_TOPK = 512
MAX_CONTEXT_LENGTH = 1_048_576


def default_inventory_path(profile_path: Path | None) -> Path | None:
    """The inventory used when none is given: ``inventory.yaml`` next to the profile, else
    ``profiles/inventory.yaml`` under the current directory (git textconv runs at the repo top)."""
    candidates = []
    if profile_path is not None:
        candidates.append(profile_path.parent / "inventory.yaml")
    candidates.append(Path("profiles") / "inventory.yaml")
    for c in candidates:
        if c.is_file():
            return c
    return None


def host_of(profile: Profile, inventory: Inventory | None) -> tuple[str, Host]:
    if isinstance(profile.host, Host):
        return profile.name, profile.host
    if inventory is None:
        raise ProfileError(
            f"host = {profile.host!r}: the profile names an inventory host but no inventory "
            "was found",
            fix="pass --inventory PATH, or put inventory.yaml next to the profile",
        )
    try:
        return profile.host, inventory.hosts[profile.host]
    except KeyError:
        known = ", ".join(sorted(inventory.hosts)) or "(none)"
        raise ProfileError(
            f"host = {profile.host!r} is not in the inventory (hosts: {known})",
            fix="use one of the inventory's host names or define the host inline",
        ) from None


def resolve_profile(profile: Profile, inventory: Inventory | None) -> Deployment:
    name, host = host_of(profile, inventory)
    return resolve(profile, name, host, default_index_topk=DEFAULT_INDEX_TOPK,
                   max_context_length=MAX_CONTEXT_LENGTH)


def load_inventory_for(profile_path: Path | None, inventory_path: Path | None) -> Inventory | None:
    path = inventory_path or default_inventory_path(profile_path)
    return load_inventory(path) if path is not None else None
