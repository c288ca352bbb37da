"""The commands dsv4ctl prints for the operator to run next, runnable as printed.

Owns how a printed command names its deployment: it carries the ``-p`` (profile), ``-i``
(inventory) and ``--host`` of the run that prints it, each quoted for a POSIX shell, so a command
copied from the output acts on the same deployment instead of falling back to the bundled
default profile or another inventory.

Two ways in: :meth:`Target.command` builds a command whole (plan's ``-o`` advice), and
:func:`complete` fills the run's target into the commands that other layers write into their
messages and fixes (``re-plan: dsv4ctl plan --host box --live``): the apply layer cannot know the
CLI's flags, so the CLI's output (``orchestrator.cli.output.echo``) completes every text line it
prints while a command runs. A flag the command already names is left as written, and a
command in double quotes is a quotation of what some run did (the lock holder's command
line), a fact that is shown as it was, never completed.
"""

from __future__ import annotations

import contextvars
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


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


# The running command's target and the options each command has (set by orchestrator.cli).
RUN: contextvars.ContextVar[Target | None] = contextvars.ContextVar("dsv4ctl_run", default=None)
OPTIONS: contextvars.ContextVar[Mapping[str, frozenset[str]] | None] = contextvars.ContextVar(
    "dsv4ctl_options", default=None)
# The running command's words (its argv, set by orchestrator.cli: main(argv) is the command,
# not the embedding process's sys.argv) and its verb.
ARGV: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("dsv4ctl_argv",
                                                                              default=None)
VERB: contextvars.ContextVar[str | None] = contextvars.ContextVar("dsv4ctl_verb", default=None)
# commands whose first operand is the profile (or a saved plan): -p would name it twice; given
# none, they take the bundled default profile
_OPERAND_IS_PROFILE = frozenset({"validate", "plan", "render", "apply"})
# commands that, given --host and no profile, act on that host alone (its releases): a command
# they print that needs a profile cannot take the bundled default's, which is another deployment
_HOST_ALONE = frozenset({"rollback", "history", "status", "unlock", "calibrate", "qualify"})
PROFILE_PLACEHOLDER = "PROFILE"
_TAKES_VALUE = frozenset({"-o", "--out", "-i", "--inventory", "--host", "-p", "--profile",
                          "--format", "-U", "--context", "--replace", "--git"})
# the CLI's groups (their commands are two words, ``qualify kernels``); a group missing here leaves
# its commands uncompleted: tests/unit/test_rerun_complete.py checks every group the CLI has
_COMMAND = re.compile(r"(?<![\w./\"-])dsv4ctl ((?:probe |calibrate |qualify )?[a-z]+)(?=[ `'\"]|$)"
                      r"([^`;\n'\"]*)")


def record(**given: object) -> None:
    """Record what a command was given (the CLI's option callbacks call this): ``profile``
    (a profile, or a saved plan whose own profile is taken), ``inventory``, ``host``."""
    cur = RUN.get() or Target()
    updates: dict[str, object] = {}
    for key, value in given.items():
        if value is None:
            continue
        if key == "profile":
            value = _profile_of(Path(str(value)))
            if value is None:
                continue
        elif key == "inventory":
            value = Path(str(value))
        updates[key] = value
    RUN.set(replace(cur, **updates))  # type: ignore[arg-type]


def _profile_of(source: Path) -> Path | None:
    """The profile a command's subject names: itself, or a saved plan's own profile."""
    if source.suffix != ".json" or str(source) == "-":
        return None if str(source) == "-" else source
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    path = data.get("profile_path") if isinstance(data, dict) else None
    return Path(path) if isinstance(path, str) and path else None


def _operand(rest: str) -> bool:
    """Whether a command's words name its subject already (a profile or a saved plan, given or
    as a placeholder): then -p would name it twice."""
    words = rest.split()
    subjects = [w for i, w in enumerate(words)
                if not w.startswith("-") and not (i and words[i - 1] in _TAKES_VALUE)]
    return any(re.search(r"\.(ya?ml|json)$", w) or re.fullmatch(r"[A-Z][A-Z_.]+", w)
               or w == "-" for w in subjects)


def _has(rest: str, *flags: str) -> bool:
    words = rest.split()
    return any(w == f or w.startswith(f + "=") for w in words for f in flags)


def complete(text: str, target: Target | None = None,
             options: Mapping[str, frozenset[str]] | None = None,
             run_verb: str | None = None) -> str:
    """``text`` with every ``dsv4ctl VERB ...`` command carrying the run's -p, -i and --host
    (those the command has and does not name already). A run on a host named alone
    (``status --host h``: :data:`_HOST_ALONE`) gives a command that needs a profile ``-p
    PROFILE``, to be filled in, not the bundled default profile's (another deployment)."""
    target = target if target is not None else RUN.get()
    run_verb = run_verb if run_verb is not None else VERB.get()
    options = options if options is not None else (OPTIONS.get() or {})
    if target is None or not target.args() or "dsv4ctl " not in text:
        return text

    def fill(m: re.Match[str]) -> str:
        verb, rest = m.group(1), m.group(2)
        have = options.get(verb)
        if have is None:  # not a command (prose like "dsv4ctl run", "dsv4ctl sets ...")
            return m.group(0)
        add: list[str] = []
        named = _has(rest, "-p", "--profile") or (verb in _OPERAND_IS_PROFILE and _operand(rest))
        if target.profile is not None and "-p" in have and not named:
            add += ["-p", str(target.profile)]
        elif (target.profile is None and target.host is not None and run_verb in _HOST_ALONE
              and verb in _OPERAND_IS_PROFILE and not named):
            # a host named alone: its profile is not known here, and without -p the command
            # would plan the bundled default profile onto the host
            add += ["-p", PROFILE_PLACEHOLDER]
        if target.inventory is not None and "-i" in have and not _has(rest, "-i", "--inventory"):
            add += ["-i", str(target.inventory)]
        if target.host is not None and "--host" in have and not _has(rest, "--host"):
            add += ["--host", target.host]
        if not add:
            return m.group(0)
        return f"dsv4ctl {verb} {' '.join(shlex.quote(a) for a in add)}{rest}"

    return _COMMAND.sub(fill, text)


def complete_checks(checks: Any) -> list[Any]:
    """``checks`` with each fix completed as :func:`complete` completes a printed line: a JSON or
    markdown document prints them raw (byte for byte), so the document completes them here."""
    return [c.model_copy(update={"fix": complete(c.fix)}) if c.fix else c for c in checks]


def complete_plan(fp: Any) -> Any:
    """A fleet plan (:class:`orchestrator.planner_model.FleetPlan`) whose checks' fixes, its own
    and every host's, are completed (:func:`complete_checks`), for the documents plan prints."""
    return fp.model_copy(update={
        "checks": complete_checks(fp.checks),
        "plans": [p.model_copy(update={"checks": complete_checks(p.checks)}) for p in fp.plans]})
