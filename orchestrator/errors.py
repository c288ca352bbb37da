"""The error vocabulary of dsv4ctl and the exit codes it maps to.

Every failure the tool expects is raised as a subclass of :class:`DsvError`; the CLI is the one boundary
that turns them into a message and an exit code (see ``EXIT_CODES`` and ``dsv4ctl --help``). Nothing
below the CLI prints or exits. Each error carries what went wrong and, where we know it, the fix; a
fix that is an edit of the profile is given as data (:class:`FixChange`) and said by
:func:`fix_text`, the one place its words are made.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum


class ExitCode(IntEnum):
    """Documented exit codes. Stable: scripts and CI depend on them."""

    OK = 0
    ERROR = 1
    CHANGES = 2  # only with --detailed-exitcode: the plan has changes
    ROLLED_BACK = 3  # apply failed and the previous release was restored and is healthy
    ROLLBACK_FAILED = 4  # apply failed and restoring the previous release failed too
    LOCKED = 5  # another dsv4ctl holds the host lock
    STALE_PLAN = 6  # a saved plan no longer matches the host or was already applied
    INTERRUPTED = 130  # Ctrl-C; the journal records where it stopped


# What each exit code means: `dsv4ctl --help` and the README's table are generated from this.
EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success (with `--detailed-exitcode`: no changes)",
    ExitCode.ERROR: "error: invalid input, a plan with errors, unreachable host, a refused "
                    "confirmation",
    ExitCode.CHANGES: "with `--detailed-exitcode`: success, and there are changes",
    ExitCode.ROLLED_BACK: "apply failed; the previous release was restored and is healthy",
    ExitCode.ROLLBACK_FAILED: "apply failed and restoring the previous release failed too",
    ExitCode.LOCKED: "the host is locked by another dsv4ctl run (the holder is shown)",
    ExitCode.STALE_PLAN: "the saved plan is stale or was already applied",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C); the release journal records where it stopped",
}


@dataclass(frozen=True)
class FixChange:
    """One edit of the profile that a fix proposes: ``field`` (a dotted path; a list item by its
    index in the list as written, ``topology.engine.extra_args.3``, the same list for every edit
    of one fix) set to ``value``, or removed. A fix that is such
    edits has its text rendered from them (:func:`fix_text`), so what the text says and what the
    edit does are one thing, and a test can apply it as written."""

    field: str
    value: object = None
    remove: bool = False


def set_to(field: str, value: object) -> FixChange:
    """The edit "set ``field`` to ``value``"."""
    return FixChange(field, value)


def remove(field: str) -> FixChange:
    """The edit "remove ``field``" (a key, or a list item by its index)."""
    return FixChange(field, remove=True)


def _yaml_value(value: object) -> str:
    import json

    if isinstance(value, bool) or value is None:
        return json.dumps(value)  # true, false, null: as YAML writes them
    return str(value) if isinstance(value, (str, int, float)) else json.dumps(value)


def fix_text(change: Iterable[FixChange], then: str = "") -> str:
    """A fix's words for its edits: ``set attention.index_topk: 1024``, ``remove
    CUDA_VISIBLE_DEVICES from topology.engine.env``, ``remove topology.engine.extra_args[3]``,
    joined by "and"; ``then`` follows as written (``" (what auto picks)"``, ``", or list 8
    GPUs"``). The one place the text of a machine-readable fix is made."""
    words = []
    for c in change:
        parent, _, leaf = c.field.rpartition(".")
        if c.remove and leaf.isdigit():
            words.append(f"remove {parent}[{leaf}]")
        elif c.remove:
            words.append(f"remove {leaf} from {parent}" if parent else f"remove {leaf}")
        else:
            words.append(f"set {c.field}: {_yaml_value(c.value)}")
    return " and ".join(words) + then


class DsvError(Exception):
    """Base of every expected failure. ``fix`` says what the user can do about it."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def render(self) -> str:
        text = f"error: {self.message}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


def closest(value: object, choices: Iterable[object]) -> object | None:
    """The choice ``value`` was most likely meant to be: by spelling (difflib), else, for a
    number, the nearest number; None when neither says."""
    options = list(choices)
    close = difflib.get_close_matches(str(value), [str(c) for c in options], n=1, cutoff=0.6)
    if close:
        return next(c for c in options if str(c) == close[0])
    numbers = [(i, c) for i, c in enumerate(options)
               if isinstance(c, int | float) and not isinstance(c, bool)]
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        # a tie goes to the later choice (a catalog lists the larger, safer value last)
        return min(numbers, key=lambda ic: (abs(ic[1] - value), -ic[0]))[1]
    return None


def did_you_mean(value: object, choices: Iterable[object], *, what: str = "choices") -> str:
    """A fix for a value outside a fixed set: the closest choice (difflib) when there is one, else the
    set, listed once: ``did you mean 'flashinfer_cutlass'?``."""
    names = [str(c) for c in choices]
    close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
    if close:  # the likely intent; the whole set only when it is short
        return f"did you mean '{close[0]}'?" + (f" ({', '.join(names)})" if len(names) <= 8 else "")
    if not names:
        return f"there are no {what}"
    return f"use one of the {len(names)} {what}: {', '.join(names)}" if len(names) > 1 \
        else f"use '{names[0]}'"


@dataclass(frozen=True)
class Problem:
    """One problem in an input file, located as precisely as we can."""

    path: str  # dotted field path, e.g. ``topology.decode.tp``
    message: str  # what is wrong and why
    fix: str | None = None
    value: str | None = None  # the offending value, already shortened for display
    file: str | None = None
    line: int | None = None
    column: int | None = None

    def location(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where

    def render(self) -> str:
        head = f"{self.location()}: {self.path or '(document)'}"
        if self.value is not None:
            head += f" = {self.value}"
        text = f"{head}\n    {self.message}"
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text


@dataclass
class InputError(DsvError):
    """A profile, inventory or plan file failed validation. Holds every problem found, not just the first."""

    kind: str = "profile"
    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        # one mistake can reach the validator by several routes (union alternatives): say it once
        self.problems = list(dict.fromkeys(self.problems))
        n = len(self.problems)
        noun = "problem" if n == 1 else "problems"
        DsvError.__init__(self, f"{self.kind} is invalid: {n} {noun}")

    def render(self) -> str:
        lines = [f"error: {self.message}"]
        lines += [p.render() for p in self.problems]
        return "\n".join(lines)


class ProfileError(DsvError):
    """A profile is syntactically fine but refers to something that does not exist (host, variant, ...)."""


class CatalogLookupError(DsvError, KeyError):
    """A catalog id (model variant, GPU, engine version) is unknown."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class RenderError(DsvError):
    """A template failed to render, or rendered output failed a safety check."""


class RemoteError(DsvError):
    """Talking to the host failed (connection, command, transfer)."""


class LockHeld(DsvError):
    exit_code = ExitCode.LOCKED


class StalePlan(DsvError):
    exit_code = ExitCode.STALE_PLAN


class ApplyFailed(DsvError):
    """An apply failed after changing the host; ``rolled_back`` tells whether the old release serves again."""

    def __init__(self, message: str, *, rolled_back: bool, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.rolled_back = rolled_back
        self.exit_code = ExitCode.ROLLED_BACK if rolled_back else ExitCode.ROLLBACK_FAILED


class Interrupted(DsvError):
    exit_code = ExitCode.INTERRUPTED
