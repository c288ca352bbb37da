"""Playbooks: the ordered steps of apply and rollback, read from ``playbooks/*.yaml`` as data.

Keeping the order in data (not code) makes it reviewable on its own and lets the release record name
each step the way the playbook does. This module owns the playbook schema and its validation: an
unknown action, condition or timeout name is an error naming the file and the step, never a step
silently skipped (the Ansible check-mode trap, ansible#84676).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import InputError, Problem


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,40}$")
    action: str
    description: str = ""
    when: Literal["kernels_enabled", "qualify_configured"] | None = None
    on_failure: Literal["abort", "rollback"] = "abort"
    timeout: Literal["health_startup", "rollback"] | None = None


class Playbook(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    steps: list[Step] = Field(min_length=1)


def load_playbook(name: str, actions: set[str] | None = None, *, directory: Path | None = None
                  ) -> Playbook:
    """Load ``<playbooks>/<name>.yaml`` and check every action exists (``actions``: known names)."""
    from orchestrator.paths import data_dir
    from orchestrator.profile.loader import load_text

    path = (directory or data_dir("playbooks")) / f"{name}.yaml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(kind="playbook", problems=[Problem(
            path="", message=f"cannot read playbook: {exc}", file=str(path),
            fix="reinstall dsv4ctl (playbooks/ ships with it)")]) from exc
    pb = load_text(Playbook, text, str(path))
    problems = []
    seen: set[str] = set()
    for i, step in enumerate(pb.steps):
        if actions is not None and step.action not in actions:
            problems.append(Problem(path=f"steps.{i}.action", value=step.action, file=str(path),
                                    message="unknown action",
                                    fix=f"use one of: {', '.join(sorted(actions))}"))
        if step.name in seen:
            problems.append(Problem(path=f"steps.{i}.name", value=step.name, file=str(path),
                                    message="step names must be unique (the journal uses them)"))
        seen.add(step.name)
    if problems:
        raise InputError(kind="playbook", problems=problems)
    return pb
