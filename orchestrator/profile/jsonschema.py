"""The JSON Schema of profiles and inventories, in standard keywords only (draft 2020-12).

pydantic writes a field's ``ge``/``le`` next to a type whose schema is given by hand (sizes and
token counts accept ``78GiB`` / ``64K`` as well as integers); editors and validators ignore such
keywords, so they are translated to ``minimum``/``maximum`` here, and OpenAPI's
``discriminator`` (the union's ``mode`` consts already decide) is dropped. Catalog knowledge (enums of the
pinned engine) is added by :mod:`orchestrator.planner.jsonschema`, which may read the catalog.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_RENAME = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _standard(node: Any) -> Any:
    if isinstance(node, list):
        return [_standard(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "discriminator":  # OpenAPI's, not JSON Schema's; the oneOf's consts decide
            continue
        if key in ("properties", "$defs", "patternProperties") and isinstance(value, dict):
            out[key] = {k: _standard(v) for k, v in value.items()}
        else:
            out[_RENAME.get(key, key)] = _standard(value)
    return out


def json_schema(model: type[BaseModel], title: str) -> dict[str, Any]:
    data = _standard(model.model_json_schema(by_alias=True))
    data["$schema"] = DRAFT
    data["title"] = title
    return data
