"""gpt-oss harmony end to end on the trained tiny gpt-oss model."""

from __future__ import annotations

import pytest
from conversations import HARMONY_BY_NAME, HARMONY_CONVERSATIONS
from sse import chat_message, stream, without_call_ids

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def harmony(harmony_model):
    from conftest import start_server

    srv = start_server(harmony_model)
    yield srv
    srv.stop()


def body(conv) -> dict:
    return {"messages": conv.messages, "tools": conv.tools or None, **conv.template_kwargs}


@pytest.mark.parametrize("conv", HARMONY_CONVERSATIONS, ids=lambda c: c.name)
def test_channels_become_reasoning_content_and_calls(harmony, conv):
    status, _, result = harmony.post(CHAT, body(conv))
    assert status == 200, result
    choice = result["choices"][0]
    assert without_call_ids(choice["message"]) == conv.message
    assert choice["finish_reason"] == ("tool_calls" if conv.calls else "stop")
    assert "<|" not in (choice["message"]["content"] or "")
    streamed = stream(harmony.url, CHAT, body(conv)).chunks
    assert chat_message(streamed) == conv.message
    reasoning_tokens = result["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert (reasoning_tokens > 0) == bool(conv.reasoning)


def test_tool_call_history_round_trip(harmony):
    conv = HARMONY_BY_NAME["tool_call"]
    first = harmony.post(CHAT, body(conv))[2]["choices"][0]["message"]
    history = [
        *conv.messages,
        first,
        {
            "role": "tool",
            "tool_call_id": first["tool_calls"][0]["id"],
            "name": "get_weather",
            "content": "Sunny",
        },
    ]
    status, _, result = harmony.post(CHAT, {**body(conv), "messages": history, "max_tokens": 20})
    assert status == 200, result
