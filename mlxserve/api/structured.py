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
    body = writer(
        functools.partial(markup_lark, tokenizer), fmt, tools, request.parallel_tool_calls
    )
    return _after_reasoning(body, tokenizer, prompt, markup)


def _hermes_calls(markup: Markup, fmt: ToolFormat, tools: list[dict], parallel: bool) -> str:
    """<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one block a call."""
    objects = lark.json_schema(lark.any_of([lark.tool_call_object(t) for t in tools]))
    call = f'{markup(fmt.start)} "\\n" {objects} "\\n" {markup(fmt.end)}'
    return f'{call} ("\\n" {call})*' if parallel else call


def _mistral_calls(markup: Markup, fmt: ToolFormat, tools: list[dict], parallel: bool) -> str:
    """[TOOL_CALLS]name[ARGS]{...}, repeated for more calls."""
    call = f"{markup(fmt.start)} ({_named_arguments(markup, tools, '{name}[ARGS]')})"
    return f"({call})+" if parallel else call


def _kimi_calls(markup: Markup, fmt: ToolFormat, tools: list[dict], parallel: bool) -> str:
    """A section of <|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}
    <|tool_call_end|> calls."""
    header = "<|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>"
    call = f"({_named_arguments(markup, tools, header)}) {markup('<|tool_call_end|>')}"
    return f"{markup(fmt.start)} ({call}){'+' if parallel else ''} {markup(fmt.end)}"


def _named_arguments(markup: Markup, tools: list[dict], header: str) -> str:
    """Any of the tools: its header (with its name) then its JSON arguments."""
    return " | ".join(
        f"{markup(header.format(name=t['function']['name']))} {lark.json_schema(lark.parameters(t))}"
        for t in tools
    )


# Formats a call can be forced into: those whose arguments are a JSON object.
CALL_WRITERS: dict[str, Callable[[Markup, ToolFormat, list[dict], bool], str]] = {
    "json_tools": _hermes_calls,
    "mistral": _mistral_calls,
    "kimi_k2": _kimi_calls,
}


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


def _after_reasoning(body: str, tokenizer, prompt: list[int], markup: ChatMarkup) -> str:
    think = markup.think
    if think is None or reasoning_skipped(tokenizer, prompt, think):
        return lark.grammar(body)
    thinking = lark.Thinking(
        markup_lark(tokenizer, think.start),
        markup_lark(tokenizer, think.end),
        special=is_special(tokenizer, think.start) and is_special(tokenizer, think.end),
        opened=starts_in_reasoning(tokenizer, prompt, think),
    )
    return lark.after_thinking(body, thinking)


def _compile(tokenizer, text: str, param: str) -> Grammar:
    try:
        return Grammar(tokenizer, text)
    except GrammarError as e:
        raise bad_request(f"The constraint cannot be enforced: {e}", param=param) from e
