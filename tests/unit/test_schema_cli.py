"""`dsv4ctl schema`: standard JSON Schema (2020-12 keywords only) that accepts the shipped files and
carries the enums the catalog knows for the pinned engine, so an editor flags what `validate` does."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml

from orchestrator.cli import main
from orchestrator.paths import data_dir

PROFILES = data_dir("profiles")
SHIPPED = sorted(p for p in PROFILES.glob("*.yaml") if p.name != "inventory.yaml")

# Every keyword of the JSON Schema 2020-12 vocabularies (core, applicator, unevaluated,
# validation, meta-data, format-annotation, content).
STANDARD = {
    "$schema", "$id", "$ref", "$defs", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
    "$comment", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas",
    "prefixItems", "items", "contains", "properties", "patternProperties", "additionalProperties",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "type", "const", "enum",
    "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
    "maxProperties", "minProperties", "required", "dependentRequired", "title", "description",
    "default", "deprecated", "readOnly", "writeOnly", "examples", "format", "contentEncoding",
    "contentMediaType", "contentSchema",
}


def _schema(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["schema", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _keywords(node: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(node, list):
        for x in node:
            out |= _keywords(x)
    elif isinstance(node, dict):
        for k, v in node.items():
            if k in ("properties", "$defs", "patternProperties"):
                for sub in v.values():
                    out |= _keywords(sub)
            else:
                out.add(k)
                out |= _keywords(v)
    return out


def test_inventory_schema_accepts_the_shipped_inventory(capsys) -> None:
    schema = _schema(capsys, "--inventory-schema")
    jsonschema.Draft202012Validator.check_schema(schema)
    inventory = yaml.safe_load((PROFILES / "inventory.yaml").read_text())
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(inventory)]
    assert errors == []
    assert _keywords(schema) <= STANDARD, _keywords(schema) - STANDARD


def test_profile_schema_is_standard_and_accepts_the_shipped_profiles(capsys) -> None:
    schema = _schema(capsys)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert _keywords(schema) <= STANDARD, _keywords(schema) - STANDARD
    v = jsonschema.Draft202012Validator(schema)
    for path in SHIPPED:
        assert [e.message for e in v.iter_errors(yaml.safe_load(path.read_text()))] == [], path


@pytest.mark.parametrize("section,key,value", [
    ("attention", "index_topk", 768),
    ("attention", "kv_cache_dtype", "fp8_e4m"),
    ("moe", "runner_backend", "flashinfer_cutlas"),
    ("model", "variant", "dsv4-flash-nvfp5"),
    ("attention", "context_length", 2_000_000),
])
def test_profile_schema_carries_the_catalogs_enums(capsys, section: str, key: str,
                                                    value: object) -> None:
    v = jsonschema.Draft202012Validator(_schema(capsys))
    profile = yaml.safe_load((PROFILES / "default.yaml").read_text())
    profile[section][key] = value
    assert list(v.iter_errors(profile)), f"{section}.{key} = {value} passed the schema"


def test_token_counts_take_units_in_the_schema_too(capsys) -> None:
    v = jsonschema.Draft202012Validator(_schema(capsys))
    profile = yaml.safe_load((PROFILES / "default.yaml").read_text())
    profile["attention"]["context_length"] = "1M"
    profile.setdefault("workload", {})["context_tokens"] = "64K"
    assert [e.message for e in v.iter_errors(profile)] == []
