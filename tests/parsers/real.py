"""Run the REAL argument parsers of the pinned SGLang 0.5.23 and sglang-router 0.3.2 over argv lists.

Owns: importing the installed upstream packages (after checking their versions are exactly the pinned
ones), building strict copies of their parsers, and turning an argv into human-readable problems.
Why: dsv4ctl renders engine and router command lines; the only proof that a rendered line starts is
that the very parser the host will run accepts it. A flag snapshot (``orchestrator/catalog/flags``)
serves fast checks; this module is the ground truth those checks are tested against.

Two passes per argv:

1. *strict*: ``argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)`` filled by the
   upstream ``add_cli_args``; ``parse_known_args`` so every unknown token is reported, and unknown
   tokens that are a prefix of a real option are reported as abbreviations (upstream parsers keep
   ``allow_abbrev=True``, so ``--tp 8`` would start today and break silently when a new
   ``--tp-...`` option lands; dsv4ctl always writes full names).
2. *faithful*: the exact upstream entry path (``sglang serve`` → ``prepare_server_args``;
   ``sglang_router.launch_router.parse_router_args``), so anything the real launcher's argument
   stage rejects is reported even if the strict copy missed it.

Importing sglang costs ~2 s (torch), so parsers are built once per process and cached; call the
``check_*`` functions for many argvs in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import io
import json
import logging
import re
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from unittest import mock

SGLANG_VERSION = "0.5.23"
ROUTER_VERSION = "0.3.2"

# Help text of options that upstream retired without a Deprecated* action class, e.g.
# "(Deprecated, use --smg-grpc-mode) ..." or "Deprecated. Use --image-processor-backend=pil ...".
_DEPRECATED_HELP = re.compile(r"^\(?\s*deprecated\b", re.IGNORECASE)

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's _negative_number_matcher

# Set when the real triton failed to import and the stub below was installed instead.
TRITON_STUBBED: bool = False


class ParserVersionError(RuntimeError):
    """The installed sglang / sglang-router is not the pinned version: results would be meaningless."""


class _Rejected(Exception):
    """Raised instead of argparse's print-usage-and-exit, so one bad argv does not end the process."""


class StrictArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that never abbreviates and raises instead of exiting.

    ``exit_on_error=False`` only covers ``ArgumentError`` on Python 3.11; missing required options,
    ambiguity and ``parser.error`` calls from upstream actions still go through ``error()``, hence the
    override.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog=prog, exit_on_error=False, allow_abbrev=False)

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise _Rejected(message)

    def exit(self, status: int = 0, message: str | None = None) -> Any:  # type: ignore[override]
        raise _Rejected(message or f"the parser exited with status {status} (e.g. --help)")


# --------------------------------------------------------------------------------------------
# Importing the pinned packages
# --------------------------------------------------------------------------------------------


def _require_version(distribution: str, expected: str) -> None:
    try:
        found = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ParserVersionError(
            f"{distribution} is not installed; the real-parser checks need exactly "
            f"{distribution}=={expected}. Fix: pip install -r requirements/parsers.txt "
            "(sglang with --no-deps, see that file)."
        ) from exc
    if found != expected:
        raise ParserVersionError(
            f"{distribution} {found} is installed but dsv4ctl pins {expected}; flags differ between "
            f"releases. Fix: pip install --no-deps {distribution}=={expected}."
        )


def _stub_triton(reason: BaseException) -> None:
    """Install a do-nothing ``triton`` so sglang's top-level kernel modules import.

    Only the argument parser is used; no kernel ever runs. This is the fallback proven in
    /work/shared/research/env-probe.md §3 (torch cannot be stubbed, triton can). It is taken only
    when the real triton fails to import, and it says so on stderr.
    """
    global TRITON_STUBBED

    class _Anything(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            return mock.MagicMock(name=f"{self.__name__}.{name}")

    for name in ("triton", "triton.language", "triton.runtime", "triton.language.extra"):
        module = _Anything(name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__version__ = "0.0.0-stub"  # type: ignore[attr-defined]
        sys.modules[name] = module
    TRITON_STUBBED = True
    print(
        f"tests.parsers: real triton failed to import ({type(reason).__name__}: {reason}); "
        "using a stub. Parsing does not execute kernels, but install triton to check for real.",
        file=sys.stderr,
    )


@functools.cache
def _import_sglang() -> types.ModuleType:
    """Import ``sglang.srt.server_args`` from the pinned, installed sglang; return that module."""
    _require_version("sglang", SGLANG_VERSION)
    try:
        import triton  # noqa: F401  (sglang imports it at top level; try the real one first)
    except Exception as exc:  # ImportError, or RuntimeError from a broken driver probe
        _stub_triton(exc)
    import sglang.version
    from sglang.srt import server_args

    if sglang.version.__version__ != SGLANG_VERSION:
        raise ParserVersionError(
            f"sglang.version reports {sglang.version.__version__}, distribution metadata "
            f"{SGLANG_VERSION}: a mixed installation. Fix: pip install --force-reinstall --no-deps "
            f"sglang=={SGLANG_VERSION}."
        )
    return server_args


@functools.cache
def _import_router() -> types.ModuleType:
    """Import ``sglang_router.launch_router`` from the pinned, installed sglang-router."""
    _require_version("sglang-router", ROUTER_VERSION)
    from sglang_router import launch_router
    from sglang_router.version import __version__

    if __version__ != ROUTER_VERSION:
        raise ParserVersionError(
            f"sglang_router.version reports {__version__}, distribution metadata {ROUTER_VERSION}. "
            f"Fix: pip install --force-reinstall sglang-router=={ROUTER_VERSION}."
        )
    return launch_router


@functools.cache
def sglang_parser() -> StrictArgumentParser:
    """The strict copy of sglang 0.5.23's server parser (``ServerArgs.add_cli_args``)."""
    server_args = _import_sglang()
    parser = StrictArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    return parser


@functools.cache
def router_parser() -> StrictArgumentParser:
    """The strict copy of sglang-router 0.3.2's parser (``RouterArgs.add_cli_args``)."""
    launch_router = _import_router()
    parser = StrictArgumentParser(prog="python -m sglang_router.launch_router")
    # Same call as upstream parse_router_args (sglang_router/launch_router.py).
    launch_router.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def is_deprecated(action: argparse.Action) -> bool:
    """Whether upstream marks this option as deprecated.

    Two shapes exist in 0.5.23: a ``Deprecated*Action`` class
    (``sglang/srt/arg_groups/argparse_actions.py``) and a plain action whose help starts with
    "Deprecated" / "(Deprecated". Python 3.11's argparse has no ``deprecated=`` keyword.
    """
    return type(action).__name__.startswith("Deprecated") or bool(
        _DEPRECATED_HELP.match(action.help or "")
    )


# --------------------------------------------------------------------------------------------
# Checking one argv
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Capture stdout/stderr of upstream code and restore the root logger it reconfigures.

    ``prepare_server_args`` calls ``logging.basicConfig(force=True)``, which would replace the
    caller's (e.g. pytest's) handlers.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buffer = io.StringIO()
    # Logging handlers hold the stream they were created with, so redirecting sys.stderr is not
    # enough for upstream warnings (e.g. the deprecated-flag warning of argparse_actions.py).
    root.handlers[:] = [logging.StreamHandler(buffer)]
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _option_like(token: str) -> bool:
    """argparse's test for "looks like an option" (``_parse_optional``, Python 3.11)."""
    return (
        len(token) > 1
        and token.startswith("-")
        and not _NEGATIVE_NUMBER.match(token)
        and " " not in token
    )


def _classify_extras(parser: argparse.ArgumentParser, extras: Sequence[str], tool: str) -> list[str]:
    """Explain what ``parse_known_args`` could not place: abbreviations, unknown options, strays."""
    problems: list[str] = []
    options = sorted(parser._option_string_actions)
    i = 0
    while i < len(extras):
        token = extras[i]
        values: list[str] = []
        if token == "--":
            problems.append(
                f"'--' ends option parsing; {tool} would reject what follows "
                f"({' '.join(extras[i + 1 :]) or 'nothing'}) as unrecognized. Fix: remove '--'."
            )
            break
        if _option_like(token):
            j = i + 1
            while j < len(extras) and not _option_like(extras[j]):
                values.append(extras[j])
                j += 1
            name = token.split("=", 1)[0]
            matches = [o for o in options if o.startswith(name) and o != name]
            shown = f" (followed by {' '.join(repr(v) for v in values)})" if values else ""
            if matches:
                problems.append(
                    f"abbreviated option {name!r}{shown}: it is only a prefix of "
                    f"{', '.join(matches)}; {tool} would "
                    + ("reject it as ambiguous" if len(matches) > 1 else "expand it silently")
                    + ", and dsv4ctl always writes full option names. Fix: write "
                    + (" or ".join(matches) if len(matches) > 1 else matches[0])
                    + "."
                )
            else:
                problems.append(
                    f"unknown option {name!r}{shown}: {tool} has no such option. Fix: check the "
                    "spelling against the pinned version's --help, or drop it."
                )
            i = j
        else:
            problems.append(
                f"unexpected value {token!r}: no option takes it (an option given too many values, "
                "or a flag that takes no value). Fix: remove it or attach it to the right option."
            )
            i += 1
    return problems


def _used_actions(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for token in argv:
        name = token.split("=", 1)[0] if token.startswith("--") else token
        action = parser._option_string_actions.get(name)
        if action is not None:
            found.append((name, action))
    return found


def _strict_check(
    parser: argparse.ArgumentParser, argv: Sequence[str], tool: str, allow_deprecated: bool
) -> tuple[list[str], argparse.Namespace | None]:
    problems: list[str] = []
    namespace: argparse.Namespace | None = None
    with _quiet() as out:
        try:
            namespace, extras = parser.parse_known_args(list(argv))
        except argparse.ArgumentError as exc:
            problems.append(f"{tool} rejects it: {exc}")
            extras = []
        except _Rejected as exc:
            detail = str(exc) or _last_line(out.getvalue())
            problems.append(f"{tool} rejects it: {detail}")
            extras = []
    problems.extend(_classify_extras(parser, extras, tool))
    if not allow_deprecated:
        for name, action in _used_actions(parser, argv):
            if is_deprecated(action):
                first = (action.help or "").strip().splitlines()[0] if action.help else ""
                problems.append(
                    f"deprecated option {name!r}: {tool} still accepts it but warns "
                    f"({first}). dsv4ctl must not render deprecated options."
                )
    return problems, namespace


def _serve_dispatch(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Replay what ``sglang serve ARGV`` does before the server parser sees ARGV.

    The console script ``sglang = sglang.cli.main:main`` parses ``serve`` with a top-level parser
    (``parse_known_args``) and hands the rest to ``sglang.cli.serve.serve``, which strips
    ``--model-type`` (backend selector), turns a leading positional into ``--model-path`` and, for
    the LLM backend, calls ``prepare_server_args(argv)``. We run the real ``main()`` with ``serve``
    intercepted, then the real helper functions of ``sglang.cli.serve``.
    Returns (problems, argv for prepare_server_args).
    """
    _import_sglang()
    from sglang.cli import main as cli_main
    from sglang.cli import serve as cli_serve

    captured: list[list[str]] = []

    def _capture(args: argparse.Namespace, extra_argv: list[str]) -> None:
        captured.append(list(extra_argv))

    with (
        _quiet() as out,
        mock.patch.object(sys, "argv", ["sglang", "serve", *argv]),
        mock.patch.object(cli_serve, "serve", _capture),
    ):
        try:
            cli_main.main()
        except SystemExit as exc:
            return [f"the sglang console script rejects it: {_last_line(out.getvalue()) or exc}"], []
    if not captured:
        return ["the sglang console script did not dispatch to `serve`"], []
    try:
        backend, rest = cli_serve._extract_model_type_override(captured[0])
    except ValueError as exc:
        return [f"sglang serve rejects it: {exc}"], []
    rest, _positional = cli_serve._normalize_positional_model_path(rest)
    if backend not in ("auto", "llm"):
        return [
            f"--model-type {backend!r}: dsv4ctl serves language models; `sglang serve` would "
            "dispatch to another backend with its own parser. Fix: drop --model-type."
        ], []
    if any(h in rest for h in ("-h", "--help")):
        return ["--help: `sglang serve` would print help and exit instead of serving"], []
    return [], rest


def _json_object_problems(namespace: argparse.Namespace) -> list[str]:
    """``--json-model-override-args`` is a plain ``str`` to argparse; ModelConfig later does
    ``json.loads`` and merges it into the HF config (sglang/srt/configs/model_config.py), so bad
    JSON passes the parser and kills the server minutes into startup. Check it here."""
    raw = getattr(namespace, "json_model_override_args", None)
    if raw is None:
        return []
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return [
            f"--json-model-override-args {raw!r} is not valid JSON ({exc}); sglang json.loads it at "
            "startup. Fix: pass a JSON object such as '{\"index_topk\": 1024}'."
        ]
    if not isinstance(value, dict):
        return [
            f"--json-model-override-args {raw!r} is JSON but not an object; sglang merges it into "
            "the model config. Fix: pass a JSON object such as '{\"index_topk\": 1024}'."
        ]
    return []


def check_sglang_argv(
    argv: Sequence[str], *, allow_deprecated: bool = False, faithful: bool = True
) -> list[str]:
    """Problems with ``sglang serve ARGV`` under the real sglang 0.5.23 parser; [] = accepted.

    ``argv`` is what follows ``sglang serve``. Deprecated options are problems unless
    ``allow_deprecated``: upstream accepts them with a warning, dsv4ctl must not render them.
    ``faithful=False`` skips the second pass through ``prepare_server_args`` (it rebuilds the
    532-option parser, ~0.1 s per call); for bulk differential tests only.
    """
    argv = [str(a) for a in argv]
    problems, dispatched = _serve_dispatch(argv)
    if problems:
        return problems
    server_args = _import_sglang()
    problems, namespace = _strict_check(
        sglang_parser(), dispatched, "sglang 0.5.23", allow_deprecated
    )
    if namespace is not None and not any("rejects" in p for p in problems):
        problems.extend(_json_object_problems(namespace))
    if problems or not faithful:
        return problems
    # Faithful pass: the exact function `sglang serve` calls for the LLM backend.
    with _quiet() as out:
        try:
            server_args.prepare_server_args(list(dispatched))
        except SystemExit as exc:
            return [f"sglang 0.5.23 prepare_server_args rejects it: {_last_line(out.getvalue()) or exc}"]
        except Exception as exc:
            return [f"sglang 0.5.23 prepare_server_args fails: {type(exc).__name__}: {exc}"]
    return []


def _prefill_problems(namespace: argparse.Namespace) -> list[str]:
    """``--prefill URL [BOOTSTRAP_PORT]`` is ``nargs='+'``: argparse takes any number of values and
    RouterArgs._parse_prefill_urls (sglang_router/router_args.py) silently ignores a third one and
    treats an omitted port as "none" (no bootstrap). Reject the silent cases."""
    problems: list[str] = []
    for values in getattr(namespace, "prefill", None) or []:
        if len(values) > 2:
            problems.append(
                f"--prefill {' '.join(values)}: takes URL and at most one BOOTSTRAP_PORT; the router "
                f"would silently ignore {' '.join(values[2:])!r}. Fix: one --prefill per server."
            )
        if len(values) >= 2 and values[1].lower() != "none":
            try:
                port = int(values[1])
            except ValueError:
                continue  # the faithful pass reports this one (ValueError in _parse_prefill_urls)
            if not 1 <= port <= 65535:
                problems.append(
                    f"--prefill {values[0]} {values[1]}: bootstrap port outside 1..65535. Fix: use "
                    "the prefill server's --disaggregation-bootstrap-port."
                )
    return problems


def check_router_argv(
    argv: Sequence[str], *, allow_deprecated: bool = False, faithful: bool = True
) -> list[str]:
    """Problems with ``python -m sglang_router.launch_router ARGV`` under sglang-router 0.3.2.

    ``faithful=False`` skips the second pass through ``parse_router_args``.
    """
    argv = [str(a) for a in argv]
    launch_router = _import_router()
    problems, namespace = _strict_check(
        router_parser(), argv, "sglang-router 0.3.2", allow_deprecated
    )
    if namespace is not None and not problems:
        problems.extend(_prefill_problems(namespace))
    if problems or not faithful:
        return problems
    with _quiet() as out:
        try:
            router_args = launch_router.parse_router_args(list(argv))
            router_args._validate_router_args()  # what launch_router() runs before starting
        except SystemExit as exc:
            return [f"sglang-router 0.3.2 parse_router_args rejects it: {_last_line(out.getvalue()) or exc}"]
        except Exception as exc:
            return [f"sglang-router 0.3.2 parse_router_args fails: {type(exc).__name__}: {exc}"]
    return []


def check_many(
    check: Callable[[Sequence[str]], list[str]], argvs: Iterable[Sequence[str]]
) -> list[list[str]]:
    """Batch form: one problem list per argv, in order (parsers are built once)."""
    return [check(argv) for argv in argvs]


def check_sglang_many(argvs: Iterable[Sequence[str]]) -> list[list[str]]:
    return check_many(check_sglang_argv, argvs)


def check_router_many(argvs: Iterable[Sequence[str]]) -> list[list[str]]:
    return check_many(check_router_argv, argvs)
