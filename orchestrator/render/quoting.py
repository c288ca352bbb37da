"""Quoting for the three contexts rendered values land in: bash, systemd unit settings, env files.

Owns the only code that turns a profile string into text another parser will read. Why one module:
each context has its own rules, and a value that is safe in one is an injection in another (``%h``
is harmless in bash but a systemd specifier; ``$(id)`` is harmless in a unit's Environment= but
runs in bash; a newline ends a unit setting or an env-file line). Every helper takes the dotted
profile field the value came from, so a value that cannot be made safe fails with a
:class:`RenderError` that names it.

Rules, with sources:

- bash: :func:`shlex.quote` (single quotes; ``'`` becomes ``'"'"'``); NUL cannot be in an argv.
- systemd unit settings (systemd.unit(5) "Specifiers", systemd.service(5) "Command lines"): ``%``
  is a specifier prefix everywhere, so it is doubled; in ``ExecStart=`` ``$`` expands variables, so
  it is doubled too, and words are double-quoted with C-style escapes for ``\\`` and ``"``.
  Settings are single lines: control characters are refused (a ``\\`` at a line end would continue
  the line).
- EnvironmentFile= (systemd.exec(5)): ``KEY="value"``; inside double quotes a backslash escapes
  ``"``, ``\\``, `````, ``$`` (systemd src/basic/env-file.c, ``SHELL_NEED_ESCAPE``). No specifiers
  are expanded there. Newlines are refused (legal in quotes, but one line per variable keeps the
  file reviewable and the parse unambiguous). systemd 252 reads ``$`` and backticks in an env file
  literally either way (tests/validate/test_systemd_live.py checks the whole corpus against a live
  ``systemd --user``); escaping them keeps the file literal under a parser that expands too.
"""

from __future__ import annotations

import re
import shlex

from orchestrator.errors import RenderError

# C0 and C1 control characters and the Unicode line/paragraph separators: systemd splits lines on
# "\n" only, but Python's str.splitlines, editors and review tools also break on U+0085, U+2028 and
# U+2029, so a reviewer would read a different file than systemd does.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _fail(field: str, value: str, why: str, fix: str) -> RenderError:
    shown = value if len(value) <= 60 else value[:57] + "..."
    return RenderError(f"{field} = {shown!r}: {why}", fix=fix)


def sh_quote(value: str, field: str) -> str:
    """One bash word that expands to exactly ``value``."""
    if "\x00" in value:
        raise _fail(field, value, "contains a NUL byte, which no command-line argument can hold",
                    "remove the NUL character")
    return shlex.quote(value)


def sh_join(argv: list[str], field: str) -> str:
    return " ".join(sh_quote(a, field) for a in argv)


def _no_control(value: str, field: str, where: str) -> None:
    m = CONTROL.search(value)
    if m:
        raise _fail(field, value,
                    f"contains the control character {m.group()!r}, which cannot be written "
                    f"into {where}",
                    "remove newlines, tabs and other control characters from the value")


def unit_value(value: str, field: str) -> str:
    """A plain unit setting value (Description=, paths): specifiers escaped, one line."""
    _no_control(value, field, "a systemd unit setting")
    if value != value.strip():
        raise _fail(field, value, "has leading or trailing whitespace, which systemd strips",
                    "remove the surrounding spaces")
    return value.replace("%", "%%")


def unit_path(value: str, field: str) -> str:
    """An absolute path in a unit setting that takes a path (EnvironmentFile=, append:)."""
    if not value.startswith("/"):
        raise _fail(field, value, "is not an absolute path", "use a path starting with '/'")
    if re.search(r"\s", value):
        raise _fail(field, value, "contains whitespace, which path settings cannot quote",
                    "choose a path without spaces")
    return unit_value(value, field)


def exec_word(value: str, field: str) -> str:
    """One word of an ``ExecStart=`` command line, quoted so systemd passes ``value`` unchanged."""
    _no_control(value, field, "a systemd command line")
    escaped = (value.replace("\\", "\\\\").replace('"', '\\"')
               .replace("%", "%%").replace("$", "$$"))
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", value) and not value.startswith("-"):
        return escaped
    return f'"{escaped}"'


def exec_line(argv: list[str], field: str) -> str:
    """A full ``ExecStart=`` value. The first word must be an absolute path: we never let systemd
    search PATH, and a leading ``-``/``@``/``+``/``!`` would change how systemd runs it."""
    if not argv or not argv[0].startswith("/"):
        raise _fail(field, argv[0] if argv else "", "the program is not an absolute path",
                    "render an absolute path")
    return " ".join(exec_word(a, field) for a in argv)


def check_env_name(name: str, field: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise _fail(field, name, "is not a valid environment variable name",
                    "use letters, digits and '_' and do not start with a digit")
    return name


def env_file_line(name: str, value: str, field: str) -> str:
    """``NAME="value"`` for a systemd EnvironmentFile."""
    check_env_name(name, field)
    _no_control(value, field, "an environment file line")
    escaped = re.sub(r'(["\\`$])', r"\\\1", value)
    return f'{name}="{escaped}"'
