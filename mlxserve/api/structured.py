"""What a request constrains (`response_format`, vLLM's `guided_*`, a forced
`tool_choice`) as a grammar compiled for the model's tokenizer; a 400 for anything the
grammar engine cannot enforce, never a silently unconstrained reply."""

from __future__ import annotations

import functools
from collections.abc import Callable

from mlxserve.api.errors import bad_request
from mlxserve.api.requests import ChatRequest, GenerationRequest
from mlxserve.postprocess.output import ChatMarkup
from mlxserve.postprocess.reasoning import reasoning_skipped, starts_in_reasoning
from mlxserve.postprocess.tools import ToolFormat
from mlxserve.structured import lark
from mlxserve.structured.matcher import Grammar, GrammarError, is_special, markup_lark

Markup = Callable[[str], str]  # text -> Lark for exactly its tokens


def completion_grammar(request: GenerationRequest, tokenizer) -> Grammar | None:
    content = _content_body(request)
    if content is None:
        return None
    param, body = content
    return _compile(tokenizer, lark.grammar(body), param)


def chat_grammar(
    request: ChatRequest, tokenizer, prompt: list[int], markup: ChatMarkup
) -> Grammar | None:
    """The reply's grammar: the model may reason first, then writes the constrained part
    (content, or a tool call in its own format)."""
    content = _content_body(request)
    forcing = request.tool_choice == "required" or request.forced_tool is not None
    if content is not None and forcing:
        raise bad_request(
            "tool_choice forces a tool call; it cannot be combined with a response format.",
            param="tool_choice",
        )
    if forcing:
        return _compile(tokenizer, _tool_call_grammar(request, tokenizer, prompt, markup), "tools")
    if content is None:
        return None
    param, body = content
    if markup.harmony:
        return _compile(tokenizer, _harmony(tokenizer).final_reply(body), param)
    return _compile(tokenizer, _after_reasoning(body, tokenizer, prompt, markup), param)


def _content_body(request: GenerationRequest) -> tuple[str, str] | None:
    """(the field that asked, Lark of the constrained content), if one did."""
    found: list[tuple[str, str]] = []
    response_format = request.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(("response_format", lark.json_schema({"type": "object"})))
    elif response_format is not None and response_format.type == "json_schema":
        if response_format.json_schema is None:
            raise bad_request(
                "response_format of type 'json_schema' needs a 'json_schema' object.",
                param="response_format.json_schema",
            )
        schema = response_format.json_schema.schema_ or {"type": "object"}
        found.append(("response_format.json_schema.schema", lark.json_schema(schema)))
    for prefix, source in (("", request), ("extra_body.", request.extra_body)):
        if source is None:
            continue
        if source.guided_json is not None:
            found.append((f"{prefix}guided_json", lark.json_schema(source.guided_json)))
        if source.guided_regex is not None:
            found.append((f"{prefix}guided_regex", lark.regex(source.guided_regex)))
        if source.guided_choice is not None:
            found.append((f"{prefix}guided_choice", lark.choice(source.guided_choice)))
    if len(found) > 1:
        raise bad_request(
            f"Only one constraint may be given; got {', '.join(name for name, _ in found)}.",
            param=found[1][0],
        )
    return found[0] if found else None


def _tool_call_grammar(
    request: ChatRequest, tokenizer, prompt: list[int], markup: ChatMarkup
) -> str:
    if not request.tools:
        raise bad_request("tool_choice requires tools.", param="tool_choice")
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools]
    if request.forced_tool is not None:
        tools = [t for t in tools if t["function"]["name"] == request.forced_tool]
        if not tools:
            raise bad_request(
                f"tool_choice names '{request.forced_tool}', which is not among the tools.",
                param="tool_choice",
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
            param="tool_choice",
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
        markup_lark(tokenizer, "<|channel|>analysis<|message|>"),
        markup_lark(tokenizer, "<|end|><|start|>assistant"),
        markup_lark(tokenizer, "<|channel|>final<|message|>"),
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
    try:
        return Grammar(tokenizer, text)
    except GrammarError as e:
        raise bad_request(f"The constraint cannot be enforced: {e}", param=param) from e
