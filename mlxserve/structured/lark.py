"""Grammars in llguidance's Lark dialect: the constrained part of a reply (the `body`: a
JSON schema, a regex, a choice, a tool call) inside the markup the model writes around it.

Markup comes in as Lark expressions made from the model's own tokens (see
`matcher.markup_lark`), so these functions know nothing of tokenizers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from mlxserve.structured import strict

ANY_TEXT = "/(?s:.*)/"
# Options a choice may have: 10,000 compile in about 0.3 s (2-core x86 CPU); near 65,000 the
# engine's symbol table overflows (a panic, after 12 s of work on the request's thread).
MAX_CHOICES = 10_000
AFTER_THOUGHT = r"/[ \n]{0,2}/"  # the blank line models put between reasoning and answer
# JSON as models learned it from json.dumps; no free whitespace, which a weak model can
# otherwise write until it runs out of tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_schema(schema: dict, layout: dict = JSON_LAYOUT) -> str:
    layout = schema.get("x-guidance") or layout  # the schema's own options win
    return f"%json {json.dumps({**schema, 'x-guidance': layout})}"


def regex(pattern: str) -> str:
    """A Lark regex literal: slashes the pattern did not escape are escaped."""
    return "/" + re.sub(r"(?<!\\)/", r"\/", pattern) + "/"


def literal(text: str) -> str:
    """A Lark string literal for exactly `text`."""
    return json.dumps(text)


def choice(options: list[str]) -> str:
    return " | ".join(literal(option) for option in options)


@dataclass(frozen=True)
class Thinking:
    """A think block the model may write before the constrained part."""

    start: str  # Lark of the opening marker
    end: str  # Lark of the closing marker
    special: bool  # the markers are special tokens, which text can never match
    opened: bool  # the prompt opened the block: the reply begins inside it


def grammar(body: str, lead: str = "", rules: tuple[str, ...] = ()) -> str:
    """`start` is `lead` (markup before the body, may be empty) then the body."""
    start = f"start: {lead} body" if lead else "start: body"
    return "\n".join([start, f"body: {body}", *rules])


def after_space(text: str) -> str:
    """The grammar `text` behind one optional space: a word-marking tokenizer's first
    token of a reply ("▁The") carries a space its detokenizer drops from the text."""
    assert text.startswith("start: "), text
    return 'start: " "? ' + text.removeprefix("start: ")


def after_thinking(body: str, thinking: Thinking, rules: tuple[str, ...] = ()) -> str:
    """The body (with the `rules` it uses), after a think block: required when the prompt
    opened it, else optional."""
    if thinking.special:
        # Text cannot contain a special token: the thought runs until the end marker.
        rest = f"THOUGHT {thinking.end} {AFTER_THOUGHT}"
        lead = rest if thinking.opened else f"({thinking.start} {rest})?"
        return grammar(body, lead, (f"THOUGHT: {ANY_TEXT}", *rules))
    # Markers in plain text: a lazy thought ends at the first end marker.
    start = "" if thinking.opened else f"{thinking.start} "
    rule = f"thought[lazy]: {start}{ANY_TEXT} {thinking.end}"
    lead = f"thought {AFTER_THOUGHT}" if thinking.opened else f"(thought {AFTER_THOUGHT})?"
    return grammar(body, lead, (rule, *rules))


@dataclass(frozen=True)
class Harmony:
    """gpt-oss message markup, each a Lark expression of special tokens and text."""

    analysis: str  # <|channel|>analysis<|message|>
    analysis_end: str  # <|end|><|start|>assistant
    final: str  # <|channel|>final<|message|>
    final_end: str  # <|return|>

    def reply(self, body: str, end: str) -> str:
        """An optional analysis message, then `body` (a message of its own) and `end`."""
        analysis = f"analysis: {self.analysis} THOUGHT {self.analysis_end}"
        return grammar(f"{body} {end}", "analysis?", (analysis, f"THOUGHT: {ANY_TEXT}"))

    def final_reply(self, body: str) -> str:
        return self.reply(f"{self.final} {body}", self.final_end)


def parameters(tool: dict) -> dict:
    """The JSON schema of a forced call's arguments: the parameters the tool declares and
    no others, unless its schema says otherwise (a tool function would refuse an argument
    the model made up); a tool without a schema takes any object. A strict tool's schema
    is closed all the way down."""
    function = tool["function"]
    schema = function.get("parameters") or {"type": "object"}
    if function.get("strict"):
        return strict.closed(schema)
    return {"additionalProperties": False, **schema} if "properties" in schema else schema


def tool_call_object(tool: dict) -> dict:
    """The JSON schema of {"name": ..., "arguments": {...}} for one tool."""
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool["function"]["name"]},
            "arguments": parameters(tool),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def any_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def properties(schema: dict) -> list[tuple[str, dict, bool]]:
    """(name, schema, required) of each property of an object schema, in order; each
    schema keeps the root's definitions, so that its `$ref`s still resolve."""
    definitions = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    required = set(schema.get("required", []))
    return [
        (name, {**definitions, **sub}, name in required)
        for name, sub in schema.get("properties", {}).items()
    ]


def in_order(items: list[tuple[str, bool]], separator: str = "") -> str:
    """Items (Lark, required) in their order: required ones always, optional ones may be
    left out, `separator` between two that are written. Built from the back: `rest` is
    what follows a written item, `first` what may open the list."""
    sep = f"{separator} " if separator else ""
    rest = first = ""
    for item, required in reversed(items):
        tail = f"{item} {rest}".strip()
        if required:
            first, rest = tail, f"{sep}{tail}"
        else:
            first = f"({tail} | {first})" if first else f"({tail})?"
            rest = f"({sep}{item})? {rest}".strip()
    return first
