"""The post-processor end to end: reasoning and tool calls from the trained tiny model."""

from __future__ import annotations

import json

import openai
import pytest
from conversations import BY_NAME
from helpers.sse import chat_message, stream, without_call_ids

CHAT = "/v1/chat/completions"
THINK = BY_NAME["think"]
PARALLEL = BY_NAME["parallel_tool_calls"]


def chat(server, conv, **extra):
    body = {"messages": conv.messages, "tools": conv.tools or None, **extra}
    status, _, result = server.post(CHAT, body)
    assert status == 200, result
    return result


def test_reasoning_tokens_are_counted(server, tiny_model):
    from transformers import AutoTokenizer

    usage = chat(server, THINK)["usage"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    block = THINK.reply[: THINK.reply.index("</think>") + len("</think>")]
    # Every token after the opening tag, up to and including the closing one.
    expected = len(tokenizer.encode(block, add_special_tokens=False)) - 1
    assert usage["completion_tokens_details"]["reasoning_tokens"] == expected
    plain = chat(server, BY_NAME["capital"])["usage"]
    assert plain["completion_tokens_details"]["reasoning_tokens"] == 0


@pytest.mark.parametrize(
    ("mode", "content"),
    [
        ("think-tags", "<think>Two plus two makes four.</think>\n\nThe answer is 4."),
        (
            "details",
            "<details>\n<summary>Thinking</summary>\n\nTwo plus two makes four.\n</details>\n\nThe answer is 4.",
        ),
        ("hidden", "The answer is 4."),
    ],
)
def test_reasoning_formats(launch, tiny_model, mode, content):
    srv = launch(tiny_model, "--reasoning-format", mode)
    message = chat(srv, THINK)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": content}
    assert chat_message(stream(srv.url, CHAT, {"messages": THINK.messages}).chunks) == message


def test_reasoning_parser_none_leaves_tags_in_content(launch, tiny_model):
    srv = launch(tiny_model, "--reasoning-parser", "none")
    message = chat(srv, THINK)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": THINK.reply}


def test_parallel_tool_calls_false(server):
    choice = chat(server, PARALLEL, parallel_tool_calls=False)["choices"][0]
    assert without_call_ids(choice["message"])["tool_calls"] == PARALLEL.message["tool_calls"][:1]
    assert choice["finish_reason"] == "tool_calls"


def test_tool_call_ids_are_unique(server):
    calls = chat(server, PARALLEL)["choices"][0]["message"]["tool_calls"]
    assert len({c["id"] for c in calls}) == 2


def test_tool_arguments_stream_in_pieces(server):
    chunks = stream(
        server.url, CHAT, {"messages": PARALLEL.messages, "tools": PARALLEL.tools}
    ).chunks
    fragments = [
        call["function"]["arguments"]
        for c in chunks
        for call in c["choices"][0]["delta"].get("tool_calls", [])
        if "id" not in call
    ]
    assert len(fragments) > 2  # generated piece by piece, not one blob per call
    assert "".join(fragments) == '{"city": "Paris"}{"city": "London"}'


def test_tool_call_round_trip_with_the_openai_sdk(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    model = client.models.list().data[0].id
    conv = BY_NAME["tool_call"]
    reply = client.chat.completions.create(model=model, messages=conv.messages, tools=conv.tools)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    call = message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    history = [
        *conv.messages,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    follow_up = client.chat.completions.create(
        model=model, messages=history, tools=conv.tools, max_tokens=20
    )
    assert follow_up.choices[0].finish_reason in ("stop", "length", "tool_calls")
    streamed = client.chat.completions.create(
        model=model, messages=conv.messages, tools=conv.tools, stream=True
    )
    pieces = list(streamed)
    assert pieces[-1].choices[0].finish_reason == "tool_calls"
    arguments = "".join(
        tc.function.arguments or "" for p in pieces for tc in (p.choices[0].delta.tool_calls or [])
    )
    assert json.loads(arguments) == {"city": "Paris"}


def test_invalid_reasoning_effort(server):
    status, _, body = server.post(CHAT, {"messages": THINK.messages, "reasoning_effort": "extreme"})
    assert status == 400 and body["error"]["param"] == "reasoning_effort"
    assert chat(server, THINK, reasoning_effort="LOW")["choices"][0]["message"]["content"]
