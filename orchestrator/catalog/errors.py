"""Typed errors of the catalog: unknown ids, unknown data, unsupported layouts, bad YAML.

Every error says what was asked, the value, why it cannot be answered and how to fix it, so the
CLI's error boundary (``orchestrator.errors.DsvError``, which these subclass) can print it without
a traceback. ``UnknownCatalogEntry`` is also the project's ``CatalogLookupError`` and a
``KeyError`` (lookups by id); the others are ``ValueError`` s, so callers may catch either the
catalog's own base class or the builtin family.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.errors import CatalogLookupError, DsvError, FixChange, did_you_mean, fix_text


class CatalogError(DsvError):
    """Base class of every catalog error; ``str()`` is the full human-readable message."""

    def __str__(self) -> str:
        if self.fix:
            return f"{self.message} Fix: {self.fix}"
        return self.message


class UnknownCatalogEntry(CatalogError, CatalogLookupError):
    """A lookup by id (GPU, model variant, quant format, engine version) found nothing."""

    def __init__(self, kind: str, key: str, known: Iterable[str]) -> None:
        self.kind = kind
        self.key = key
        self.known: tuple[str, ...] = tuple(sorted(set(known)))
        super().__init__(
            f"unknown {kind} '{key}': the catalog has no entry for it.",
            fix=did_you_mean(key, self.known, what=f"known {kind} ids"),
        )

    # KeyError.__str__ would quote the whole message; keep it readable.
    def __str__(self) -> str:
        return CatalogError.__str__(self)


class UnknownCatalogData(CatalogError, ValueError):
    """The catalog lacks the data to answer this case; it refuses to guess."""


class UnsupportedLayout(CatalogError, ValueError):
    """A parallel layout (tp, ep, attention-DP) the model or engine cannot shard. ``change``: the
    layout knobs its fix sets (``ep``, ``attn_dp``: a role's field), the fix's text rendered from
    them with ``then`` after (:func:`orchestrator.errors.fix_text`)."""

    def __init__(self, message: str, *, fix: str | None = None,
                 change: tuple[FixChange, ...] = (), then: str = "") -> None:
        super().__init__(message, fix=fix_text(change, then) if change else fix)
        self.change, self.then = change, then


class CatalogDataError(CatalogError):
    """A catalog YAML file is malformed or inconsistent (a packaging or editing bug)."""
