#!/usr/bin/env python3
"""Regenerate the README's command and exit-code tables from the CLI itself.

The tables sit between ``<!-- BEGIN GENERATED: NAME -->`` and ``<!-- END GENERATED: NAME -->``
markers; everything else in the README is hand-written. Run ``python scripts/gen_readme.py`` after
changing a command's arguments or first help sentence, or an exit code;
``tests/unit/test_readme.py`` fails while the README and the CLI disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _first_sentence(cmd: click.Command) -> str:
    text = (cmd.help or "").split("\n\n", 1)[0].replace("\n", " ").strip()
    text = re.sub(r"\s+", " ", text)
    return text if text.endswith(".") else text + "."


def _usage(name: str, cmd: click.Command, ctx: click.Context) -> str:
    pieces = [p for p in cmd.collect_usage_pieces(ctx) if p != "[OPTIONS]"]
    return " ".join([f"dsv4ctl {name}", *pieces])


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def commands_table() -> str:
    sys.path.insert(0, str(REPO))
    from orchestrator.cli import cli

    ctx = click.Context(cli, info_name="dsv4ctl")
    rows = ["| command | what it does |", "|---|---|"]
    for name, cmd in cli.commands.items():  # registration order: the order of the workflow
        if cmd.hidden:
            continue
        if isinstance(cmd, click.Group):
            for sub, sc in cmd.commands.items():
                rows.append(f"| `{_cell(_usage(f'{name} {sub}', sc, ctx))}` | "
                            f"{_cell(_first_sentence(sc))} |")
            continue
        rows.append(f"| `{_cell(_usage(name, cmd, ctx))}` | {_cell(_first_sentence(cmd))} |")
    return "\n".join(rows)


def exit_codes_table() -> str:
    sys.path.insert(0, str(REPO))
    from orchestrator.errors import EXIT_CODE_MEANINGS

    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| {int(code)} | {_cell(meaning)} |" for code, meaning in EXIT_CODE_MEANINGS.items()]
    return "\n".join(rows)


SECTIONS = {"commands": commands_table, "exit-codes": exit_codes_table}


def render(text: str) -> str:
    """``text`` (the README) with every generated section replaced by what the CLI says now."""
    for name, make in SECTIONS.items():
        begin = f"<!-- BEGIN GENERATED: {name} (scripts/gen_readme.py) -->"
        end = f"<!-- END GENERATED: {name} -->"
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no '{begin}' ... '{end}' section")
        text = pattern.sub(lambda _m, b=begin, e=end, mk=make: f"{b}\n{mk()}\n{e}", text)
    return text


def main() -> int:
    old = README.read_text(encoding="utf-8")
    new = render(old)
    if "--check" in sys.argv[1:]:
        if new != old:
            print("README.md is out of date: run python scripts/gen_readme.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
