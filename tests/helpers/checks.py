"""Checks shared by the end-to-end tests of the trained fixture models."""

from __future__ import annotations

from helpers.server import CHAT
from helpers.sse import chat_message, stream, without_call_ids


def assert_round_trip(server, conv, markup: tuple[str, ...]) -> dict:
    """The whole response and the stream both give the conversation's expected message,
    with the right finish reason and none of `markup` in the content."""
    status, _, result = server.post(CHAT, conv.request)
    assert status == 200, result
    choice = result["choices"][0]
    assert without_call_ids(choice["message"]) == conv.message
    assert choice["finish_reason"] == ("tool_calls" if conv.calls else "stop")
    assert not any(m in (choice["message"]["content"] or "") for m in markup)
    streamed = stream(server.url, CHAT, conv.request).chunks
    assert chat_message(streamed) == conv.message
    assert streamed[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    return result
