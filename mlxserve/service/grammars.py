"""What a request constrains (its content constraint, or a forced tool call) as a grammar
compiled for the model's tokenizer; a 400 for anything the grammar engine cannot enforce,
never a silently unconstrained reply."""

from __future__ import annotations

import functools
import logging
from typing import cast

from mlxserve.models.token_bytes import drops_first_space
from mlxserve.postprocess.harmony import (
    ANALYSIS_CLOSING,
    ANALYSIS_OPENING,
    FINAL_OPENING,
    HARMONY_RECIPIENT,
)
from mlxserve.postprocess.output import ChatMarkup
from mlxserve.postprocess.reasoning import reasoning_skipped, starts_in_reasoning
from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import ChatRequest, Constraint, GenerationRequest
from mlxserve.structured import lark, strict, tool_calls
from mlxserve.structured.matcher import Grammar, GrammarError, is_special, markup_lark

log = logging.getLogger(__name__)


def completion_grammar(request: GenerationRequest, tokenizer) -> Grammar | None:
    constraint = request.constraint
    if constraint is None:
        return None
    return _compile(tokenizer, lark.grammar(_content_body(constraint)), constraint.param)


def chat_grammar(
    request: ChatRequest, tokenizer, prompt: list[int], markup: ChatMarkup, guide_calls: bool
) -> Grammar | None:
    """The reply's grammar: the model may reason first, then writes the constrained part
    (content, or a tool call in its own format). Under tool_choice "auto" (`guide_calls`:
    the server's setting), a call the model opens is guided (see `call_guide`)."""
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
        auto = choice.mode == "auto" and request.tools and request.guide_tool_calls
        return _call_guide(request, tokenizer, markup) if guide_calls and auto else None
    body = _content_body(constraint)
    if markup.harmony:
        return _compile(tokenizer, _harmony(tokenizer).final_reply(body), constraint.param)
    return _compile(tokenizer, _after_reasoning(body, tokenizer, prompt, markup), constraint.param)


def _content_body(constraint: Constraint) -> str:
    """Lark of the constrained content."""
    value = constraint.value
    if constraint.kind == "json_schema":
        schema = cast(dict, value)
        return lark.json_schema(strict.closed(schema) if constraint.strict else schema)
    if constraint.kind == "regex":
        return lark.regex(cast(str, value))
    return lark.choice(cast(list[str], value))


def _tool_call_grammar(
    request: ChatRequest, tokenizer, prompt: list[int], markup: ChatMarkup
) -> str:
    choice = request.tool_choice
    if not request.tools:
        raise bad_request("tool_choice requires tools.", param=choice.param)
    tools = [tool.definition(grammar=True) for tool in request.tools]
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
    writer = fmt.traits.forced_call if fmt is not None else None
    if fmt is None or writer is None:
        name = fmt.name if fmt is not None else "unknown"
        raise bad_request(
            f"A tool call cannot be forced in this model's tool-call format ({name}); "
            "use tool_choice 'auto'.",
            param=choice.param,
        )
    markup_text = functools.partial(markup_lark, tokenizer)
    body, rules = writer(markup_text, fmt.start, fmt.end, tools, request.parallel_tool_calls)
    return _after_reasoning(body, tokenizer, prompt, markup, rules)


def _call_guide(request: ChatRequest, tokenizer, markup: ChatMarkup) -> Grammar | None:
    """The grammar of valid calls, from the format's call opening on; None where the
    format has no writer (a format new to mlx-lm), is not guided (injected tools), or the
    engine cannot enforce the tools' schemas: such calls stay free, as they always were
    (and are parsed, or returned as text, after the fact)."""
    tools = [tool.definition(grammar=True) for tool in request.tools]
    fmt = markup.tool_format
    if markup.harmony:
        text, opening = _harmony_call_guide(tokenizer, tools), HARMONY_RECIPIENT
    elif fmt is None or fmt.traits.forced_call is None or not fmt.traits.guided:
        return None
    else:
        markup_text = functools.partial(markup_lark, tokenizer)
        body, rules = fmt.traits.forced_call(
            markup_text, fmt.start, fmt.end, tools, request.parallel_tool_calls
        )
        text, opening = lark.grammar(body, rules=rules), fmt.start
    try:
        return _compiled(tokenizer, text, opening)
    except GrammarError as e:
        log.warning("Tool calls left unguided: the grammar engine refused the tools (%s)", e)
        return None


def _harmony_tool_call(tokenizer, tools: list[dict]) -> str:
    """One commentary message to a function (a harmony reply holds at most one call)."""
    header = "<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
    calls = tool_calls.named_arguments(functools.partial(markup_lark, tokenizer), tools, header)
    return _harmony(tokenizer).reply(f"({calls})", markup_lark(tokenizer, "<|call|>"))


def _harmony_call_guide(tokenizer, tools: list[dict]) -> str:
    """A harmony call from its recipient on (one a reply): a tool's name, the rest of the
    header as gpt-oss writes it (` <|constrain|>json<|message|>`) or with the channel after
    the recipient (`<|channel|>commentary json<|message|>`), JSON arguments, <|call|>."""
    markup = functools.partial(markup_lark, tokenizer)
    constrained = f'" " {markup("<|constrain|>")}'
    json_type = f'({constrained} "json" | " json")?'
    header = f'({json_type} | {markup("<|channel|>")} "commentary" {json_type})'
    calls = " | ".join(
        f"{lark.literal(t['function']['name'])} {header} {markup('<|message|>')} "
        f"{lark.json_schema(lark.parameters(t))}"
        for t in tools
    )
    return lark.grammar(f"{lark.literal(HARMONY_RECIPIENT)} ({calls}) {markup('<|call|>')}")


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
        return _compiled(tokenizer, text)
    except GrammarError as e:
        raise bad_request(f"The constraint cannot be enforced: {e}", param=param) from e


@functools.lru_cache(maxsize=32)  # an agent sends the same tools (or schema) every turn
def _compiled(tokenizer, text: str, trigger: str | None = None) -> Grammar:
    return Grammar(tokenizer, text, trigger=trigger)
