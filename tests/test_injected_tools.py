"""Tools injected into the prompt for a template without tool support (Gemma style)."""

from __future__ import annotations

import pytest
from conversations import GEMMA_BY_NAME, GEMMA_CONVERSATIONS
from sse import chat_message, stream, without_call_ids

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def gemma(gemma_model):
    from conftest import start_server

    srv = start_server(gemma_model)
    yield srv
    srv.stop()


def body(conv) -> dict:
    return {"messages": conv.messages, "tools": conv.tools or None}


@pytest.mark.parametrize("conv", GEMMA_CONVERSATIONS, ids=lambda c: c.name)
def test_injected_tools_round_trip(gemma, conv):
    status, _, result = gemma.post(CHAT, body(conv))
    assert status == 200, result
    choice = result["choices"][0]
    assert without_call_ids(choice["message"]) == conv.message
    assert choice["finish_reason"] == ("tool_calls" if conv.calls else "stop")
    assert "```" not in (choice["message"]["content"] or "")
    assert chat_message(stream(gemma.url, CHAT, body(conv)).chunks) == conv.message


def test_consecutive_user_turns_are_merged(gemma):
    messages = [
        {"role": "user", "content": "What is the capital"},
        {"role": "user", "content": "of France?"},
    ]
    status, _, result = gemma.post(CHAT, {"messages": messages, "max_tokens": 5})
    assert status == 200, result


def test_tool_choice_none_injects_nothing(gemma):
    conv = GEMMA_BY_NAME["tool_call"]
    with_tools = gemma.post(CHAT, body(conv))[2]["usage"]["prompt_tokens"]
    none = gemma.post(CHAT, {**body(conv), "tool_choice": "none", "max_tokens": 5})[2]
    assert none["usage"]["prompt_tokens"] < with_tools
