"""Pure-python validation of an engine/router argv against a version-pinned flag snapshot.

Owns :class:`FlagTable` (the parsed snapshot JSON) and its ``check``: the argparse rules that matter
for rendered command lines — unknown option, abbreviation, missing or surplus value, invalid choice,
int/float/JSON value types, ``--opt=value`` on a flag, deprecated options — re-implemented from
CPython 3.11's ``argparse`` (``_parse_optional``, ``_match_argument``, ``_get_values``) over the
snapshot written by ``scripts/snapshot_flags.py``. Why: ``dsv4ctl plan`` must validate what it
renders without importing sglang (torch, triton). ``tests/parsers_real`` proves in CI that this
validator agrees with the real parsers on a corpus.

Standard library only; never import sglang, torch, triton or fabric here.

Past 400 lines on purpose: it mirrors argparse's matching step by step so it can be read beside
CPython's source; split, the steps would no longer line up with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from orchestrator.errors import did_you_mean

ProblemKind = Literal[
    "unknown_option",
    "abbreviation",
    "missing_value",
    "unexpected_value",
    "invalid_choice",
    "invalid_type",
    "invalid_json",
    "explicit_value_on_flag",
    "missing_required",
    "help_requested",
    "deprecated",
    "extra_values",
    "backend_selector",
]
Severity = Literal["error", "warning"]

# argparse's _negative_number_matcher: such tokens are values, not options, because no option of
# these parsers looks like a negative number.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class FlagProblem:
    """One problem in an argv: what (kind, option, value), why (message) and the fix."""

    kind: ProblemKind
    severity: Severity
    message: str
    fix: str
    option: str | None = None
    value: str | None = None
    index: int | None = None  # position of the offending token in argv
    choices: tuple[str, ...] = ()  # invalid_choice: the option's choices (a fix picks among them)

    def __str__(self) -> str:
        return f"{self.severity}: {self.message} Fix: {self.fix}"


@dataclass(frozen=True)
class FlagSpec:
    """One option of the pinned parser, as recorded in the snapshot."""

    option_strings: tuple[str, ...]
    dest: str
    action: str
    nargs: int | str | None  # None = exactly one value; 0 = a flag; "?", "*", "+"; or a count
    takes_value: bool
    choices: tuple[Any, ...] | None
    type: str | None
    default: str
    required: bool
    deprecated: bool
    help: str
    secret: bool = False  # a credential: never in extra_args, only from the profile's secrets:

    @property
    def name(self) -> str:
        """The canonical (first) option string."""
        return self.option_strings[0]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FlagSpec:
        choices = data.get("choices")
        return cls(
            option_strings=tuple(data["option_strings"]),
            dest=str(data["dest"]),
            action=str(data["action"]),
            nargs=data.get("nargs"),
            takes_value=bool(data["takes_value"]),
            choices=None if choices is None else tuple(choices),
            type=data.get("type"),
            default=str(data.get("default", "None")),
            required=bool(data.get("required", False)),
            deprecated=bool(data.get("deprecated", False)),
            help=str(data.get("help", "")),
            secret=bool(data.get("secret", False)),
        )


# --------------------------------------------------------------------------------------------
# Value converters: the snapshot names the upstream ``type=`` callable; these mirror the ones
# whose behaviour is plain data (each cites its source). A type not listed here is not value-checked
# offline; tests/parsers_real fails when a snapshot names a type this table does not know.
# --------------------------------------------------------------------------------------------


def _strict_json(value: str) -> Any:
    """orjson.loads semantics for json_list_type: no NaN/Infinity literals (stdlib allows them)."""

    def _reject(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(value, parse_constant=_reject)


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _human_readable_int(value: str) -> int:
    """Mirror of sglang 0.5.23 ``sglang/srt/utils/common.py::human_readable_int``."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise ValueError(f"decimals are not allowed with IEC suffix {suffix!r}")
            return int(number) * _IEC[suffix]
        try:
            return int(Decimal(number) * _SI[suffix])
        except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
            raise ValueError(value) from exc
    return int(value)


def _cuda_graph_backend(value: str) -> str:
    """Mirror of sglang 0.5.23 ``cuda_graph_config.py::parse_cuda_graph_backend_arg``."""
    if value == "tc_piecewise":
        raise ValueError("tc_piecewise was removed; select breakable, full, or disabled")
    return value


# sglang 0.5.23 sglang/srt/model_executor/cuda_graph_config.py: Phase.ALL, ALLOWED_KEYS_PER_PHASE.
_CUDA_GRAPH_PHASE_KEYS: dict[str, tuple[str, ...]] = {
    "decode": ("backend", "max_bs", "bs"),
    "prefill": (
        "backend",
        "max_bs",
        "bs",
        "max_context_size",
        "full_prefill_max_req",
        "full_prefill_prefix_chunk_tokens",
        "max_seq_len",
    ),
}


def _cuda_graph_config(value: str) -> dict[str, Any]:
    """Mirror of sglang 0.5.23 ``cuda_graph_config.py::parse_cuda_graph_config_arg``."""
    parsed = json.loads(value)
    if not isinstance(parsed, dict):
        raise ValueError(f"must be a JSON object, got {type(parsed).__name__}")
    for phase, settings in parsed.items():
        allowed = _CUDA_GRAPH_PHASE_KEYS.get(str(phase))
        if allowed is None:
            raise ValueError(f"unknown phase {phase!r}, expected one of {tuple(_CUDA_GRAPH_PHASE_KEYS)}")
        if not isinstance(settings, dict):
            raise ValueError(f"[{phase!r}] must be a JSON object, got {type(settings).__name__}")
        if "backend" in settings:
            _cuda_graph_backend(settings["backend"])
        unknown = [k for k in settings if k not in allowed]
        if unknown:
            raise ValueError(f"[{phase!r}]: unknown key {unknown[0]!r}, expected one of {allowed}")
    return parsed


def _nullable_str(value: str) -> str | None:
    return None if not value or value == "None" else value


_CONVERTERS: dict[str | None, Callable[[str], Any]] = {
    None: str,
    "str": str,
    "int": int,
    "float": float,
    "json.loads": json.loads,
    "sglang.srt.utils.common.human_readable_int": _human_readable_int,
    "sglang.srt.utils.common.json_list_type": _strict_json,
    "sglang.srt.utils.common.nullable_str": _nullable_str,
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": _cuda_graph_backend,
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": _cuda_graph_config,
}

_TYPE_WORDS = {"int": "an integer", "float": "a number", "json.loads": "JSON"}


# --------------------------------------------------------------------------------------------
# Checks beyond argparse, each for a value the upstream program parses after argparse.
# --------------------------------------------------------------------------------------------


def _json_object_rule(option: str, values: Sequence[str], index: int) -> list[FlagProblem]:
    """sglang ``--json-model-override-args`` is a ``str`` to argparse; ModelConfig json.loads it
    and merges it into the HF config at startup (sglang/srt/configs/model_config.py)."""
    raw = values[0]
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        return [
            FlagProblem(
                "invalid_json", "error",
                f"{option} {raw!r} is not valid JSON ({exc}); sglang json.loads it at startup, "
                "minutes after the launch.",
                'pass a JSON object, e.g. {"index_topk": 1024}.', option, raw, index,
            )
        ]
    if not isinstance(parsed, dict):
        return [
            FlagProblem(
                "invalid_json", "error",
                f"{option} {raw!r} is JSON but not an object; sglang merges it into the model config.",
                'pass a JSON object, e.g. {"index_topk": 1024}.', option, raw, index,
            )
        ]
    return []


def _prefill_rule(option: str, values: Sequence[str], index: int) -> list[FlagProblem]:
    """Router ``--prefill URL [BOOTSTRAP_PORT]`` is ``nargs='+'``; RouterArgs._parse_prefill_urls
    (sglang_router/router_args.py) int()s the second value (or 'none') and ignores the rest."""
    problems: list[FlagProblem] = []
    shown = " ".join(values)
    if len(values) > 2:
        problems.append(
            FlagProblem(
                "extra_values", "error",
                f"{option} {shown}: takes URL and at most one BOOTSTRAP_PORT; the router would "
                f"silently ignore {' '.join(values[2:])!r}.",
                "one --prefill per prefill server: --prefill URL BOOTSTRAP_PORT.",
                option, shown, index,
            )
        )
    if len(values) >= 2 and values[1].lower() != "none":
        try:
            port = int(values[1])
        except ValueError:
            port = None
        if port is None or not 1 <= port <= 65535:
            problems.append(
                FlagProblem(
                    "invalid_type", "error",
                    f"{option} {shown}: BOOTSTRAP_PORT {values[1]!r} is not a port number "
                    "(1..65535) or 'none'.",
                    "pass the prefill server's --disaggregation-bootstrap-port.",
                    option, values[1], index,
                )
            )
    return problems


_VALUE_RULES: dict[tuple[str, str], Callable[[str, Sequence[str], int], list[FlagProblem]]] = {
    ("sglang", "json_model_override_args"): _json_object_rule,
    ("sglang-router", "prefill"): _prefill_rule,
}


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


class FlagTable:
    """The options of one engine version, and an argv checker that needs no engine installed."""

    def __init__(self, engine: str, version: str, options: Sequence[FlagSpec]) -> None:
        self.engine = engine
        self.version = version
        self.options: tuple[FlagSpec, ...] = tuple(options)
        self._by_string: dict[str, FlagSpec] = {}
        for spec in self.options:
            for option in spec.option_strings:
                self._by_string[option] = spec

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FlagTable:
        return cls(
            str(data["engine"]),
            str(data["version"]),
            [FlagSpec.from_json(o) for o in data["options"]],
        )

    @property
    def tool(self) -> str:
        return f"{self.engine} {self.version}"

    def has(self, flag: str) -> bool:
        """Whether ``flag`` (exact option string, e.g. ``--tp-size``) exists in this version."""
        return flag in self._by_string

    def spec(self, flag: str) -> FlagSpec | None:
        return self._by_string.get(flag)

    def secret_options(self) -> list[FlagSpec]:
        """The options the snapshot marks as secret (``"secret": true``), by name."""
        return sorted((o for o in self.options if o.secret), key=lambda o: o.name)

    def secret_in(self, token: str) -> FlagSpec | None:
        """The secret option ``token`` names: exactly, as ``--opt=value``, or as a prefix of it
        (the upstream parsers accept unambiguous abbreviations, allow_abbrev)."""
        if not token.startswith("--") or len(token) < 3:
            return None
        name = token.split("=", 1)[0]
        exact = self._by_string.get(name)
        if exact is not None:
            return exact if exact.secret else None
        return next((spec for spec in self.secret_options()
                     if any(o.startswith(name) for o in spec.option_strings)), None)

    def option_strings(self) -> list[str]:
        return sorted(self._by_string)

    def errors(self, argv: Sequence[str]) -> list[FlagProblem]:
        """Only the problems that stop the launch or that dsv4ctl forbids (severity error)."""
        return [p for p in self.check(argv) if p.severity == "error"]

    # -- checking --------------------------------------------------------------------------

    def check(self, argv: Sequence[str]) -> list[FlagProblem]:
        """Every problem in ``argv`` (for sglang: what follows ``sglang serve``), in argv order.

        Deprecated options come back with severity ``warning``: upstream accepts them, dsv4ctl
        should not render them.
        """
        tokens = [str(t) for t in argv]
        problems: list[FlagProblem] = []
        if self.engine == "sglang":
            tokens, offsets = self._serve_dispatch(tokens, problems)
        else:
            offsets = list(range(len(tokens)))
        seen: set[str] = set()
        i = 0
        while i < len(tokens):
            token = tokens[i]
            where = offsets[i]
            if token == "--":
                rest = tokens[i + 1 :]
                problems.append(
                    FlagProblem(
                        "unexpected_value", "error",
                        f"'--' ends option parsing; {self.tool} would reject what follows "
                        f"({' '.join(rest) or 'nothing'}) as unrecognized arguments.",
                        "remove '--'.", "--", " ".join(rest), where,
                    )
                )
                break
            if not self._option_like(token):
                problems.append(self._stray(token, where))
                i += 1
                continue
            name, explicit = self._split(token)
            spec = self._by_string.get(name)
            if spec is None:
                values, i = self._values_after(tokens, i + 1, explicit)
                problems.append(self._unknown(name, values, where))
                continue
            seen.add(spec.dest)
            values, i, problem = self._consume(spec, name, tokens, i + 1, explicit, where)
            if problem is not None:
                problems.append(problem)
                continue
            if spec.action == "help":
                problems.append(
                    FlagProblem(
                        "help_requested", "error",
                        f"{name}: {self.tool} would print help and exit instead of serving.",
                        f"remove {name}.", name, None, where,
                    )
                )
                continue
            problems.extend(self._check_values(spec, name, values, where))
            if spec.deprecated:
                problems.append(
                    FlagProblem(
                        "deprecated", "warning",
                        f"{name} is deprecated in {self.tool} (\"{spec.help}\"); it is still "
                        "accepted with a warning and will be removed.",
                        "use the replacement the message names.", name, None, where,
                    )
                )
        for spec in self.options:
            if spec.required and spec.dest not in seen:
                problems.append(
                    FlagProblem(
                        "missing_required", "error",
                        f"{self.tool} requires {'/'.join(spec.option_strings)}.",
                        f"pass {spec.name} VALUE.", spec.name, None, None,
                    )
                )
        return problems

    # -- helpers ---------------------------------------------------------------------------

    def _serve_dispatch(
        self, tokens: list[str], problems: list[FlagProblem]
    ) -> tuple[list[str], list[int]]:
        """What ``sglang serve`` does before its parser (sglang/cli/serve.py): strip
        ``--model-type`` (backend selector) and turn a leading positional into ``--model-path``."""
        kept: list[str] = []
        offsets: list[int] = []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            backend: str | None = None
            if token == "--model-type":
                backend = tokens[i + 1] if i + 1 < len(tokens) else ""
                step = 2
            elif token.startswith("--model-type="):
                backend = token.split("=", 1)[1]
                step = 1
            if backend is not None:
                if backend not in ("auto", "llm"):
                    problems.append(
                        FlagProblem(
                            "backend_selector", "error",
                            f"--model-type {backend!r}: `sglang serve` would not start the "
                            "language-model server (empty or another backend).",
                            "drop --model-type.", "--model-type", backend, i,
                        )
                    )
                i += step
                continue
            kept.append(token)
            offsets.append(i)
            i += 1
        if kept and not kept[0].startswith("-"):
            kept.insert(0, "--model-path")
            offsets.insert(0, offsets[0])
        return kept, offsets

    def _option_like(self, token: str) -> bool:
        """argparse 3.11 ``_parse_optional`` returning non-None (without prefix matching)."""
        if not token or token[0] != "-" or len(token) == 1:
            return False
        if token in self._by_string:
            return True
        if "=" in token and token.split("=", 1)[0] in self._by_string:
            return True
        if _NEGATIVE_NUMBER.match(token):
            return False
        return " " not in token

    def _split(self, token: str) -> tuple[str, str | None]:
        if token in self._by_string:
            return token, None
        if "=" in token:
            head, tail = token.split("=", 1)
            if head in self._by_string:
                return head, tail
            return head, tail
        return token, None

    def _values_after(
        self, tokens: Sequence[str], start: int, explicit: str | None
    ) -> tuple[list[str], int]:
        if explicit is not None:
            return [explicit], start
        j = start
        while j < len(tokens) and tokens[j] != "--" and not self._option_like(tokens[j]):
            j += 1
        return list(tokens[start:j]), j

    def _consume(
        self,
        spec: FlagSpec,
        name: str,
        tokens: Sequence[str],
        start: int,
        explicit: str | None,
        where: int,
    ) -> tuple[list[str], int, FlagProblem | None]:
        """argparse ``consume_optional`` + ``_match_argument`` for one option occurrence."""
        nargs = spec.nargs
        if explicit is not None:
            if nargs == 0:
                return [], start, FlagProblem(
                    "explicit_value_on_flag", "error",
                    f"{name} takes no value but got {explicit!r} via '='; {self.tool} rejects it "
                    "(ignored explicit argument).",
                    f"write {name} alone, or leave it out to keep the default.",
                    name, explicit, where,
                )
            if isinstance(nargs, int) and nargs > 1:
                return [], start, self._missing(spec, name, where)
            return [explicit], start, None
        available, end = self._values_after(tokens, start, None)
        if nargs is None:
            wanted = 1
        elif nargs == "?":
            wanted = min(1, len(available))
        elif nargs in ("*", "+"):
            wanted = len(available)
        else:
            wanted = int(nargs)
        if len(available) < wanted or (nargs == "+" and not available):
            return [], end, self._missing(spec, name, where)
        return available[:wanted], start + wanted, None

    def _missing(self, spec: FlagSpec, name: str, where: int) -> FlagProblem:
        how = {None: "one value", "?": "at most one value", "+": "one or more values"}.get(
            spec.nargs if isinstance(spec.nargs, str | type(None)) else None,
            f"{spec.nargs} value(s)",
        )
        return FlagProblem(
            "missing_value", "error",
            f"{name} expects {how} but none follows (values starting with '-' count as options).",
            f"write {name} VALUE, or {name}=VALUE for a value that starts with '-'.",
            name, None, where,
        )

    def _check_values(
        self, spec: FlagSpec, name: str, values: Sequence[str], where: int
    ) -> list[FlagProblem]:
        problems: list[FlagProblem] = []
        converter = _CONVERTERS.get(spec.type)
        for raw in values:
            value: Any = raw
            if converter is not None:
                try:
                    value = converter(raw)
                except (ValueError, TypeError) as exc:
                    word = _TYPE_WORDS.get(spec.type or "", f"a value for {spec.type}")
                    problems.append(
                        FlagProblem(
                            "invalid_type", "error",
                            f"{name} {raw!r} is not {word} ({exc}).",
                            f"give {name} {word}.", name, raw, where,
                        )
                    )
                    continue
            if spec.choices is not None and value not in spec.choices:
                problems.append(
                    FlagProblem(
                        "invalid_choice", "error",
                        f"{name} '{raw}' is not one of the {len(spec.choices)} choices of "
                        f"{self.tool}.",
                        did_you_mean(raw, spec.choices), name, raw, where,
                        tuple(str(c) for c in spec.choices),
                    )
                )
        if not problems:
            rule = _VALUE_RULES.get((self.engine, spec.dest))
            if rule is not None and values:
                problems.extend(rule(name, values, where))
        return problems

    def _unknown(self, name: str, values: Sequence[str], where: int) -> FlagProblem:
        shown = " ".join(values) if values else None
        matches = sorted(o for o in self._by_string if o.startswith(name) and o != name)
        if matches and name.startswith("--"):
            ambiguous = len(matches) > 1
            return FlagProblem(
                "abbreviation", "error",
                f"{name} is only a prefix of {', '.join(matches)}; {self.tool} would "
                + ("reject it as ambiguous" if ambiguous else "expand it silently")
                + ", and dsv4ctl always writes full option names.",
                "write " + (" or ".join(matches)) + ".",
                name, shown, where,
            )
        return FlagProblem(
            "unknown_option", "error",
            f"{name} is not an option of {self.tool}.",
            "check the spelling against this version's --help, or drop it.",
            name, shown, where,
        )

    def _stray(self, token: str, where: int) -> FlagProblem:
        return FlagProblem(
            "unexpected_value", "error",
            f"{token!r} follows no option that takes it (too many values, or a value after a "
            f"flag); {self.tool} would reject it as an unrecognized argument.",
            "remove it or attach it to the right option.", None, token, where,
        )
