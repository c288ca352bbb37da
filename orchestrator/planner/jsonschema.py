"""The profile's JSON Schema with what the catalog knows for the pinned engine version.

Owns joining the schema (profile layer) with catalog facts: the model variants, expert storage
options, the index_topk and KV dtypes the pinned SGLang accepts for DeepSeek-V4, the MoE runner
choices of its command line, and the longest context the models support. An editor using the
schema then flags `index_topk: 768` or a runner typo as you type, as `dsv4ctl validate` does.
"""

from __future__ import annotations

from typing import Any

from orchestrator.catalog import Catalog, load_catalog
from orchestrator.catalog.flags import load_flag_table
from orchestrator.planner.kvpool import cuda_kv_dtype_refusal
from orchestrator.profile.jsonschema import json_schema
from orchestrator.profile.schema import Engine, Profile


def _prop(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The (mutable) schema of the property at dotted ``path``, following $refs into $defs."""
    defs = schema.get("$defs", {})
    node = schema
    for key in path.split("."):
        while "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        node = node["properties"][key]
    return node


def _enum(schema: dict[str, Any], path: str, values: list[Any], source: str) -> None:
    prop = _prop(schema, path)
    nullable = any(alt.get("type") == "null" for alt in prop.get("anyOf", []))
    prop["enum"] = [*values, None] if nullable else list(values)
    prop["description"] = (prop.get("description", "") + f" Allowed here: {source}.").strip()


def profile_schema(cat: Catalog | None = None) -> dict[str, Any]:
    cat = cat or load_catalog()
    name = Engine.model_fields["name"].default
    version = Engine.model_fields["version"].default
    engine = cat.engine(name, version)
    where = f"{name} {version}, from the dsv4ctl catalog"
    schema = json_schema(Profile, "dsv4ctl profile")
    _enum(schema, "model.variant", sorted(m.id for m in cat.variants), "catalog model variants")
    _enum(schema, "attention.index_topk", list(engine.accepted["index_topk"].values), where)
    # the dtypes that start (the argument check passes bfloat16; the CUDA V4 pool does not)
    _enum(schema, "attention.kv_cache_dtype",
          [v for v in engine.accepted["kv_cache_dtype"].values
           if cuda_kv_dtype_refusal(str(v)) is None], where)
    runner = load_flag_table(name, version).spec("--moe-runner-backend")
    if runner is not None and runner.choices:
        _enum(schema, "moe.runner_backend", list(runner.choices), where)
    longest = max(cat.config_of(m).max_position_embeddings.value for m in cat.variants)
    ctx = _prop(schema, "attention.context_length")
    for alt in ctx.get("anyOf", []):
        if "maximum" in alt:
            alt["maximum"] = longest
        for inner in alt.get("anyOf", [alt]):
            if inner.get("type") == "integer":
                inner["maximum"] = longest
    return schema
