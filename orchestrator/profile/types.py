"""Constrained scalar types shared by the profile and inventory schemas.

These types are the first line of defence for values that later reach a shell script or a systemd unit:
they reject control characters and, where a value names something we generate (unit names, env
variable names), anything outside a conservative alphabet. Rendering still quotes every value for its
context; rejecting here just gives the user a precise error early.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object) -> int:
    """Parse a byte size: an integer, or a number with a unit (``78GiB``, ``1.5 TB``, ``512MiB``)."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '78GiB', not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ValueError("a size cannot be negative or NaN")
        return int(value)
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            unit = m.group(2).lower()
            if unit in _UNITS:
                return int(float(m.group(1)) * _UNITS[unit])
        raise ValueError(
            f"cannot read {value!r} as a size; write bytes or a number with one of the units "
            "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
        )
    raise ValueError(f"a size must be a number of bytes or a string like '78GiB', got {type(value).__name__}")


def _no_control(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters (newlines, tabs, escape codes)")
    return value


def _abs_path(value: str) -> str:
    _no_control(value)
    if not value.startswith("/"):
        raise ValueError("must be an absolute path (starting with '/')")
    if any(part == ".." for part in value.split("/")):
        raise ValueError("must not contain '..' segments")
    # normalised before anything compares it (issue 31): `/srv/.`, `//etc` and `/./etc` name
    # /srv and /etc, and passed the system-directory check as strings
    return "/" + "/".join(part for part in value.split("/") if part not in ("", "."))


def _safe_path(value: str) -> str:
    """Paths that we also write into unit files (install root, engine env): a conservative alphabet."""
    value = _abs_path(value)
    if not re.fullmatch(r"[A-Za-z0-9._/+@-]+", value):
        raise ValueError(
            "may contain only letters, digits and . _ / + @ - (it is written into systemd units)"
        )
    return value


SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT]i?[bB]|[bB])?\s*$"
Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0), WithJsonSchema({
    "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": SIZE_PATTERN}]})]
"""Bytes; YAML may say ``78GiB`` or ``160GB``. (The JSON Schema says both forms in standard
keywords; pydantic would otherwise emit its own ``ge`` next to the validator.)"""

_TOKEN_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20}
_TOKENS = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmM]?)\s*$")
TOKENS_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*[kKmM]?\s*$"


def parse_tokens(value: object) -> object:
    """A token count: an integer, or a number with K (1024) or M (1024 * 1024): ``64K`` = 65,536,
    ``1M`` = 1,048,576 (a "1M context" is 2**20 tokens). Other values pass on to the type check."""
    if isinstance(value, str):
        m = _TOKENS.match(value)
        if not m:
            raise ValueError(f"cannot read '{value}' as a token count; write a whole number or one "
                             "with K (x1024) or M (x1048576), e.g. 64K or 1M")
        n = float(m.group(1)) * _TOKEN_UNITS[m.group(2).lower()]
        if n != int(n):
            raise ValueError(f"'{value}' is not a whole number of tokens")
        return int(n)
    return value


Tokens = Annotated[int, BeforeValidator(parse_tokens), WithJsonSchema({
    "anyOf": [{"type": "integer"}, {"type": "string", "pattern": TOKENS_PATTERN}]})]
"""A token count; YAML may say ``65536``, ``64K`` or ``1M``."""

Text = Annotated[str, AfterValidator(_no_control), Field(max_length=4096)]
"""Free text on one line."""

AbsPath = Annotated[str, AfterValidator(_abs_path), Field(min_length=1, max_length=4096)]
"""An absolute path on the host. Quoted wherever it is rendered."""

SafePath = Annotated[str, AfterValidator(_safe_path), Field(min_length=1, max_length=1024)]
"""An absolute path restricted to characters that need no quoting in systemd units."""

Slug = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")]
"""Lower-case name used inside unit names and release ids."""

ServedName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
"""The model name clients send; it appears in URLs, metrics labels and command lines."""

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
"""An environment variable name."""

Port = Annotated[int, Field(ge=1024, le=65535)]
"""A TCP port; privileged ports are refused because engines do not run as root."""

HostName = Annotated[str, Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.:-]{0,252})$")]
"""A DNS name, IPv4 or IPv6 address."""

UserName = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]
