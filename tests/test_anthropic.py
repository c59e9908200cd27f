"""The Anthropic Messages API end to end: the official SDK and raw HTTP against the
trained fixture models, asserting exact content blocks, stop reasons, usage and errors."""

from __future__ import annotations

import base64
import json
import threading
import time

import anthropic
import pytest
from conversations import (
    AGENT_REPLY,
    BY_NAME,
    GEMMA_BY_NAME,
    HARMONY_BY_NAME,
    square_png,
)
from helpers.sse import named_events, stream
from helpers.streams import endless
from helpers.tools import WEATHER

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
CHAT = "/v1/chat/completions"


def client(srv, max_retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=max_retries)


def body(conv, **extra) -> dict:
    """The Anthropic request for a fixture conversation of user (and system) turns."""
    system = [m["content"] for m in conv.messages if m["role"] == "system"]
    request: dict = {
        "model": "default",
        "max_tokens": 200,
        "messages": [m for m in conv.messages if m["role"] != "system"],
    }
    if system:
        request["system"] = system[0]
    if conv.tools:
        request["tools"] = [WEATHER]
    return {**request, **extra}


def ask(sdk: anthropic.Anthropic, request: dict, streamed: bool):
    """The message, from `messages.create` or as `messages.stream` assembles it."""
    if not streamed:
        return sdk.messages.create(**request)
    with sdk.messages.stream(**request) as events:
        return events.get_final_message()


def blocks(message) -> list[dict]:
    """Content blocks as plain dicts, tool_use ids checked and left out."""
    out = []
    for block in message.content:
        item = block.model_dump(exclude_none=True)
        if item["type"] == "tool_use":
            assert item.pop("id").startswith("toolu_")
        out.append(item)
    return out


def expected_blocks(conv) -> list[dict]:
    """What the conversation's reply is as Anthropic content blocks (signatures aside)."""
    out: list[dict] = []
    if conv.reasoning:
        out.append({"type": "thinking", "thinking": conv.reasoning})
    content = conv.reply if conv.content is None and not conv.calls else conv.content
    if content:
        out.append({"type": "text", "text": content})
    for name, arguments in conv.calls:
        out.append({"type": "tool_use", "name": name, "input": json.loads(arguments)})
    return out


def without_signatures(items: list[dict]) -> list[dict]:
    for item in items:
        if item["type"] == "thinking":
            assert item.pop("signature").startswith("mlxserve-v1.")
    return items


# Whole replies and streams ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["capital", "system", "unicode", "think", "tool_call", "parallel_tool_calls"]
)
def test_replies_match_the_conversation_whole_and_streamed(server, name):
    conv = BY_NAME[name]
    sdk = client(server)
    message = sdk.messages.create(**body(conv))
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == "default"
    assert without_signatures(blocks(message)) == expected_blocks(conv)
    assert message.stop_reason == ("tool_use" if conv.calls else "end_turn")
    assert message.stop_sequence is None
    for block in message.content:
        assert "<think>" not in getattr(block, "text", "") + getattr(block, "thinking", "")
        assert "<tool_call>" not in getattr(block, "text", "")
    with sdk.messages.stream(**body(conv)) as events:
        streamed = events.get_final_message()
    assert blocks(streamed) == blocks(message)
    assert streamed.stop_reason == message.stop_reason
    assert streamed.usage.output_tokens == message.usage.output_tokens
    total = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens == total


def test_stream_wire_format(server):
    """Every event is an `event:` line and a `data:` line of the same type, blocks open,
    fill and close in order, thinking ends with its signature, and no [DONE]."""
    conv = BY_NAME["think"]
    result = stream(server.url, MESSAGES, body(conv))
    assert result.status == 200
    assert result.headers["Content-Type"].startswith("text/event-stream")
    assert not any(line == "data: [DONE]" for line in result.lines)
    events = named_events(result)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["id"].startswith("msg_") and start["usage"]["output_tokens"] == 0
    opened = [(p["index"], p["content_block"]) for n, p in events if n == "content_block_start"]
    assert opened == [
        (0, {"type": "thinking", "thinking": "", "signature": ""}),
        (1, {"type": "text", "text": ""}),
    ]
    deltas = [(p["index"], p["delta"]) for n, p in events if n == "content_block_delta"]
    thinking = "".join(d.get("thinking", "") for i, d in deltas if i == 0)
    text = "".join(d.get("text", "") for i, d in deltas if i == 1)
    assert thinking == conv.reasoning and text == conv.content
    signature = [d for _, d in deltas if d["type"] == "signature_delta"]
    assert len(signature) == 1 and signature[0]["signature"].startswith("mlxserve-v1.")
    # the signature comes last in the thinking block, just before it stops
    assert names.index("content_block_stop") == names.index("content_block_delta") + sum(
        1 for i, d in deltas if i == 0
    )
    assert [p["index"] for n, p in events if n == "content_block_stop"] == [0, 1]
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"]["output_tokens"] > 0


def test_tool_arguments_stream_as_json_fragments(server):
    conv = BY_NAME["parallel_tool_calls"]
    events = named_events(stream(server.url, MESSAGES, body(conv)))
    starts = [p for n, p in events if n == "content_block_start"]
    assert [s["content_block"]["name"] for s in starts] == ["get_weather", "get_weather"]
    for start, (_, arguments) in zip(starts, conv.calls, strict=True):
        block = start["content_block"]
        assert block["type"] == "tool_use" and block["input"] == {}
        assert block["id"].startswith("toolu_")
        fragments = [
            p["delta"]["partial_json"]
            for n, p in events
            if n == "content_block_delta" and p["index"] == start["index"]
        ]
        assert len(fragments) > 1  # streamed as written, not in one piece
        assert "".join(fragments) == arguments
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_raw_http_reply_shape(server):
    status, headers, reply = server.post(MESSAGES, body(BY_NAME["capital"]))
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert set(reply) == {
        "id",
        "type",
        "role",
        "model",
        "content",
        "stop_reason",
        "stop_sequence",
        "usage",
    }
    assert reply["content"] == [{"type": "text", "text": BY_NAME["capital"].reply}]
    usage = reply["usage"]
    assert set(usage) == {
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }
    assert usage["cache_creation_input_tokens"] == 0


@pytest.mark.parametrize("streamed", [False, True])
def test_a_prefilled_assistant_turn_is_continued(server, streamed):
    """A conversation ending in an assistant turn gets that turn's continuation only."""
    conv = BY_NAME["capital"]
    prefill = {"role": "assistant", "content": "The capital of"}
    request = body(conv, messages=[*conv.messages, prefill])
    message = ask(client(server), request, streamed)
    assert blocks(message) == [{"type": "text", "text": " France is Paris."}]
    assert message.stop_reason == "end_turn"


# Tools --------------------------------------------------------------------------------


def test_tool_result_turn_on_injected_tools(gemma):
    """A tool_use / tool_result exchange reaches a template without tools (tiny-gemma)
    exactly as the OpenAI dialect sends it, and the model answers from the result."""
    conv = GEMMA_BY_NAME["tool_result"]
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_0",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_0", "content": "Sunny, 21 C"}],
        },
    ]
    request = {"model": "default", "max_tokens": 100, "messages": messages, "tools": [WEATHER]}
    message = client(gemma).messages.create(**request)
    assert blocks(message) == [{"type": "text", "text": conv.reply}]
    assert message.stop_reason == "end_turn"
    # the same prompt as the OpenAI dialect renders for this conversation
    anthropic_count = client(gemma).messages.count_tokens(
        model="default", messages=messages, tools=[WEATHER]
    )
    status, _, openai_reply = gemma.post(CHAT, {**conv.request, "max_tokens": 1})
    assert status == 200
    assert anthropic_count.input_tokens == openai_reply["usage"]["prompt_tokens"]


def test_injected_tool_call(gemma):
    conv = GEMMA_BY_NAME["tool_call"]
    message = client(gemma).messages.create(**body(conv))
    assert blocks(message) == expected_blocks(conv)
    assert message.stop_reason == "tool_use"
    assert "tool_code" not in message.content[0].text


@pytest.mark.parametrize(
    "choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"]
)
def test_forced_tool_choice(server, choice):
    """The capital question, which the model answers in text, gets a tool call instead."""
    request = body(BY_NAME["capital"], tools=[WEATHER], tool_choice=choice)
    message = client(server).messages.create(**request)
    assert [b.type for b in message.content] == ["tool_use"]
    call = message.content[0]
    assert call.name == "get_weather" and isinstance(call.input.get("city"), str)
    assert message.stop_reason == "tool_use"


def test_tool_choice_none_answers_in_text(server):
    request = body(BY_NAME["tool_call"], tool_choice={"type": "none"})
    message = client(server).messages.create(**request)
    assert all(b.type == "text" for b in message.content)


def test_disable_parallel_tool_use_keeps_one_call(server):
    request = body(
        BY_NAME["parallel_tool_calls"],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    message = client(server).messages.create(**request)
    assert blocks(message) == [
        {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}}
    ]


def test_deferred_tools_are_rendered_as_any_other(server):
    """defer_loading (tool search's deferral, which Claude Code sets on a tool): the tool is
    in the prompt like any other, and called like any other."""
    sdk = client(server)
    deferred = {**WEATHER, "defer_loading": True}
    messages = BY_NAME["tool_call"].messages
    plain = prompt_tokens(sdk, messages, tools=[WEATHER])
    assert prompt_tokens(sdk, messages, tools=[deferred]) == plain
    message = sdk.messages.create(**body(BY_NAME["tool_call"], tools=[deferred]))
    assert blocks(message) == expected_blocks(BY_NAME["tool_call"])


def test_a_tool_reference_in_a_tool_result_is_the_tools_name(server):
    """What a tool search found (Claude Code's ToolSearch answers with tool_reference blocks)
    stands in its result as the tool's name: the tool itself is in the prompt already."""
    sdk = client(server)
    search = {
        "name": "ToolSearch",
        "description": "Finds deferred tools.",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
    tools = [search, {**WEATHER, "defer_loading": True}]

    def history(result) -> list[dict]:
        call = {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {}}
        call["input"] = {"query": "select:get_weather"}
        found = {"type": "tool_result", "tool_use_id": "toolu_1", "content": result}
        return [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [found, {"type": "text", "text": "Tool loaded."}]},
        ]

    reference = [{"type": "tool_reference", "tool_name": "get_weather"}]
    assert prompt_tokens(sdk, history(reference), tools=tools) == prompt_tokens(
        sdk, history("get_weather"), tools=tools
    )
    request = {"model": "default", "max_tokens": 8, "tools": tools}
    referenced = sdk.messages.create(**request, messages=history(reference))
    assert blocks(referenced) == blocks(
        sdk.messages.create(**request, messages=history("get_weather"))
    )


def test_input_examples_follow_the_tools_description(server):
    """A tool's input_examples reach the model after its description, a JSON object a line;
    a tool that lets the model call it (allowed_callers with 'direct') is any tool."""
    sdk = client(server)
    messages = BY_NAME["tool_call"].messages
    examples = [{"city": "Paris"}, {"city": "Lima"}]
    written = {
        **WEATHER,
        "description": WEATHER["description"]
        + '\n\nExamples of input:\n{"city": "Paris"}\n{"city": "Lima"}',
    }
    with_examples = prompt_tokens(sdk, messages, tools=[{**WEATHER, "input_examples": examples}])
    assert with_examples == prompt_tokens(sdk, messages, tools=[written])
    assert with_examples > prompt_tokens(sdk, messages, tools=[WEATHER])
    callers = {**WEATHER, "allowed_callers": ["direct", "code_execution_20250825"]}
    assert prompt_tokens(sdk, messages, tools=[callers]) == prompt_tokens(
        sdk, messages, tools=[WEATHER]
    )


# Thinking -----------------------------------------------------------------------------


def test_thinking_sent_back_is_reasoning_only_with_this_servers_signature(server):
    conv = BY_NAME["think"]
    first = client(server).messages.create(**body(conv))
    thinking = first.content[0]

    def count(block: dict) -> int:
        history = [
            *conv.messages,
            {"role": "assistant", "content": [block, {"type": "text", "text": "The answer is 4."}]},
            {"role": "user", "content": "Count to five."},
        ]
        return client(server).messages.count_tokens(model="default", messages=history).input_tokens

    signed = {"type": "thinking", "thinking": thinking.thinking, "signature": thinking.signature}
    forged = {**signed, "signature": "mlxserve-v1.forged"}
    other = {**signed, "thinking": "Something else entirely."}
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    without = count(redacted)
    assert count(signed) > without
    assert count(forged) == count(other) == without


@pytest.mark.parametrize(
    ("fixture", "conv"),
    [("server", BY_NAME["think"]), ("harmony", HARMONY_BY_NAME["capital"])],
    ids=["think-tags", "harmony"],
)
def test_thinking_budget_cuts_reasoning_then_answers(request, fixture, conv):
    """At the budget the tokens that close reasoning are forced: `</think>`, or harmony's
    end of the analysis message and the final channel's header."""
    srv = request.getfixturevalue(fixture)
    full = client(srv).messages.create(**body(conv))
    cut = client(srv).messages.create(
        **body(conv, thinking={"type": "enabled", "budget_tokens": 3})
    )
    reasoning = cut.content[0]
    assert reasoning.type == "thinking"
    assert full.content[0].thinking.startswith(reasoning.thinking.strip())
    assert 0 < len(reasoning.thinking) < len(full.content[0].thinking)
    assert [b.type for b in cut.content] == ["thinking", "text"]  # then the answer
    assert "<|channel|>" not in cut.content[1].text


def test_thinking_switch_reaches_the_template(server):
    messages = BY_NAME["think"].messages
    sdk = client(server)
    default = sdk.messages.count_tokens(model="default", messages=messages).input_tokens
    enabled = sdk.messages.count_tokens(
        model="default", messages=messages, thinking={"type": "enabled", "budget_tokens": 10}
    ).input_tokens
    disabled = sdk.messages.count_tokens(
        model="default", messages=messages, thinking={"type": "disabled"}
    ).input_tokens
    assert default == enabled and disabled > default  # the template writes an empty block


OMITTED = {"type": "enabled", "budget_tokens": 100, "display": "omitted"}


def test_thinking_display_omitted_whole_and_streamed(server):
    """display "omitted": the thinking block's text is empty and its signature holds the
    reasoning, sealed; a stream has no thinking_delta, only the signature_delta.
    "summarized" is the reasoning as written, as without display."""
    conv = BY_NAME["think"]
    sdk = client(server)
    whole = sdk.messages.create(**body(conv, thinking=OMITTED))
    thinking, text = whole.content
    assert thinking.type == "thinking" and thinking.thinking == ""
    assert thinking.signature.startswith("mlxserve-th1.")
    assert text.type == "text" and text.text == conv.content
    assert whole.usage.output_tokens == sdk.messages.create(**body(conv)).usage.output_tokens
    with sdk.messages.stream(**body(conv, thinking=OMITTED)) as events:
        assert blocks(events.get_final_message()) == blocks(whole)
    events = named_events(stream(server.url, MESSAGES, body(conv, thinking=OMITTED)))
    opened = [(p["index"], p["content_block"]) for n, p in events if n == "content_block_start"]
    assert opened == [
        (0, {"type": "thinking", "thinking": "", "signature": ""}),
        (1, {"type": "text", "text": ""}),
    ]
    deltas = [(p["index"], p["delta"]) for n, p in events if n == "content_block_delta"]
    assert [d for i, d in deltas if i == 0] == [
        {"type": "signature_delta", "signature": thinking.signature}
    ]
    assert "".join(d["text"] for i, d in deltas if i == 1) == conv.content
    summarized = {**OMITTED, "display": "summarized"}
    shown = sdk.messages.create(**body(conv, thinking=summarized))
    assert without_signatures(blocks(shown)) == expected_blocks(conv)


def test_omitted_thinking_sent_back_is_the_reasoning_its_signature_holds(server):
    """Sent back with its empty text, an omitted block is its reasoning in the prompt, as
    the same block shown and signed is; a signature edited or not this server's is not."""
    conv = BY_NAME["think"]
    sdk = client(server)
    omitted = sdk.messages.create(**body(conv, thinking=OMITTED)).content[0].model_dump()
    shown = sdk.messages.create(**body(conv)).content[0].model_dump()

    def count(block: dict) -> int:
        history = [
            *conv.messages,
            {"role": "assistant", "content": [block, {"type": "text", "text": "The answer is 4."}]},
            {"role": "user", "content": "Count to five."},
        ]
        return prompt_tokens(sdk, history)

    prefix, _, tag = omitted["signature"].rpartition(".")
    edited_tag = {**omitted, "signature": f"{prefix}.{tag[::-1]}"}
    without = count({"type": "redacted_thinking", "data": "opaque"})
    assert count(omitted) == count(shown) > without
    assert count(edited_tag) == count({**omitted, "signature": "EqQBCgIYAh"}) == without


def test_omitted_thinking_keeps_the_stream_alive(launch, tiny_model):
    """While omitted thinking is written nothing else goes out: pings do, once the stream
    has been silent for --keepalive-seconds, between the block's start and its signature."""
    srv = launch(tiny_model, "--keepalive-seconds", "0.001")
    events = named_events(stream(srv.url, MESSAGES, body(BY_NAME["think"], thinking=OMITTED)))
    names = [name for name, _ in events]
    start = names.index("content_block_start")
    signed = next(i for i, (n, p) in enumerate(events) if p.get("delta", {}).get("signature"))
    assert "ping" in names[start:signed]
    assert names[-1] == "message_stop" and "ping" not in names[names.index("message_delta") :]


def test_harmony_reasoning_and_tool_call(harmony):
    for name in ("capital", "tool_call"):
        conv = HARMONY_BY_NAME[name]
        message = client(harmony).messages.create(**body(conv))
        assert without_signatures(blocks(message)) == expected_blocks(conv)
        assert "<|channel|>" not in str(blocks(message))


# Context editing -------------------------------------------------------------------------

CONTEXT_BETA = ["context-management-2025-06-27"]
CLEARED = "[Old tool result content cleared]"  # what a cleared tool result reads
TIME = {
    "name": "get_time",
    "description": "The time in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
# Four tool uses, oldest first: the weather in Paris and London, the time, Rome's weather.
USES = [("get_weather", "Paris"), ("get_weather", "London"), ("get_time", "Paris")]
USES += [("get_weather", "Rome")]


def tool_history(cleared: int = 0, inputs: bool = False) -> list[dict]:
    """A conversation of USES and their results, then a question; the first `cleared`
    weather results as context editing leaves them (their inputs too with `inputs`)."""
    messages: list[dict] = [{"role": "user", "content": "Weather and time, please."}]
    weather = 0
    for i, (name, city) in enumerate(USES):
        gone = name == "get_weather" and weather < cleared
        weather += name == "get_weather"
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {"city": city}}
        if gone and inputs:
            call["input"] = {}
        result = f"{city}: {name.removeprefix('get_')} report number {i}, " + "details " * 20
        content = CLEARED if gone else result
        messages.append({"role": "assistant", "content": [call]})
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": content}],
            }
        )
    messages.append({"role": "user", "content": "Which city is warmest?"})
    return messages


def edited(sdk: anthropic.Anthropic, request: dict, streamed: bool):
    """The beta message (context_management parsed), whole or as the stream assembles it."""
    request = {"betas": CONTEXT_BETA, **request}
    if not streamed:
        return sdk.beta.messages.create(**request)
    with sdk.beta.messages.stream(**request) as events:
        return events.get_final_message()


def prompt_tokens(sdk: anthropic.Anthropic, messages: list[dict], **extra) -> int:
    return sdk.messages.count_tokens(model="default", messages=messages, **extra).input_tokens


def applied(message) -> list[dict]:
    return message.context_management.model_dump()["applied_edits"]


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("inputs", [True, ["get_time"]], ids=["all-inputs", "named-inputs"])
def test_context_editing_clears_old_tool_results(server, streamed, inputs):
    """Past the trigger, every tool use but the last `keep`, less the excluded tools', has
    its result replaced, and its input emptied where clear_tool_inputs says so (all, or
    none here: the tool it names is excluded): the prompt is the conversation cleared by
    hand, and applied_edits says by how many uses and tokens."""
    sdk = client(server)
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 3},
        "keep": {"type": "tool_uses", "value": 1},
        "exclude_tools": ["get_time"],
        "clear_tool_inputs": inputs,
    }
    request = {"model": "default", "max_tokens": 8, "tools": [WEATHER, TIME]}
    by_hand = tool_history(cleared=2, inputs=inputs is True)
    message = edited(
        sdk,
        {**request, "messages": tool_history(), "context_management": {"edits": [edit]}},
        streamed,
    )
    tokens = prompt_tokens(sdk, by_hand, tools=request["tools"])
    freed = prompt_tokens(sdk, tool_history(), tools=request["tools"]) - tokens
    assert freed > 0
    assert applied(message) == [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": freed}
    ]
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == tokens
    plain = sdk.beta.messages.create(**request, messages=by_hand)
    assert blocks(message) == blocks(plain)
    assert plain.context_management is None  # no context_management asked, none answered


def test_context_edits_short_of_their_trigger_clear_nothing(server):
    """A trigger not passed, an edit that would free less than clear_at_least, and
    Claude Code's own edit (every thinking turn kept): the prompt as sent, and an empty
    applied_edits, as Anthropic answers a request with context_management."""
    sdk = client(server)
    tools = [WEATHER, TIME]
    whole = prompt_tokens(sdk, tool_history(), tools=tools)
    edits = [
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": whole}},
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 4}},
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 1},
            "keep": {"type": "tool_uses", "value": 0},
            "clear_at_least": {"type": "input_tokens", "value": whole},
        },
        {"type": "clear_thinking_20251015", "keep": "all"},
    ]
    for edit in edits:
        request = {"model": "default", "max_tokens": 4, "messages": tool_history(), "tools": tools}
        message = edited(sdk, {**request, "context_management": {"edits": [edit]}}, False)
        assert applied(message) == [], edit
        assert message.usage.input_tokens + message.usage.cache_read_input_tokens == whole


def test_context_editing_clears_thinking_of_older_turns(server):
    """keep: 1 thinking turn: this server's signed thinking leaves the first assistant
    turn, whole and streamed alike (the streamed report on message_delta only)."""
    sdk = client(server)
    conv = BY_NAME["think"]
    first = sdk.messages.create(**body(conv)).content[0]
    signed = {"type": "thinking", "thinking": first.thinking, "signature": first.signature}

    def history(thinking_first: bool) -> list[dict]:
        turn = [signed] if thinking_first else []
        return [
            *conv.messages,
            {"role": "assistant", "content": [*turn, {"type": "text", "text": "The answer is 4."}]},
            {"role": "user", "content": "Count to five."},
            {"role": "assistant", "content": [signed, {"type": "text", "text": "One, two."}]},
            {"role": "user", "content": "What is the capital of France?"},
        ]

    edit = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
    request = {
        "model": "default",
        "max_tokens": 8,
        "messages": history(True),
        "thinking": {"type": "enabled", "budget_tokens": 100},
        "context_management": {"edits": [edit]},
    }
    freed = prompt_tokens(sdk, history(True)) - prompt_tokens(sdk, history(False))
    assert freed > 0  # the signed thinking was in the prompt
    whole = edited(sdk, request, False)
    streamed = edited(sdk, request, True)
    expected = [
        {
            "type": "clear_thinking_20251015",
            "cleared_thinking_turns": 1,
            "cleared_input_tokens": freed,
        }
    ]
    assert applied(whole) == applied(streamed) == expected
    assert blocks(whole) == blocks(streamed)
    events = named_events(stream(server.url, MESSAGES, request))
    assert "context_management" not in events[0][1]["message"]
    assert events[-2][0] == "message_delta"
    assert events[-2][1]["context_management"] == {"applied_edits": expected}


def test_count_tokens_counts_the_edited_prompt(server):
    """count_tokens applies the edits too: input_tokens is the edited prompt's, and
    original_input_tokens the prompt as sent."""
    sdk = client(server)
    whole = prompt_tokens(sdk, tool_history())
    # past the trigger by one token, the default keep (3 tool uses): Paris's result goes
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": whole - 1},
    }
    counted = sdk.beta.messages.count_tokens(
        model="default",
        messages=tool_history(),
        context_management={"edits": [edit]},
        betas=CONTEXT_BETA,
    )
    assert counted.input_tokens == prompt_tokens(sdk, tool_history(cleared=1))
    assert counted.context_management.original_input_tokens == whole
    status, _, reply = server.post(COUNT, {"model": "default", "messages": tool_history()})
    assert status == 200 and set(reply) == {"input_tokens"}
    unserved = {"edits": [{"type": "compact_20260112"}]}
    request = {"model": "default", "messages": tool_history(), "context_management": unserved}
    status, _, reply = server.post(COUNT, request)
    assert status == 400 and "'compact_20260112'" in reply["error"]["message"]


# Structured outputs, fallbacks, compaction -----------------------------------------------

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "schema": CITY}


@pytest.mark.parametrize("streamed", [False, True])
def test_output_format_is_output_config_format(server, streamed):
    """The structured-outputs beta's top-level output_format is output_config.format under
    its older name: the same JSON answer, and both at once with one format too."""
    sdk = client(server)
    conv = BY_NAME["capital"]
    asked = ask(sdk, body(conv, output_config={"format": FORMAT}), streamed)
    (text,) = asked.content
    assert json.loads(text.text).keys() == {"city"} and text.text != conv.reply
    for extra in ({"output_format": FORMAT}, {"output_format": FORMAT, "output_config": {}}):
        assert ask(sdk, {**body(conv), "extra_body": extra}, streamed).content == asked.content
    both = {"output_format": FORMAT, "output_config": {"format": FORMAT}}
    assert ask(sdk, {**body(conv), "extra_body": both}, streamed).content == asked.content


def test_default_fallbacks_run_on_the_model_alone(server):
    """fallbacks "default" (or none listed): the request runs on its model, as Anthropic
    runs it on a model without fallbacks; a list of models is a 400 (the table below)."""
    conv = BY_NAME["capital"]
    for fallbacks in ("default", []):
        status, _, reply = server.post(MESSAGES, body(conv, fallbacks=fallbacks))
        assert status == 200 and reply["content"] == [{"type": "text", "text": conv.reply}]


def test_count_tokens_takes_compaction_and_counts_the_messages(server):
    """Anthropic's count_tokens accepts `compaction` and counts the messages as sent; a
    Messages request with it is a 400 (the table below)."""
    conv = BY_NAME["capital"]
    plain = {"model": "default", "messages": conv.messages}
    status, _, reply = server.post(COUNT, {**plain, "compaction": {"type": "summarize"}})
    assert status == 200 and reply == server.post(COUNT, plain)[2]


# Stops, limits, counting -----------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_stop_sequence(server, streamed):
    request = body(BY_NAME["capital"], stop_sequences=["France"])
    message = ask(client(server), request, streamed)
    assert blocks(message) == [{"type": "text", "text": "The capital of "}]
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "France"


def test_max_tokens(server):
    message = client(server).messages.create(**body(BY_NAME["story"], max_tokens=3))
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    assert BY_NAME["story"].reply.startswith(message.content[0].text)


def test_count_tokens_equals_the_prompt_of_the_request(server):
    conv = BY_NAME["tool_call"]
    request = body(conv)
    counted = client(server).messages.count_tokens(
        model="default", messages=request["messages"], tools=request["tools"]
    )
    message = client(server).messages.create(**request)
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens
    status, _, raw = server.post(COUNT, {"model": "default", "messages": request["messages"]})
    assert status == 200 and set(raw) == {"input_tokens"}


def test_cache_read_tokens_on_a_repeated_prompt(launch, tiny_model):
    srv = launch(tiny_model)
    request = body(BY_NAME["capital"])
    first = client(srv).messages.create(**request).usage
    second = client(srv).messages.create(**request).usage
    assert first.cache_read_input_tokens == 0
    assert second.cache_read_input_tokens > 0
    assert second.input_tokens + second.cache_read_input_tokens == first.input_tokens


def test_image_to_a_vision_model(vision):
    data = base64.b64encode(square_png("red")).decode()
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": "What colour is the square?"},
    ]
    message = client(vision).messages.create(
        model="default", max_tokens=20, messages=[{"role": "user", "content": content}]
    )
    assert blocks(message) == [{"type": "text", "text": "Red."}]


# Names, keepalive, errors -------------------------------------------------------------------


def test_model_alias_answers_claude_names(launch, tiny_model):
    srv = launch(tiny_model, "--model-alias", "claude-*=default", "--model-alias", "small=default")
    conv = BY_NAME["capital"]
    for name in ("claude-sonnet-4-5", "claude-3-5-haiku-latest", "small"):
        message = client(srv).messages.create(**body(conv, model=name))
        assert message.model == name and message.content[0].text == conv.reply
    with pytest.raises(anthropic.NotFoundError) as refused:
        client(srv).messages.create(**body(conv, model="gpt-4o"))
    assert refused.value.body["error"]["type"] == "not_found_error"


def test_ping_while_waiting(launch, tiny_model):
    """A request waiting for a slot gets message_start and pings, then its message."""
    single = launch(tiny_model, "--max-concurrent", "1", "--keepalive-seconds", "0.3")
    busy = threading.Thread(target=single.post, args=(CHAT, endless(tiny_model, max_tokens=1500)))
    busy.start()
    time.sleep(0.3)
    events = named_events(stream(single.url, MESSAGES, body(BY_NAME["capital"])))
    busy.join()
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[1] == "ping"
    assert names.index("content_block_start") > names.index("ping")
    assert names[-1] == "message_stop"


ERRORS = [
    ({"model": "default", "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
    ({"model": "default", "max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}, "model"),
    (
        {"model": "default", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
        "messages[0].role",
    ),
    (
        {
            "model": "default",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}],
        },
        "messages[0].content",
    ),
    (
        {
            "model": "default",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}],
            "temperature": 1.5,
        },
        "temperature",
    ),
    (
        {
            "model": "default",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
            "tool_choice": {"type": "tool", "name": "web_search"},
        },
        "web_search",
    ),
    (
        {
            "model": "default",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [WEATHER],
            "tool_choice": {"type": "tool"},
        },
        "name",
    ),
    (
        {
            "model": "default",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}],
            "thinking": {"type": "enabled"},
        },
        "budget_tokens",
    ),
    (
        {
            "model": "default",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
                    ],
                }
            ],
        },
        "images",
    ),
]


# Fields that would change the reply and that this server does not serve: named in a 400.
HI = {"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
CLEAR_TOOLS = {"type": "clear_tool_uses_20250919"}
CLEAR_THINKING = {"type": "clear_thinking_20251015"}


def editing(*edits: dict, **more) -> dict:
    return {**HI, "context_management": {"edits": list(edits), **more}}


ERRORS += [
    ({**HI, "container": "container_011CZ"}, "container"),
    ({**HI, "container": {"id": None, "skills": []}}, "container"),
    (editing({"type": "compact_20260112"}), "'compact_20260112'"),
    (editing({"keep": "all"}), "context_management.edits"),
    (
        editing({**CLEAR_TOOLS, "trigger": {"type": "input_tokens"}}),
        "context_management.edits[0].trigger",
    ),
    (
        editing(CLEAR_THINKING, {**CLEAR_TOOLS, "keep": {"type": "thinking_turns", "value": 1}}),
        "context_management.edits[1].keep",
    ),
    (
        editing({**CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 0}}),
        "context_management.edits[0].keep",
    ),
    (
        editing({**CLEAR_TOOLS, "exclude_tool": ["Bash"]}),
        "context_management.edits[0].exclude_tool",
    ),
    (editing(pause_after_compaction=True), "context_management.pause_after_compaction"),
    ({**HI, "compaction": {"type": "summarize"}}, "compaction"),
    ({**HI, "fallbacks": [{"model": "claude-opus-4-8"}]}, "fallbacks"),
    ({**HI, "fallback_credit_token": "fct_011CZ"}, "fallback_credit_token"),
    ({**HI, "fallback_credit_token": {"token": "fct_011CZ"}}, "fallback_credit_token"),
    (
        {**HI, "output_config": {"task_budget": {"type": "tokens", "total": 64000}}},
        "output_config.task_budget",
    ),
    ({**HI, "thinking": {"type": "adaptive", "display": "updates"}}, "thinking.display"),
    (
        {
            **HI,
            "output_format": FORMAT,
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "string"}}},
        },
        "output_format",
    ),
    (
        {**HI, "tools": [{**WEATHER, "allowed_callers": ["code_execution_20250825"]}]},
        "tools[0].allowed_callers",
    ),
]


@pytest.mark.parametrize(("request_body", "mentions"), ERRORS)
def test_client_mistakes_are_400_in_anthropic_shape(server, request_body, mentions):
    status, _, reply = server.post(MESSAGES, request_body)
    assert status == 400, reply
    assert reply["type"] == "error" and reply["error"]["type"] == "invalid_request_error"
    assert mentions in reply["error"]["message"]
    assert set(reply) == {"type", "error"} and set(reply["error"]) == {"type", "message"}


def test_sdk_errors_and_server_stays_up(server):
    sdk = client(server)
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.create(
            model="default", max_tokens=0, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk.messages.create(
            model="no-such-model", max_tokens=5, messages=BY_NAME["capital"].messages
        )
    assert missing.value.body["error"]["type"] == "not_found_error"
    status, _, reply = server.post(MESSAGES, b"{not json")
    assert status == 400 and reply["error"]["type"] == "invalid_request_error"
    status, _, reply = server.get(MESSAGES)
    assert status == 405 and reply["type"] == "error"
    assert (
        sdk.messages.create(**body(BY_NAME["capital"])).content[0].text == BY_NAME["capital"].reply
    )


def test_api_key_by_x_api_key_or_bearer(launch, tiny_model):
    srv = launch(tiny_model, "--api-key", "sekret")
    request = body(BY_NAME["capital"])
    status, _, reply = srv.post(MESSAGES, request)
    assert status == 401 and reply["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).messages.create(
            **request
        )
    by_header = anthropic.Anthropic(base_url=srv.url, api_key="sekret").messages.create(**request)
    by_bearer = anthropic.Anthropic(base_url=srv.url, auth_token="sekret").messages.create(
        **request
    )
    assert by_header.content == by_bearer.content
    status, _, _ = srv.post(
        MESSAGES, request, {"x-api-key": "sekret", "anthropic-version": "2023-06-01"}
    )
    assert status == 200


def test_body_too_large_is_413_request_too_large(launch, tiny_model):
    srv = launch(tiny_model, "--max-body-bytes", "1000")
    status, _, reply = srv.post(MESSAGES, body(BY_NAME["capital"], system="x" * 2000))
    assert status == 413 and reply["error"]["type"] == "request_too_large"


def test_a_full_server_answers_529_overloaded(launch, agent_model):
    from helpers.streams import TimedStream

    srv = launch(agent_model, "--max-concurrent", "1", "--max-queue", "1")
    holders = [TimedStream(srv, endless(agent_model, max_tokens=130_000))]
    while not holders[0].data_times():
        time.sleep(0.01)
    holders.append(TimedStream(srv, endless(agent_model, max_tokens=130_000)))
    try:
        status, headers, reply = srv.post(MESSAGES, body(BY_NAME["capital"]))
        assert status == 529 and headers["Retry-After"] == "1"
        assert reply["error"]["type"] == "overloaded_error"
        with pytest.raises(anthropic.APIStatusError) as refused:
            client(srv).messages.create(**body(BY_NAME["capital"]))
        assert refused.value.status_code == 529
    finally:
        for holder in holders:
            holder.close()
    patient = client(srv, max_retries=5)  # the SDK retries 529 and is served
    reply = patient.messages.create(**body(BY_NAME["capital"]))
    assert reply.content[0].text == AGENT_REPLY
