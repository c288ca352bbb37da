"""Test-side library that runs the REAL sglang 0.5.23 and sglang-router 0.3.2 argument parsers.

Owns the ground-truth check of rendered command lines (see :mod:`tests.parsers.real`). Lives under
``tests/`` because it needs the heavy parser environment (torch CPU, triton, sglang ``--no-deps``,
``requirements/parsers.txt``), which the ``dsv4ctl plan`` path must never import. Nothing is imported
from sglang until a check runs.

Python::

    from tests.parsers import check_sglang_argv, check_router_argv
    check_sglang_argv(["--model-path", "/m", "--tp-size", "8"])   # [] = accepted

Subprocess (argv JSON on stdin: one list of strings, or a list of such lists for a batch)::

    echo '["--model-path", "/m", "--tp", "8"]' | python -m tests.parsers sglang
"""

from __future__ import annotations

from tests.parsers.real import (
    ROUTER_VERSION,
    SGLANG_VERSION,
    ParserVersionError,
    StrictArgumentParser,
    check_router_argv,
    check_router_many,
    check_sglang_argv,
    check_sglang_many,
    is_deprecated,
    router_parser,
    sglang_parser,
)

__all__ = [
    "ROUTER_VERSION",
    "SGLANG_VERSION",
    "ParserVersionError",
    "StrictArgumentParser",
    "check_router_argv",
    "check_router_many",
    "check_sglang_argv",
    "check_sglang_many",
    "is_deprecated",
    "router_parser",
    "sglang_parser",
]
