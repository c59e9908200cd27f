"""What a request constrains (its content constraint, or a forced tool call) as a grammar
compiled for the model's tokenizer; a 400 for anything the grammar engine cannot enforce,
never a silently unconstrained reply."""

from __future__ import annotations

import functools
from collections.abc import Callable

from mlxserve.models.token_bytes import drops_first_space
from mlxserve.postprocess.harmony import ANALYSIS_CLOSING, ANALYSIS_OPENING, FINAL_OPENING
from mlxserve.postprocess.output import ChatMarkup
from mlxserve.postprocess.reasoning import reasoning_skipped, starts_in_reasoning
from mlxserve.postprocess.tools import ToolFormat
from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import ChatRequest, Constraint, GenerationRequest
from mlxserve.structured import lark
from mlxserve.structured.matcher import Grammar, GrammarError, is_special, markup_lark

Markup = Callable[[str], str]  # text -> Lark for exactly its tokens


def completion_grammar(request: GenerationRequest, tokenizer) -> Grammar | None:
    constraint = request.constraint
    if constraint is None:
        return None
    return _compile(tokenizer, lark.grammar(_content_body(constraint)), constraint.param)


def chat_grammar(
    request: ChatRequest, tokenizer, prompt: list[int], markup: ChatMarkup
) -> Grammar | None:
    """The reply's grammar: the model may reason first, then writes the constrained part
    (content, or a tool call in its own format)."""
    constraint, choice = request.constraint, request.tool_choice
    if constraint is not None and choice.forces_call:
        raise bad_request(
            "tool_choice forces a tool call; it cannot be combined with a response format.",
            param=choice.param,
        )
    if choice.forces_call:
        grammar = _tool_call_grammar(request, tokenizer, prompt, markup)
        return _compile(tokenizer, grammar, "tools")
    if constraint is None:
        return None
    body = _content_body(constraint)
    if markup.harmony:
        return _compile(tokenizer, _harmony(tokenizer).final_reply(body), constraint.param)
    return _compile(tokenizer, _after_reasoning(body, tokenizer, prompt, markup), constraint.param)


def _content_body(constraint: Constraint) -> str:
    """Lark of the constrained content."""
    if constraint.kind == "json_schema":
        return lark.json_schema(constraint.value)
    if constraint.kind == "regex":
        return lark.regex(constraint.value)
    return lark.choice(constraint.value)


def _tool_call_grammar(
    request: ChatRequest, tokenizer, prompt: list[int], markup: ChatMarkup
) -> str:
    choice = request.tool_choice
    if not request.tools:
        raise bad_request("tool_choice requires tools.", param=choice.param)
    tools = [tool.definition() for tool in request.tools]
    if choice.name is not None:
        tools = [t for t in tools if t["function"]["name"] == choice.name]
        if not tools:
            raise bad_request(
                f"tool_choice names '{choice.name}', which is not among the tools.",
                param=choice.param,
            )
    if markup.harmony:
        return _harmony_tool_call(tokenizer, tools)
    fmt = markup.tool_format
    writer = CALL_WRITERS.get(fmt.name) if fmt is not None else None
    if writer is None:
        name = fmt.name if fmt is not None else "unknown"
        raise bad_request(
            f"A tool call cannot be forced in this model's tool-call format ({name}); "
            "use tool_choice 'auto'.",
            param=choice.param,
        )
    body, rules = writer(
        functools.partial(markup_lark, tokenizer), fmt, tools, request.parallel_tool_calls
    )
    return _after_reasoning(body, tokenizer, prompt, markup, rules)


Calls = tuple[str, tuple[str, ...]]  # Lark of the calls, and the rules it uses


def _hermes_calls(markup: Markup, fmt: ToolFormat, tools: list[dict], parallel: bool) -> Calls:
    """<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one block a call."""
    objects = lark.json_schema(lark.any_of([lark.tool_call_object(t) for t in tools]))
    call = f'{markup(fmt.start)} "\\n" {objects} "\\n" {markup(fmt.end)}'
    return (f'{call} ("\\n" {call})*' if parallel else call), ()


def _mistral_calls(markup: Markup, fmt: ToolFormat, tools: list[dict], parallel: bool) -> Calls:
    """[TOOL_CALLS]name[ARGS]{...}, repeated for more calls."""
    call = f"{markup(fmt.start)} ({_named_arguments(markup, tools, '{name}[ARGS]')})"
    return (f"({call})+" if parallel else call), ()


def _kimi_calls(markup: Markup, fmt: ToolFormat, tools: list[dict], parallel: bool) -> Calls:
    """A section of <|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}
    <|tool_call_end|> calls."""
    header = "<|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>"
    call = f"({_named_arguments(markup, tools, header)}) {markup('<|tool_call_end|>')}"
    return f"{markup(fmt.start)} ({call}){'+' if parallel else ''} {markup(fmt.end)}", ()


def _tool_code_calls(markup: Markup, fmt: ToolFormat, tools: list[dict], parallel: bool) -> Calls:
    """A ```tool_code block with a `name(key=value, ...)` line per call; values are
    written as JSON (its true, false and null are read as Python's)."""
    calls = []
    for tool in tools:
        arguments = [
            (f"{lark.literal(name + '=')} {lark.json_schema(schema, PYTHON_STRINGS)}", required)
            for name, schema, required in lark.properties(lark.parameters(tool))
        ]
        opening = lark.literal(tool["function"]["name"] + "(")
        calls.append(f'{opening} {lark.in_order(arguments, lark.literal(", "))} ")"')
    call = f"({' | '.join(calls)})"
    lines = f'{call} ("\\n" {call})*' if parallel else call
    return f'{markup(fmt.start)} "\\n" {lines} "\\n" {markup(fmt.end)}', ()


def _xml_calls(markup: Markup, fmt: ToolFormat, tools: list[dict], parallel: bool) -> Calls:
    """Qwen3-Coder: a <tool_call> block per call holding <function=name>, then a
    <parameter=key> block per argument, each on lines of their own; values are written as
    the parser reads them back for their type."""
    calls, rules = [], []
    for tool in tools:
        parameters = []
        for name, schema, required in lark.properties(lark.parameters(tool)):
            value, rule = _xml_value(schema, f"text_{len(rules)}")
            rules += [rule] if rule else []
            opening = lark.literal(f"<parameter={name}>\n")
            parameters.append((f'{opening} {value} "\\n"', required))
        opening = lark.literal(f"<function={tool['function']['name']}>\n")
        calls.append(f'{opening} {lark.in_order(parameters)} "</function>\\n"')
    call = f'{markup(fmt.start)} "\\n" ({" | ".join(calls)}) {markup(fmt.end)}'
    return (f'{call} ("\\n" {call})*' if parallel else call), tuple(rules)


def _xml_value(schema: dict, rule_name: str) -> tuple[str, str | None]:
    """A parameter's value as qwen3_coder's parser reads it back: strings as raw text up to
    the closing tag (a lazy rule of their own), everything else as its JSON text."""
    if schema.get("type") != "string" and not _string_enum(schema):
        return f"{lark.json_schema(schema)} {PARAMETER_END}", None
    if _string_enum(schema):
        return f"({lark.choice(schema['enum'])}) {PARAMETER_END}", None
    most = schema.get("maxLength")
    text = f"/(?s:.{{{schema.get('minLength', 0)},{most}}})/" if most else lark.ANY_TEXT
    return rule_name, f"{rule_name}[lazy]: {text} {PARAMETER_END}"


def _string_enum(schema: dict) -> bool:
    return bool(schema.get("enum")) and all(isinstance(v, str) for v in schema["enum"])


def _named_arguments(markup: Markup, tools: list[dict], header: str) -> str:
    """Any of the tools: its header (with its name) then its JSON arguments."""
    return " | ".join(
        f"{markup(header.format(name=t['function']['name']))} {lark.json_schema(lark.parameters(t))}"
        for t in tools
    )


# Formats a call can be forced into.
CALL_WRITERS: dict[str, Callable[[Markup, ToolFormat, list[dict], bool], Calls]] = {
    "json_tools": _hermes_calls,
    "mistral": _mistral_calls,
    "kimi_k2": _kimi_calls,
    "tool_code": _tool_code_calls,
    "qwen3_coder": _xml_calls,
}
PARAMETER_END = lark.literal("\n</parameter>")
# Python reads JSON string literals, all but the escaped slash.
PYTHON_STRINGS = {**lark.JSON_LAYOUT, "json_allowed_escapes": 'nrbtf\\"u'}


def _harmony_tool_call(tokenizer, tools: list[dict]) -> str:
    """One commentary message to a function (a harmony reply holds at most one call)."""
    header = "<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
    calls = _named_arguments(functools.partial(markup_lark, tokenizer), tools, header)
    return _harmony(tokenizer).reply(f"({calls})", markup_lark(tokenizer, "<|call|>"))


def _harmony(tokenizer) -> lark.Harmony:
    return lark.Harmony(
        markup_lark(tokenizer, ANALYSIS_OPENING),
        markup_lark(tokenizer, ANALYSIS_CLOSING),
        markup_lark(tokenizer, FINAL_OPENING),
        markup_lark(tokenizer, "<|return|>"),
    )


def _after_reasoning(
    body: str, tokenizer, prompt: list[int], markup: ChatMarkup, rules: tuple[str, ...] = ()
) -> str:
    think = markup.think
    if think is None or reasoning_skipped(tokenizer, prompt, think):
        return lark.grammar(body, rules=rules)
    thinking = lark.Thinking(
        markup_lark(tokenizer, think.start),
        markup_lark(tokenizer, think.end),
        special=is_special(tokenizer, think.start) and is_special(tokenizer, think.end),
        opened=starts_in_reasoning(tokenizer, prompt, think),
    )
    return lark.after_thinking(body, thinking, rules)


def _compile(tokenizer, text: str, param: str) -> Grammar:
    if drops_first_space(tokenizer):
        text = lark.after_space(text)
    try:
        return Grammar(tokenizer, text)
    except GrammarError as e:
        raise bad_request(f"The constraint cannot be enforced: {e}", param=param) from e
