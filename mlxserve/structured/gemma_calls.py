"""Writers for Gemma 4's and FunctionGemma's tool calls: `call:name{key:value,...}` between
the format's markers, in Gemma's own value markup: keys bare, strings between a delimiter
(`<|"|>` for Gemma 4, `<escape>` for FunctionGemma), numbers, booleans and null as in JSON,
objects and arrays nested the same way. A tool's schema is written out as rules of that
markup (`GemmaValues`), since it is not JSON and llguidance's JSON support cannot write it."""

from __future__ import annotations

import json
from typing import Any

from mlxserve.structured import lark
from mlxserve.structured.tool_calls import Calls, Markup, is_special_markup

GEMMA4_STRING = '<|"|>'
FUNCTION_GEMMA_STRING = "<escape>"
KEY = r"/[A-Za-z_][A-Za-z0-9_]*/"  # a free object's bare keys, as the parser quotes them


def gemma4(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """<|tool_call>call:name{...}<tool_call|>, a block per call."""
    return _calls(markup, start, end, tools, parallel, GEMMA4_STRING)


def function_gemma(
    markup: Markup, start: str, end: str, tools: list[dict], parallel: bool
) -> Calls:
    """<start_function_call>call:name{...}<end_function_call>, a block per call."""
    return _calls(markup, start, end, tools, parallel, FUNCTION_GEMMA_STRING)


def _calls(
    markup: Markup, start: str, end: str, tools: list[dict], parallel: bool, delimiter: str
) -> Calls:
    values = GemmaValues(markup, delimiter)
    calls = []
    for tool in tools:
        arguments = values.value(lark.parameters(tool))
        calls.append(f"{lark.literal('call:' + tool['function']['name'])} {arguments}")
    call = f"{markup(start)} ({' | '.join(calls)}) {markup(end)}"
    return (f"({call})+" if parallel else call), tuple(values.rules)


class GemmaValues:
    """Lark for values of a JSON schema in Gemma's markup; the rules it needed (strings,
    free values, `$ref`s) gather in `rules`."""

    def __init__(self, markup: Markup, delimiter: str):
        self._markup = markup
        self._delimiter = markup(delimiter)
        self.rules: list[str] = []
        self._named: dict[str, str] = {}  # a rule's key -> its name
        self._definitions: dict[str, Any] = {}

    def value(self, schema: Any) -> str:
        if schema is True or schema == {}:
            return self._any()
        if not isinstance(schema, dict):
            raise ValueError(f"not a schema: {schema!r}")
        for key in ("$defs", "definitions"):
            self._definitions.update({f"#/{key}/{n}": s for n, s in schema.get(key, {}).items()})
        if "$ref" in schema:
            return self._reference(schema["$ref"])
        if "const" in schema:
            return self.constant(schema["const"])
        if "enum" in schema:
            return "(" + " | ".join(self.constant(v) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return "(" + " | ".join(self.value(sub) for sub in schema[key]) + ")"
        kinds = schema.get("type")
        if isinstance(kinds, list):
            return "(" + " | ".join(self.value({**schema, "type": k}) for k in kinds) + ")"
        if kinds == "string":
            return self._string(schema)
        if kinds in ("integer", "number", "boolean", "null"):
            return lark.json_schema(schema)  # a scalar's JSON text is Gemma's too
        if kinds == "array" or "items" in schema:
            return self._array(schema)
        if kinds == "object" or "properties" in schema:
            return self._object(schema)
        return self._any()

    def constant(self, value: Any) -> str:
        if isinstance(value, str):
            return f"{self._delimiter} {lark.literal(value)} {self._delimiter}"
        if isinstance(value, dict):
            pairs = [f"{lark.literal(k + ':')} {self.constant(v)}" for k, v in value.items()]
            return '"{" ' + ' "," '.join(pairs) + ' "}"'
        if isinstance(value, list):
            return '"[" ' + ' "," '.join(self.constant(v) for v in value) + ' "]"'
        return lark.literal(json.dumps(value))

    def _string(self, schema: dict) -> str:
        least, most = schema.get("minLength", 0), schema.get("maxLength")
        bound = "" if most is None else most
        text = f"/(?s:.{{{least},{bound}}})/" if most is not None or least else lark.ANY_TEXT
        if is_special_markup(self._delimiter):  # the text cannot hold the delimiter
            return f"{self._delimiter} {text} {self._delimiter}"
        name = self._rule(f"string {text}", f"[lazy]: {text} {self._delimiter}")
        return f"{self._delimiter} {name}"

    def _object(self, schema: dict) -> str:
        properties = lark.properties(schema)
        if not properties:
            if schema.get("additionalProperties") is False:
                return '"{" "}"'
            return self._free_object()
        members = [
            (f"{lark.literal(name + ':')} {self.value(sub)}", required)
            for name, sub, required in properties
        ]
        return f'"{{" {lark.in_order(members, lark.literal(","))} "}}"'

    def _array(self, schema: dict) -> str:
        item = self.value(schema.get("items", {}))
        least, most = schema.get("minItems", 0), schema.get("maxItems")
        if most == 0:
            return '"[" "]"'
        rest = f'("," {item}){{{max(least - 1, 0)},{"" if most is None else most - 1}}}'
        items = f"{item} {rest}"
        return f'"[" {items} "]"' if least else f'"[" ({items})? "]"'

    def _reference(self, reference: str) -> str:
        if reference not in self._definitions:
            raise ValueError(f"a $ref the schema does not define: {reference}")
        key = f"ref {reference}"
        if key not in self._named:
            name = self._named[key] = f"gemma_{len(self._named)}"
            self.rules.append(f"{name}: {self.value(self._definitions[reference])}")
        return self._named[key]

    def _any(self) -> str:
        """Any value: a rule of its own, since it holds itself."""
        key = "any"
        if key not in self._named:
            name = self._named[key] = f"gemma_{len(self._named)}"
            members = f'({KEY} ":" {name} ("," {KEY} ":" {name})*)?'
            scalars = lark.json_schema({"type": ["number", "boolean", "null"]})
            array = f'"[" ({name} ("," {name})*)? "]"'
            self.rules.append(
                f'{name}: {self._string({})} | {scalars} | "{{" {members} "}}" | {array}'
            )
        return self._named[key]

    def _free_object(self) -> str:
        pair = f'{KEY} ":" {self._any()}'
        return f'"{{" ({pair} ("," {pair})*)? "}}"'

    def _rule(self, key: str, body: str) -> str:
        """A named rule for `body` (shared by every value that needs the same one)."""
        if key not in self._named:
            name = self._named[key] = f"gemma_{len(self._named)}"
            self.rules.append(f"{name}{body}")
        return self._named[key]
