"""The commands dsv4ctl prints for the operator to run next, runnable as printed.

Owns how a printed command names its deployment: it carries the ``-p`` (profile), ``-i``
(inventory) and ``--host`` of the run that prints it, each quoted for a POSIX shell, so a command
copied from the output acts on the same deployment instead of falling back to the bundled
default profile or another inventory.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """What the running command was told to act on (None: not given, so not repeated)."""

    profile: Path | None = None
    inventory: Path | None = None
    host: str | None = None

    def args(self) -> list[str]:
        out: list[str] = []
        if self.profile is not None:
            out += ["-p", str(self.profile)]
        if self.inventory is not None:
            out += ["-i", str(self.inventory)]
        if self.host is not None:
            out += ["--host", self.host]
        return out

    def command(self, verb: str, *extra: str, with_profile: bool = True) -> str:
        """``dsv4ctl VERB -p P -i I --host H EXTRA...``, shell-quoted. ``with_profile=False``
        for commands whose subject is not a profile (``apply PLAN.json``)."""
        words = ["dsv4ctl", *verb.split()]
        words += self.args() if with_profile else Target(None, self.inventory, self.host).args()
        words += list(extra)
        return " ".join(shlex.quote(w) for w in words)
