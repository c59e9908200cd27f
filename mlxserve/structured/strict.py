"""Strict schemas are closed: under `strict: true` an object schema that says nothing of
`additionalProperties` takes no keys but those it lists, as OpenAI's strict mode and vLLM's
grammar engines read it. JSON Schema's own reading (open) lets a model that will not stop
open one made-up key after another until it runs out of tokens."""

from __future__ import annotations

from typing import Any

# Keywords whose value is a schema or a list of schemas, and those whose value maps names
# to schemas.
SUBSCHEMAS = (
    *("additionalProperties", "items", "not", "if", "then", "else", "contains"),
    *("anyOf", "oneOf", "allOf", "prefixItems"),
)
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Any) -> Any:
    """`schema` with every object schema in it closed where it leaves that open."""
    if isinstance(schema, list):
        return [closed(sub) for sub in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SUBSCHEMAS:
        if key in out:
            out[key] = closed(out[key])
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    if _is_object(out) and not {"additionalProperties", "unevaluatedProperties"} & set(out):
        out["additionalProperties"] = False
    return out


def _is_object(schema: dict) -> bool:
    kind = schema.get("type")
    return (
        kind == "object"
        or (isinstance(kind, list) and "object" in kind)
        or ("properties" in schema)
    )
