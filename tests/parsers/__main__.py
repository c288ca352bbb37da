"""CLI: ``python -m tests.parsers sglang|router [--allow-deprecated] < argv.json``.

Owns the subprocess form of :mod:`tests.parsers` for callers that must not import torch themselves.
stdin holds one argv (a JSON list of strings) or a batch (a JSON list of such lists). stdout gets
JSON: the problem list for one argv, or one problem list per argv for a batch.
Exit status: 0 all accepted, 1 some argv has problems, 2 bad input or wrong installed versions.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tests.parsers.real import ParserVersionError, check_router_argv, check_sglang_argv


def _load_argvs(text: str) -> tuple[list[list[str]], bool]:
    """Return (argvs, is_batch); raise ValueError with what is wrong and how to fix it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"stdin is not JSON ({exc}); expected a list of strings") from exc
    if isinstance(data, list) and all(isinstance(a, str) for a in data):
        return [data], False
    if isinstance(data, list) and all(
        isinstance(argv, list) and all(isinstance(a, str) for a in argv) for argv in data
    ):
        return data, True
    raise ValueError(
        "stdin must be a JSON list of strings (one argv) or a list of such lists (a batch); "
        f"got {type(data).__name__}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m tests.parsers", description=__doc__)
    cli.add_argument("tool", choices=["sglang", "router"], help="which real parser to run")
    cli.add_argument("--allow-deprecated", action="store_true", help="accept deprecated options")
    args = cli.parse_args(argv)
    try:
        argvs, batch = _load_argvs(sys.stdin.read())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    check = check_sglang_argv if args.tool == "sglang" else check_router_argv
    try:
        results = [check(a, allow_deprecated=args.allow_deprecated) for a in argvs]
    except ParserVersionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json.dump(results if batch else results[0], sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 1 if any(results) else 0


if __name__ == "__main__":
    sys.exit(main())
