"""Writers for the tag-style tool-call formats: GLM-4.7 (and Laguna, which writes the
same), LongCat, MiniMax-M2, MiniCPM5, Muse Spark and Kimi K3. A call names its tool in a
tag and gives each argument between tags of its own; values are written as each format's
parser reads them back (see `tool_calls.xml_value`). Tags go through `markup`, so the ones a
model's tokenizer holds as special tokens are matched as those tokens.

Where a template's layout between tags is not fixed (a newline or none), one optional
newline is allowed there, never free whitespace a weak model could write forever."""

from __future__ import annotations

from dataclasses import dataclass

from mlxserve.structured import lark
from mlxserve.structured.tool_calls import Calls, Markup, raw_string, xml_value

NEWLINE = '"\\n"?'


@dataclass(frozen=True)
class InvokeTags:
    """The tags of a format whose calls are invoke blocks of parameter blocks (`{name}` and
    `{key}` filled in), and whether its string values are raw text (else every value is
    JSON, as the parser reads it)."""

    invoke_open: str
    invoke_close: str
    parameter_open: str
    parameter_close: str
    raw_strings: bool


MINIMAX = InvokeTags(
    '<invoke name="{name}">\n', "</invoke>\n", '<parameter name="{key}">', "</parameter>\n", True
)
MUSE_SPARK = InvokeTags(
    '<atem:invoke name="{name}">',
    "</atem:invoke>",
    '<atem:parameter name="{key}">',
    "</atem:parameter>",
    False,
)


def glm47(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """<tool_call>name<arg_key>key</arg_key><arg_value>value</arg_value>...</tool_call>,
    a block per call."""
    return _key_value_calls(markup, start, end, tools, parallel, "")


def longcat(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """GLM-4.7's layout with `longcat_`-prefixed tags."""
    return _key_value_calls(markup, start, end, tools, parallel, "longcat_")


def _key_value_calls(
    markup: Markup, start: str, end: str, tools: list[dict], parallel: bool, prefix: str
) -> Calls:
    rules: list[str] = []
    calls = []
    for tool in tools:
        arguments = []
        for name, schema, required in lark.properties(lark.parameters(tool)):
            closing = markup(f"</{prefix}arg_value>")
            value, rule = xml_value(schema, f"text_{len(rules)}", closing)
            rules += [rule] if rule else []
            key = markup(f"<{prefix}arg_key>{name}</{prefix}arg_key>")
            opening = markup(f"<{prefix}arg_value>")
            arguments.append((f"{NEWLINE} {key} {NEWLINE} {opening} {value}", required))
        calls.append(f"{lark.literal(tool['function']['name'])} {lark.in_order(arguments)}")
    call = f"{markup(start)} ({' | '.join(calls)}) {NEWLINE} {markup(end)}"
    return (f"{call} ({NEWLINE} {call})*" if parallel else call), tuple(rules)


def minimax_m2(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """<minimax:tool_call>, then an <invoke name="..."> block per call holding a
    <parameter name="..."> block per argument, each on a line of its own."""
    invoke, rules = _invokes(markup, tools, MINIMAX)
    invokes = f"({invoke})+" if parallel else f"({invoke})"
    return f'{markup(start)} "\\n" {invokes} {markup(end)}', rules


def muse_spark(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """<atem:function_calls>, then an <atem:invoke name="..."> block per call holding an
    <atem:parameter name="..."> block per argument, whose value the parser reads as JSON
    (so strings are written as JSON strings: raw text that looks like a number would be
    read back as one)."""
    invoke, rules = _invokes(markup, tools, MUSE_SPARK)
    invokes = f"({NEWLINE} {invoke})+" if parallel else f"{NEWLINE} ({invoke})"
    return f"{markup(start)} {invokes} {NEWLINE} {markup(end)}", rules


def minicpm5(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """<function name="..."> (the opening is `<function name=`) holding a
    <param name="..."> block per argument, then </function>; parallel calls are blocks one
    after another."""
    rules: list[str] = []
    calls = []
    for tool in tools:
        arguments = []
        for key, schema, required in lark.properties(lark.parameters(tool)):
            value, rule = xml_value(schema, f"text_{len(rules)}", markup("</param>"))
            rules += [rule] if rule else []
            opening = markup(f'<param name="{key}">')
            arguments.append((f"{NEWLINE} {opening} {value}", required))
        name = lark.literal(f'"{tool["function"]["name"]}">')
        calls.append(f"{name} {lark.in_order(arguments)}")
    call = f"{markup(start)} ({' | '.join(calls)}) {NEWLINE} {markup(end)}"
    return (f"{call} ({NEWLINE} {call})*" if parallel else call), tuple(rules)


def kimi_k3(markup: Markup, start: str, end: str, tools: list[dict], parallel: bool) -> Calls:
    """A tools section holding a call block per call, each argument a typed block of its
    own (`type="string"` values raw, the others JSON, as the parser decodes them)."""
    rules: list[str] = []
    calls = []
    for tool in tools:
        arguments = []
        for key, schema, required in lark.properties(lark.parameters(tool)):
            closing = markup("<|close|>argument<|sep|>")
            value, rule = xml_value(schema, f"text_{len(rules)}", closing)
            rules += [rule] if rule else []
            kind = schema.get("type") if isinstance(schema.get("type"), str) else "json"
            kind = "string" if raw_string(schema) else kind
            opening = markup(f'<|open|>argument key="{key}" type="{kind}"<|sep|>')
            arguments.append((f"{NEWLINE} {opening} {value}", required))
        header = markup(f'<|open|>call tool="{tool["function"]["name"]}" index="')
        opening = f"{header} /[0-9]{{1,3}}/ {markup(chr(34) + '<|sep|>')}"
        closing = markup("<|close|>call<|sep|>")
        calls.append(f"{opening} {lark.in_order(arguments)} {NEWLINE} {closing}")
    call = f"{NEWLINE} ({' | '.join(calls)})"
    section = f"{markup(start)} ({call}){'+' if parallel else ''} {NEWLINE} {markup(end)}"
    return section, tuple(rules)


def _invokes(markup: Markup, tools: list[dict], tags: InvokeTags) -> tuple[str, tuple[str, ...]]:
    """Lark of one invoke block to any of the tools (its arguments in the schema's order),
    and the rules it uses."""
    rules: list[str] = []
    invokes = []
    between = "" if tags.raw_strings else NEWLINE
    for tool in tools:
        arguments = []
        for key, schema, required in lark.properties(lark.parameters(tool)):
            closing = markup(tags.parameter_close)
            if tags.raw_strings:
                value, rule = xml_value(schema, f"text_{len(rules)}", closing)
                rules += [rule] if rule else []
            else:
                value = f"{lark.json_schema(schema)} {closing}"
            opening = markup(tags.parameter_open.format(key=key))
            arguments.append((f"{between} {opening} {value}", required))
        opening = markup(tags.invoke_open.format(name=tool["function"]["name"]))
        closing = f"{between} {markup(tags.invoke_close)}"
        invokes.append(f"{opening} {lark.in_order(arguments)} {closing}")
    return " | ".join(invokes), tuple(rules)
