"""Constrained requests and the checks of what comes back."""

from __future__ import annotations

import json

import jsonschema
from conversations import BY_NAME

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "city": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "country": {"type": "string", "maxLength": 12},
                },
                "required": ["name", "country"],
                "additionalProperties": False,
            },
            "capital": {"type": "boolean"},
        },
        "required": ["city", "capital"],
        "additionalProperties": False,
    },
    "bounded_array": {
        "type": "object",
        "properties": {
            "numbers": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": 5},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["numbers"],
        "additionalProperties": False,
    },
    "enum_and_range": {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no", "maybe"]},
            "confidence": {"type": "integer", "minimum": 10, "maximum": 90},
        },
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    },
    "refs": {
        "$defs": {"person": PERSON},
        "type": "object",
        "properties": {
            "captain": {"$ref": "#/$defs/person"},
            "crew": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 2},
        },
        "required": ["captain", "crew"],
        "additionalProperties": False,
    },
}


def constrained(conversation: str, schema: str, **extra) -> dict:
    return {
        **BY_NAME[conversation].request,
        "response_format": schema_format(schema),
        "max_tokens": 200,
        **extra,
    }


# The tiny fixtures, asked for JSON they never learnt to write, would rather open a think
# block (and think until max_tokens); the tests of each tokenizer family turn it off.
# Thinking before a constraint is tested on its own below.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def assert_valid(content: str, schema: dict) -> None:
    jsonschema.validate(json.loads(content), schema)


def schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}
