"""gpt-oss harmony end to end on the trained tiny gpt-oss model."""

from __future__ import annotations

import pytest
from conversations import HARMONY_BY_NAME, HARMONY_CONVERSATIONS
from helpers.checks import assert_round_trip
from helpers.tools import named_calls, unclosable_call

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("conv", HARMONY_CONVERSATIONS, ids=lambda c: c.name)
def test_channels_become_reasoning_content_and_calls(harmony, conv):
    result = assert_round_trip(harmony, conv, markup=("<|",))
    reasoning_tokens = result["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert (reasoning_tokens > 0) == bool(conv.reasoning)


def test_tool_call_history_round_trip(harmony):
    conv = HARMONY_BY_NAME["tool_call"]
    first = harmony.post(CHAT, conv.request)[2]["choices"][0]["message"]
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
    # The reply's reasoning, its call and the tool's result come back in harmony's own
    # channels, in order, ending where the model writes its next message.
    tokens = harmony.post("/tokenize", {**conv.request, "messages": history})[2]["tokens"]
    prompt = harmony.post("/detokenize", {"tokens": tokens})[2]["prompt"]
    assert prompt.endswith(
        "<|start|>user<|message|>What is the weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Use the weather tool.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>Sunny<|end|>"
        "<|start|>assistant"
    ), prompt
    status, _, result = harmony.post(CHAT, {**conv.request, "messages": history, "max_tokens": 20})
    assert status == 200, result


def test_an_auto_call_is_guided_to_its_schema(harmony, harmony_model):
    """Every token holding "}" biased away, the city at most five characters and no other
    key: unguided, the model cannot close its call's JSON; guided (tool_choice auto, from
    `to=functions.` on), the grammar allows only the close after "Paris", and the call is
    the trained one."""
    conv = HARMONY_BY_NAME["tool_call"]
    body = unclosable_call(conv.request, harmony_model)
    assert named_calls(harmony.post(CHAT, body)[2]) == conv.calls
    unguided = harmony.post(CHAT, {**body, "tool_call_grammar": "off"})[2]
    assert named_calls(unguided) != conv.calls, unguided
