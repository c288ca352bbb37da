"""The trust boundary for what dsv4ctl reads back from a host or from another user's file.

A host (or whoever can write to it) controls every byte of a release record, a journal, a
manifest, ``calibration.json``, a checkpoint's model index, a router's worker-API answer and the
fleet journal. Each of those formats is read through :func:`bounded_json` and then its typed model,
so a hostile document becomes a :class:`HostDataError` naming the file and the reason, never a
traceback and never a value that steers the controller:

- size capped (:data:`MAX_DOCUMENT_BYTES`) before parsing, nesting capped (:data:`MAX_DEPTH`);
- numbers finite: ``NaN``, ``Infinity`` and ``1e999`` are refused, integers are capped in digits
  (``10**5000`` is refused, not converted);
- ids matched against their grammar (:func:`release_id`, :func:`slug`);
- paths are only ever the expected relative names (:func:`relative_name`): no absolute path, no
  ``..``, no empty or ``.`` component, no control character. Nothing read from a host names a
  controller path: callers build controller paths from their own names (the inventory's host name,
  a validated release id), never from a value in the document.

Stdlib and pydantic only, at the bottom of the layering (paths/errors rank), so every layer that
reads host data can use it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import DsvError
from orchestrator.release_ids import is_release_id

MAX_DOCUMENT_BYTES = 16 << 20  # the HTTP cap (remote.connection.HTTP_MAX_BODY): records are KBs
MAX_DEPTH = 32  # the deepest format (a record's journal entry) nests 4 levels
MAX_INT_DIGITS = 30  # byte counts and token counts fit in 20 digits

_SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")


class HostDataError(DsvError):
    """A document read from a host (or another user's file) that is not what dsv4ctl wrote."""


def _fail(what: str, reason: str) -> HostDataError:
    return HostDataError(f"{what} is not a valid dsv4ctl document: {reason}",
                         fix="it was changed outside dsv4ctl (or is damaged); inspect it on the "
                             "host, move it aside and re-run")


def _constant(name: str) -> Any:
    raise ValueError(f"the number {name} is not finite")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is not finite")
    return value


def _int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits is out of range")
    return int(text)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > MAX_DEPTH:
            break
        if isinstance(v, dict):
            stack += [(x, d + 1) for x in v.values()]
        elif isinstance(v, list):
            stack += [(x, d + 1) for x in v]
    return deepest


def bounded_json(data: str | bytes, what: str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse ``data`` (named ``what`` in errors) as JSON within the caps above."""
    size = len(data.encode("utf-8", "replace") if isinstance(data, str) else data)
    if size > max_bytes:
        raise _fail(what, f"it is {size:,} bytes, more than the {max_bytes:,} a real one can be")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(what, f"it is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(data, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise _fail(what, f"it nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError is one
        raise _fail(what, str(exc)[:200]) from None
    if _depth(value) > MAX_DEPTH:
        raise _fail(what, f"it nests deeper than {MAX_DEPTH} levels")
    return value


def release_id(value: str) -> str:
    """A release id (orchestrator.release_ids grammar), for pydantic ``AfterValidator``."""
    if not isinstance(value, str) or not is_release_id(value):
        raise ValueError(f"{str(value)[:80]!r} is not a release id (rNNNN-YYYYMMDDTHHMMSSZ-hash)")
    return value


def slug(value: str) -> str:
    """An inventory host or deployment name (lower-case letters, digits, '-')."""
    if not isinstance(value, str) or not _SLUG.match(value):
        raise ValueError(f"{str(value)[:80]!r} is not a name of lower-case letters, digits and '-'")
    return value


def relative_name(value: str) -> str:
    """A path relative to a directory dsv4ctl owns: ``units/x.service``, never ``/etc/x``,
    ``../x``, ``a//b``, ``./a`` or a name with a control or invisible character."""
    if not isinstance(value, str) or not value or len(value) > 255:
        raise ValueError("must be a relative path of 1 to 255 characters")
    if _CONTROL.search(value) or "\\" in value:
        raise ValueError(f"{value[:80]!r} holds a control, invisible or backslash character")
    if value.startswith("/"):
        raise ValueError(f"{value[:80]!r} is an absolute path; only names relative to the release "
                         "are allowed")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise ValueError(f"{value[:80]!r} has an empty, '.' or '..' component")
    return value


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ROLE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
MAX_MANIFEST_FILES = 4096


def manifest_files(text: str | bytes, what: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """A release's ``manifest.json`` read back from a host: path -> (sha256, restart roles), each
    path an expected relative name (:func:`relative_name`), each hash 64 hex digits."""
    doc = bounded_json(text, what)
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        raise _fail(what, "it has no 'files' object")
    if len(files) > MAX_MANIFEST_FILES:
        raise _fail(what, f"it lists {len(files):,} files, more than {MAX_MANIFEST_FILES:,}")
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for path, entry in sorted(files.items()):
        try:
            relative_name(path)
        except ValueError as exc:
            raise _fail(what, f"files: {exc}") from None
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise _fail(what, f"files.{path[:80]}: sha256 is not 64 hex digits")
        roles = entry.get("roles") or []
        if not isinstance(roles, list) or not all(isinstance(r, str) and _ROLE.match(r)
                                                  for r in roles):
            raise _fail(what, f"files.{path[:80]}: roles is not a list of role names")
        out[path] = (sha, tuple(roles))
    return out


_Slug = Annotated[str, AfterValidator(slug)]
_ReleaseId = Annotated[str, AfterValidator(release_id)]
_Line = Annotated[str, Field(max_length=4096)]


class _Outcome(BaseModel):
    model_config = ConfigDict(extra="ignore")

    host: _Slug
    wave: int = Field(ge=0, le=1 << 16)
    state: Literal["moved", "unchanged", "rolled_back", "rollback_failed", "failed",
                   "not_reached"]
    message: _Line = ""
    drained: bool | None = None
    seconds: float = Field(default=0.0, ge=0, le=1 << 32, allow_inf_nan=False)


class _Comparison(BaseModel):
    model_config = ConfigDict(extra="ignore")

    metric: Literal["ttft_p95", "itl_p95", "e2e_p95", "abort_ratio"]
    window_s: int = Field(ge=0, le=1 << 20)
    wave: float | None = Field(default=None, allow_inf_nan=False)
    baseline: float | None = Field(default=None, allow_inf_nan=False)
    limit: float | None = Field(default=None, allow_inf_nan=False)
    passed: bool
    reason: _Line = ""


class _Analysis(BaseModel):
    """One wave's canary analysis verdict (orchestrator.monitoring.analysis)."""

    model_config = ConfigDict(extra="ignore")

    hosts: list[_Slug] = Field(default_factory=list, max_length=4096)
    passed: bool
    reason: _Line = ""
    requests: float | None = Field(default=None, allow_inf_nan=False)
    comparisons: list[_Comparison] = Field(default_factory=list, max_length=64)


class FleetJournal(BaseModel):
    """One fleet rollout's or rollback's journal (``<install_root>/fleet/*.json`` on the router's
    host), as ``history --profile FLEET`` reads it back."""

    model_config = ConfigDict(extra="ignore")

    profile: _Slug
    kind: Literal["rollout", "rollback"] = "rollout"
    # the run's number in the fleet's order (journals written before runs were numbered: None)
    sequence: int | None = Field(default=None, ge=1, le=1 << 40)
    selected: list[_Slug] = Field(default_factory=list, max_length=4096)  # what --host named
    # "running": written before the first wave and never finished (the run was killed)
    state: Literal["running", "finished"] = "finished"
    targets: dict[_Slug, _ReleaseId] = Field(default_factory=dict)  # each host's target release
    resumes: int | None = Field(default=None, ge=1, le=1 << 40)  # the unfinished run resumed
    started: Annotated[str, Field(pattern=r"^[0-9]{8}T[0-9]{6}Z$")]
    finished: Annotated[str, Field(pattern=r"^[0-9]{8}T[0-9]{6}Z$")] | None = None
    command: _Line = ""
    waves: list[list[_Slug]] = Field(default_factory=list, max_length=4096)
    outcomes: list[_Outcome] = Field(default_factory=list, max_length=4096)
    stopped_after_wave: int | None = Field(default=None, ge=-1, le=1 << 16)
    reason: _Line | None = None
    exit_code: int | None = Field(default=None, ge=0, le=255)  # None: the run did not finish
    releases: dict[_Slug, _ReleaseId] = Field(default_factory=dict)
    prepared_not_switched: dict[_Slug, _ReleaseId] = Field(default_factory=dict)
    analysis: list[_Analysis] = Field(default_factory=list, max_length=4096)


def fleet_journal(text: str | bytes, what: str) -> dict[str, Any]:
    """A fleet journal read back from the router's host, checked; as plain data (JSON mode)."""
    try:
        return FleetJournal.model_validate(bounded_json(text, what)).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise _fail(what, f"{where}: {first['msg']}") from None
