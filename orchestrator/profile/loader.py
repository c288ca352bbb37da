"""Reading profiles and inventories from YAML into validated models, with errors that point at lines.

PyYAML gives us a node tree with positions; pydantic gives us error locations as key paths. This module
joins the two, so every problem names the file, line and column, the dotted path, the offending value,
the reason and a fix. It never lets a parser or validator exception escape as a traceback: everything
becomes an :class:`~orchestrator.errors.InputError`.

Just past 400 lines: the YAML-position side (safe loader, size budget, node lookup) and the
pydantic-error side (schema walk, hints) meet in :func:`validate`; apart, neither could name a
line and a fix in one message.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import InputError, Problem, did_you_mean
from orchestrator.profile.inventory import Inventory
from orchestrator.profile.schema import Profile

M = TypeVar("M", bound=BaseModel)

MAX_BYTES = 1 << 20  # a profile is a page of YAML; a megabyte is already absurd
MAX_NODES = 50_000  # bounds alias expansion ("billion laughs") and pathological documents
# The node count alone let a 445 KB profile of aliases to one 4 KB string expand to 80 MB of
# extra_args (a launch script rendered in 56 s, issue 19): the expanded text and every list's
# length are capped too. A real profile expands to a few KB and its longest list is a GPU set.
MAX_EXPANDED_BYTES = 2 << 20  # scalar text of the document with every alias expanded
MAX_LIST_ITEMS = 1024  # items of any one sequence, aliases expanded


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, which PyYAML would otherwise silently overwrite."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError as exc:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value, not a list or mapping",
                key_node.start_mark,
            ) from exc
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark,
                f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

if getattr(yaml, "__with_libyaml__", False):
    class _CLoader(yaml.CSafeLoader):
        """The same loader over libyaml's parser (the constructors, duplicate-key check
        included, are the same Python code)."""

    _CLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
else:  # PyYAML built without libyaml: the pure parser only
    _CLoader = None  # type: ignore[assignment,misc]


def _parse_fast(text: str) -> tuple[Any, yaml.Node] | None:
    """One plain, valid document parsed once with libyaml, ~15x faster than the pure parser
    (a no-change apply parses nine YAML texts: issue 20 #10). None for anything else - no
    libyaml, a syntax error, several documents, an over-budget one - so the pure parser runs
    and reports it exactly as before."""
    if _CLoader is None:
        return None
    try:
        nodes = list(yaml.compose_all(text, Loader=_CLoader))
        if len(nodes) != 1 or nodes[0] is None:
            return None
        _count_nodes(nodes[0], _Budget())
        return _CLoader("").construct_document(nodes[0]), nodes[0]
    except Exception:  # whatever it is, the pure parser below reports it
        return None


def _short(value: Any, limit: int = 60) -> str:
    """A value as YAML would write it (no Python reprs such as None or {'a': 1})."""
    text = (f"'{value}'" if isinstance(value, str)
            else json.dumps(value, default=str, ensure_ascii=False))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Budget:
    """What the document may still expand to: nodes and scalar bytes (aliases counted each time
    they are used, which is what the constructor builds)."""

    def __init__(self) -> None:
        self.nodes = MAX_NODES
        self.bytes = MAX_EXPANDED_BYTES


def _count_nodes(node: yaml.Node, budget: _Budget) -> None:
    budget.nodes -= 1
    if budget.nodes < 0:
        raise _TooLarge(f"the document expands to more than {MAX_NODES} values", node)
    if isinstance(node, yaml.ScalarNode):
        budget.bytes -= len(node.value)
        if budget.bytes < 0:
            raise _TooLarge(f"the document expands to more than {MAX_EXPANDED_BYTES} bytes of "
                            "text", node)
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _count_nodes(k, budget)
            _count_nodes(v, budget)
    elif isinstance(node, yaml.SequenceNode):
        if len(node.value) > MAX_LIST_ITEMS:
            raise _TooLarge(f"a list has {len(node.value)} items, more than {MAX_LIST_ITEMS}",
                            node)
        for v in node.value:
            _count_nodes(v, budget)


class _TooLarge(Exception):
    def __init__(self, message: str, node: yaml.Node) -> None:
        super().__init__(message)
        self.message, self.node = message, node


def parse_yaml(text: str, filename: str) -> tuple[Any, yaml.Node | None]:
    """Parse one YAML document; returns the data and the node tree (for line numbers)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise InputError(
            kind=filename,
            problems=[Problem("", f"the file is larger than {MAX_BYTES} bytes", file=filename,
                              fix="a profile is a page of YAML; check that this is the right file")],
        )
    fast = _parse_fast(text)
    if fast is not None:
        return fast
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
        if len(nodes) > 1:
            second = nodes[1]
            raise InputError(
                kind=filename,
                problems=[Problem("", "the file holds more than one YAML document", file=filename,
                                  line=second.start_mark.line + 1 if second else None,
                                  fix="keep one profile per file (remove the extra '---' section)")],
            )
        node = nodes[0] if nodes else None
        if node is not None:
            _count_nodes(node, _Budget())
        data = yaml.load(text, Loader=_Loader) if node is not None else None
    except _TooLarge as exc:
        mark = exc.node.start_mark
        raise InputError(
            kind=filename,
            problems=[Problem("", exc.message, file=filename, line=mark.line + 1,
                              column=mark.column + 1,
                              fix="remove YAML aliases (*name) that multiply content; a profile "
                                  "is a page of plain values")],
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = exc.problem or exc.context or "YAML syntax error"
        raise InputError(
            kind=filename,
            problems=[Problem("", f"YAML syntax: {reason}", file=filename,
                              line=mark.line + 1 if mark else None,
                              column=mark.column + 1 if mark else None,
                              fix="fix the YAML syntax at that position (indentation, quotes, colons)")],
        ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise InputError(
            kind=filename,
            problems=[Problem("", f"cannot read YAML: {exc}", file=filename,
                              fix="check the file is UTF-8 YAML")],
        ) from None
    return data, node


def _node_at(node: yaml.Node | None, loc: Sequence[int | str]) -> tuple[yaml.Node | None, list]:
    """Follow ``loc`` through the node tree. Returns the deepest node reached and the YAML path walked.

    Pydantic inserts discriminator tags (``pd``) and type names into union locations; those are not
    keys in the document, so an element that cannot be followed is skipped if the next one can.
    """
    walked: list = []
    current = node
    items = list(loc)
    i = 0
    while i < len(items) and current is not None:
        key = items[i]
        nxt: yaml.Node | None = None
        if isinstance(current, yaml.MappingNode):
            for k, v in current.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(key):
                    nxt = v
                    break
        elif (
            isinstance(current, yaml.SequenceNode)
            and isinstance(key, int)
            and 0 <= key < len(current.value)
        ):
            nxt = current.value[key]
        if nxt is None:
            if i + 1 < len(items):
                i += 1  # a union tag or model name inserted by pydantic
                continue
            break
        walked.append(key)
        current = nxt
        i += 1
    return current, walked


@functools.cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(by_alias=True)


def _subschema(model: type[BaseModel], path: Iterable[int | str]) -> dict[str, Any] | None:
    """The JSON schema that applies at ``path`` (best effort; used only to write better hints)."""
    root = _schema(model)
    defs = root.get("$defs", {})

    def deref(s: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in s:
            s = defs.get(s["$ref"].rsplit("/", 1)[-1], {})
        return s

    def options(s: dict[str, Any]) -> list[dict[str, Any]]:
        s = deref(s)
        for key in ("anyOf", "oneOf"):
            if key in s:
                out: list[dict[str, Any]] = []
                for alt in s[key]:
                    out.extend(options(alt))
                return out
        return [s]

    current: list[dict[str, Any]] = [root]
    for key in path:
        nxt: list[dict[str, Any]] = []
        for s in current:
            for alt in options(s):
                if isinstance(key, str) and key in alt.get("properties", {}):
                    nxt.append(alt["properties"][key])
                elif isinstance(key, str) and isinstance(alt.get("additionalProperties"), dict):
                    nxt.append(alt["additionalProperties"])
                elif isinstance(key, int) and isinstance(alt.get("items"), dict):
                    nxt.append(alt["items"])
        if not nxt:
            return None
        current = nxt
    merged: dict[str, Any] = {}
    for s in current:
        for alt in options(s):
            for k, v in alt.items():
                if k == "properties":
                    merged.setdefault("properties", {}).update(v)
                else:
                    merged.setdefault(k, v)
    return merged


_EXPECTED = (
    ("int", "a whole number, e.g. 4"),
    ("float", "a number, e.g. 0.85"),
    ("bool", "true or false"),
    ("string", "a text value (quote it if it looks like a number)"),
    ("list", "a list, e.g. [0, 1, 2, 3]"),
    ("dict", "a mapping of keys to values"),
    ("model", "a mapping of keys to values"),
)


def _hint(model: type[BaseModel], err: dict[str, Any], yaml_path: list) -> tuple[str, str | None]:
    """Reason and fix for one pydantic error."""
    kind = err["type"]
    msg = err["msg"]
    ctx = err.get("ctx") or {}
    loc = [p for p in yaml_path]
    if kind == "extra_forbidden":
        parent = _subschema(model, loc[:-1]) or {}
        allowed = sorted(parent.get("properties", {}))
        name = str(err["loc"][-1])
        close = difflib.get_close_matches(name, allowed, n=1)
        fix = f"did you mean '{close[0]}'?" if close else None
        if allowed:
            listing = ", ".join(allowed)
            fix = (fix + " " if fix else "") + f"Allowed keys here: {listing}."
        return f"unknown key '{name}'", fix or "remove it"
    if kind == "missing":
        name = str(err["loc"][-1])
        sub = _subschema(model, [*loc, name]) or {}
        desc = sub.get("description")
        return f"required key '{name}' is missing", (
            f"add '{name}:'" + (f" ({desc})" if desc else "")
        )
    if kind in ("literal_error", "enum"):
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        value = err.get("input")
        return (f"{_short(value)} is not one of the {len(choices)} allowed values",
                did_you_mean(value, choices, what="allowed values"))
    if kind == "union_tag_invalid":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        key = str(ctx.get("discriminator", "mode")).strip("'")
        return (f"'{ctx.get('tag')}' is not one of the {len(choices)} allowed values of '{key}'",
                did_you_mean(ctx.get("tag"), choices, what="allowed values"))
    if kind == "union_tag_not_found":
        return msg, "add 'mode: colocated' or 'mode: pd'"
    if kind == "string_pattern_mismatch":
        sub = _subschema(model, loc) or {}
        desc = sub.get("description")
        return (
            f"value does not have the allowed form (pattern {ctx.get('pattern', '?')})",
            desc or "use only the characters the pattern allows",
        )
    if kind.startswith(("greater_than", "less_than")) or kind in ("too_short", "too_long"):
        return msg, "change the value to satisfy the limit"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        sub = _subschema(model, loc) or {}
        desc = sub.get("description")
        want = next((text for prefix, text in _EXPECTED if kind.startswith(prefix)),
                    "a value of the expected type")
        return msg, f"write {want}" + (f" ({desc})" if desc else "")
    if kind == "value_error":
        return msg.removeprefix("Value error, "), None
    return msg, None


def validate(model: type[M], data: Any, node: yaml.Node | None, filename: str) -> M:
    """Validate ``data`` as ``model``; every error becomes a located :class:`Problem`."""
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(
            kind=filename,
            problems=[Problem("", f"expected a mapping of keys at the top level, found {found}",
                              file=filename, line=1,
                              fix="start from profiles/default.yaml or `dsv4ctl schema`")],
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            loc = list(err["loc"])
            target, walked = _node_at(node, loc)
            # extra/missing keys: point at the key (extra) or at the parent mapping (missing)
            if err["type"] == "missing":
                target, walked = _node_at(node, loc[:-1])
                walked = [*walked, loc[-1]]
            if err["type"] == "union_tag_invalid":  # point at the tag itself (mode: pdd)
                tag_key = str((err.get("ctx") or {}).get("discriminator", "mode")).strip("'")
                target, walked = _node_at(node, [*loc, tag_key])
                err = {**err, "input": (err.get("ctx") or {}).get("tag")}
            reason, fix = _hint(model, err, walked if err["type"] != "missing" else walked[:-1])
            line = col = None
            if target is not None:
                line, col = target.start_mark.line + 1, target.start_mark.column + 1
            value = None
            if err["type"] not in ("missing",) and "input" in err:
                value = _short(err["input"])
            problems.append(
                Problem(
                    path=".".join(str(p) for p in walked),
                    message=reason,
                    fix=fix,
                    value=value,
                    file=filename,
                    line=line,
                    column=col,
                )
            )
        raise InputError(kind=filename, problems=problems) from None


def load_text(model: type[M], text: str, filename: str = "<input>") -> M:
    data, node = parse_yaml(text, filename)
    return validate(model, data, node, filename)


STDIN = "-"  # a profile path of "-" reads the profile from standard input


def read_file(path: Path) -> str:
    if str(path) == STDIN:
        import sys

        try:
            return sys.stdin.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(kind="<stdin>", problems=[Problem(
                "", f"cannot read standard input: {exc}", file="<stdin>")]) from None
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            kind=str(path),
            problems=[Problem("", "file not found", file=str(path),
                              fix="check the path; `dsv4ctl plan` with no argument uses the default")],
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            kind=str(path),
            problems=[Problem("", f"cannot read file: {exc}", file=str(path))],
        ) from None


def load_profile(path: Path) -> Profile:
    return load_text(Profile, read_file(path), str(path))


def load_inventory(path: Path) -> Inventory:
    return load_text(Inventory, read_file(path), str(path))


@functools.lru_cache(maxsize=8)
def _tree(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


def locate(text: str, dotted: str) -> tuple[int, int] | None:
    """(line, column), 1-based, of the value at ``dotted`` (``topology.decode.gpus``) in the YAML
    ``text``, or of the deepest parent written there; None when the document has none of it."""
    node = _tree(text)
    if node is None:
        return None
    keys: list[int | str] = [int(k) if k.isdigit() else k for k in dotted.split(".")]
    target, walked = _node_at(node, keys)
    if target is None or not walked:
        return None
    return target.start_mark.line + 1, target.start_mark.column + 1

