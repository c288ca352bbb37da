"""Dump the real sglang 0.5.23 and sglang-router 0.3.2 parsers to version-pinned JSON flag snapshots.

Owns ``orchestrator/catalog/flags/sglang-0.5.23.json`` and ``sglang-router-0.3.2.json``: per option
its option strings, dest, nargs, choices, type name, default repr, whether it takes a value,
deprecation and the first line of its help. Why: ``dsv4ctl plan`` validates rendered command lines
against these files without importing torch/sglang; CI proves the files still equal the real parsers
with ``--check``.

    python scripts/snapshot_flags.py           # (re)write both snapshots
    python scripts/snapshot_flags.py --check   # exit 1 and show a diff if a snapshot is stale

Needs the heavy parser environment (requirements/parsers.txt). Output is deterministic: options
sorted by their first option string, set-valued choices sorted, keys sorted, no timestamps, and
``SGLANG_*`` environment variables removed before import (one of them adds a ``--sampling-backend``
choice, ``SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE``); the snapshot is of the default environment.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FLAGS_DIR = REPO / "orchestrator" / "catalog" / "flags"
FORMAT = 1

# (engine key used by load_flag_table, upstream entry point the parser belongs to)
ENGINES: dict[str, str] = {
    "sglang": "sglang serve (sglang.srt.server_args.ServerArgs.add_cli_args)",
    "sglang-router": "python -m sglang_router.launch_router (RouterArgs.add_cli_args)",
}

_ACTION_NAMES = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "_HelpAction": "help",
    "_VersionAction": "version",
    "BooleanOptionalAction": "boolean_optional",
}


def _type_name(func: Any) -> str | None:
    if func is None:
        return None
    module = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or repr(func)
    return name if module == "builtins" else f"{module}.{name}"


# Options whose value is a credential (issue 19): marked ``"secret": true`` so dsv4ctl refuses them in
# extra_args (they would land in the launch script, the plan, the release and the process list) and
# takes them from the profile's ``secrets:`` instead. Upstream has no such marking; this list is ours
# and is reviewed when a snapshot is regenerated (a new option named like a key or password).
SECRET_DESTS: dict[str, frozenset[str]] = {
    "sglang": frozenset({"api_key", "admin_api_key", "ssl_keyfile_password"}),
    "sglang-router": frozenset({"api_key", "control_plane_api_keys", "oracle_password"}),
}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _choices(choices: Any) -> list[Any] | None:
    if choices is None:
        return None
    # Sorted: membership is all that matters, and upstream order is not stable. The router's
    # --tool-call-parser choices come from the Rust extension (get_available_tool_call_parsers) in
    # hash order, and sglang's --sampling-backend choices are a set of str (hash-seeded order).
    return sorted((_jsonable(c) for c in choices), key=lambda c: (type(c).__name__, c))


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def describe(action: argparse.Action, is_deprecated: bool) -> dict[str, Any]:
    """One option as plain JSON data."""
    help_text = (action.help or "").strip()
    first_line = help_text.splitlines()[0].strip() if help_text else ""
    kind = type(action).__name__
    entry: dict[str, Any] = {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "action": _ACTION_NAMES.get(kind, f"custom:{type(action).__module__}.{kind}"),
        "nargs": action.nargs,
        "takes_value": _takes_value(action),
        "choices": _choices(action.choices),
        "type": _type_name(action.type),
        "default": repr(action.default),
        "required": bool(action.required),
        "deprecated": is_deprecated,
        "help": first_line,
    }
    if isinstance(action.nargs, str) and action.nargs not in ("?", "*", "+"):
        raise SystemExit(f"unsupported nargs {action.nargs!r} on {action.option_strings}")
    return entry


def build_snapshots() -> dict[str, dict[str, Any]]:
    """Build both snapshots from the real, installed parsers."""
    for key in [k for k in os.environ if k.startswith("SGLANG_")]:
        del os.environ[key]
    sys.path.insert(0, str(REPO))
    from tests.parsers import (
        ROUTER_VERSION,
        SGLANG_VERSION,
        is_deprecated,
        router_parser,
        sglang_parser,
    )

    out: dict[str, dict[str, Any]] = {}
    for engine, version, parser in (
        ("sglang", SGLANG_VERSION, sglang_parser()),
        ("sglang-router", ROUTER_VERSION, router_parser()),
    ):
        options = [describe(a, is_deprecated(a)) for a in parser._actions if a.option_strings]
        for o in options:
            if o["dest"] in SECRET_DESTS[engine]:
                o["secret"] = True
        options.sort(key=lambda o: o["option_strings"][0])
        out[f"{engine}-{version}.json"] = {
            "format": FORMAT,
            "engine": engine,
            "version": version,
            "entry_point": ENGINES[engine],
            "generated_by": "scripts/snapshot_flags.py",
            # The upstream parser abbreviates (argparse default); dsv4ctl never relies on it.
            "upstream_allow_abbrev": True,
            "options": options,
        }
    return out


def render(snapshot: dict[str, Any]) -> str:
    return json.dumps(snapshot, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--check", action="store_true", help="compare instead of writing; 1 if stale")
    cli.add_argument("--dir", type=Path, default=FLAGS_DIR, help="snapshot directory")
    args = cli.parse_args(argv)
    stale = 0
    for name, snapshot in build_snapshots().items():
        path = args.dir / name
        text = render(snapshot)
        if not args.check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({len(snapshot['options'])} options)")
            continue
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            stale += 1
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"{path} (committed)",
                f"{path} (real parser)",
                n=2,
            )
            sys.stdout.writelines(list(diff)[:200])
            print(f"STALE: {path}; fix: python scripts/snapshot_flags.py", file=sys.stderr)
        else:
            print(f"ok: {path} equals the real parser ({len(snapshot['options'])} options)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
