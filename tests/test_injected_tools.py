"""Tools injected into the prompt for a template without tool support (Gemma style)."""

from __future__ import annotations

import pytest
from conversations import GEMMA_BY_NAME, GEMMA_CONVERSATIONS
from helpers.checks import assert_round_trip

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("conv", GEMMA_CONVERSATIONS, ids=lambda c: c.name)
def test_injected_tools_round_trip(gemma, conv):
    assert_round_trip(gemma, conv, markup=("```",))


def test_consecutive_user_turns_are_merged(gemma):
    """A template that allows one turn per role at a time gets the two user turns as one
    (joined by a blank line), rendered exactly as that one turn would be, and answers."""
    messages = [
        {"role": "user", "content": "What is the capital"},
        {"role": "user", "content": "of France?"},
    ]
    merged = [{"role": "user", "content": "What is the capital\n\nof France?"}]
    split = gemma.post("/tokenize", {"messages": messages})[2]["tokens"]
    assert split == gemma.post("/tokenize", {"messages": merged})[2]["tokens"]
    prompt = gemma.post("/detokenize", {"tokens": split})[2]["prompt"]
    assert prompt.count("<start_of_turn>user") == 1, prompt
    status, _, result = gemma.post(CHAT, {"messages": messages, "max_tokens": 5})
    assert status == 200 and result["choices"][0]["message"]["content"], result


def test_tool_choice_none_injects_nothing(gemma):
    conv = GEMMA_BY_NAME["tool_call"]
    with_tools = gemma.post(CHAT, conv.request)[2]["usage"]["prompt_tokens"]
    none = gemma.post(CHAT, {**conv.request, "tool_choice": "none", "max_tokens": 5})[2]
    assert none["usage"]["prompt_tokens"] < with_tools
