"""Profiles and inventories: schema, YAML loading with located errors, and file resolution."""

from orchestrator.profile.inventory import Host, Inventory
from orchestrator.profile.loader import load_inventory, load_profile, load_text
from orchestrator.profile.schema import Profile, Role

__all__ = ["Host", "Inventory", "Profile", "Role", "load_inventory", "load_profile", "load_text"]
