"""How a forced tool call is written as a grammar, one writer per tool-call format that
can be forced: the Lark of the calls in the format's own markup, and the extra rules it
uses. The format registry (`postprocess.tools.TRAITS`) names each format's writer."""

from __future__ import annotations

from collections.abc import Callable

from mlxserve.structured import lark

Markup = Callable[[str], str]  # text -> Lark for exactly its tokens
Calls = tuple[str, tuple[str, ...]]  # Lark of the calls, and the rules it uses
# (markup, the format's call opening, its closing, the tools, parallel calls allowed)
CallWriter = Callable[[Markup, str, str, list[dict], bool], Calls]
PARAMETER_END = lark.literal("\n</parameter>")
# Python reads JSON string literals, all but the escaped slash.
PYTHON_STRINGS = {**lark.JSON_LAYOUT, "json_allowed_escapes": 'nrbtf\\"u'}


def hermes(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one block a call."""
    objects = lark.json_schema(lark.any_of([lark.tool_call_object(t) for t in tools]))
    call = f'{markup(start)} "\\n" {objects} "\\n" {markup(end)}'
    return (f'{call} ("\\n" {call})*' if parallel else call), ()


def mistral(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """[TOOL_CALLS]name[ARGS]{...}, repeated for more calls."""
    call = f"{markup(start)} ({named_arguments(markup, tools, '{name}[ARGS]')})"
    return (f"({call})+" if parallel else call), ()


def kimi(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """A section of <|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}
    <|tool_call_end|> calls."""
    header = "<|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>"
    call = f"({named_arguments(markup, tools, header)}) {markup('<|tool_call_end|>')}"
    return f"{markup(start)} ({call}){'+' if parallel else ''} {markup(end)}", ()


def tool_code(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """A ```tool_code block with a `name(key=value, ...)` line per call; values are
    written as JSON (its true, false and null are read as Python's)."""
    call = python_calls(tools)
    lines = f'{call} ("\\n" {call})*' if parallel else call
    return f'{markup(start)} "\\n" {lines} "\\n" {markup(end)}', ()


def pythonic(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """Llama 3.2/4 and LFM2: a Python list of `name(key=value, ...)` calls between the
    markers; values are written as JSON, which the parser reads as Python literals."""
    call = python_calls(tools)
    calls = f'{call} (", " {call})*' if parallel else call
    return f'{markup(start)} "[" {calls} "]" {markup(end)}', ()


def python_calls(tools: list[dict]) -> str:
    """Lark of one `name(key=value, ...)` call to any of the tools, keyword arguments in
    the schema's order."""
    calls = []
    for tool in tools:
        arguments = [
            (f"{lark.literal(name + '=')} {lark.json_schema(schema, PYTHON_STRINGS)}", required)
            for name, schema, required in lark.properties(lark.parameters(tool))
        ]
        opening = lark.literal(tool["function"]["name"] + "(")
        calls.append(f'{opening} {lark.in_order(arguments, lark.literal(", "))} ")"')
    return f"({' | '.join(calls)})"


def qwen3_coder(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """Qwen3-Coder: a <tool_call> block per call holding <function=name>, then a
    <parameter=key> block per argument, each on lines of their own; values are written as
    the parser reads them back for their type."""
    calls: list[str] = []
    rules: list[str] = []
    for tool in tools:
        parameters = []
        for name, schema, required in lark.properties(lark.parameters(tool)):
            value, rule = xml_value(schema, f"text_{len(rules)}")
            rules += [rule] if rule else []
            opening = lark.literal(f"<parameter={name}>\n")
            parameters.append((f'{opening} {value} "\\n"', required))
        opening = lark.literal(f"<function={tool['function']['name']}>\n")
        calls.append(f'{opening} {lark.in_order(parameters)} "</function>\\n"')
    call = f'{markup(start)} "\\n" ({" | ".join(calls)}) {markup(end)}'
    return (f'{call} ("\\n" {call})*' if parallel else call), tuple(rules)


def xml_value(schema: dict, rule_name: str, closing: str = PARAMETER_END) -> tuple[str, str | None]:
    """A parameter's value then its `closing` (Lark), as the tag-style parsers read it
    back: strings as raw text up to the closing tag, everything else as its JSON text.
    Raw text before a closing tag of plain text is a lazy rule of its own (returned, named
    `rule_name`); a special-token closing ends it by itself (text cannot hold one)."""
    if not raw_string(schema):
        return f"{lark.json_schema(schema)} {closing}", None
    if _string_enum(schema):
        return f"({lark.choice(schema['enum'])}) {closing}", None
    most = schema.get("maxLength")
    text = f"/(?s:.{{{schema.get('minLength', 0)},{most}}})/" if most else lark.ANY_TEXT
    if is_special_markup(closing):
        return f"{text} {closing}", None
    return rule_name, f"{rule_name}[lazy]: {text} {closing}"


def is_special_markup(markup_lark: str) -> bool:
    """Whether markup's Lark is one special token (see `matcher.markup_lark`)."""
    return markup_lark.startswith("<[") and " " not in markup_lark


def raw_string(schema: dict) -> bool:
    """Whether the tag-style formats write this value as raw text (a string)."""
    return schema.get("type") == "string" or _string_enum(schema)


def _string_enum(schema: dict) -> bool:
    return bool(schema.get("enum")) and all(isinstance(v, str) for v in schema["enum"])


def named_arguments(markup: Markup, tools: list[dict], header: str) -> str:
    """Any of the tools: its header (with its name) then its JSON arguments."""
    return " | ".join(
        f"{markup(header.format(name=t['function']['name']))} {lark.json_schema(lark.parameters(t))}"
        for t in tools
    )
