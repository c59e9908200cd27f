"""Tool calls under `tool_choice: "auto"` follow their tool's schema once the model opens
one (--tool-call-grammar auto, the default): on tiny-rambler (random weights, sampled at
temperature 1: a lost model's noise) with a logit bias pushing the call opening, every
reply is calls that parse, name a tool of the request and validate against its schema
(nested objects, arrays, enums, bounded numbers, optional fields, strict); with the guiding
off, per request or for the server, the same replies do not. Served in each format whose
opening is tiny-rambler's special `<tool_call>` token (hermes JSON, Qwen3-Coder, GLM-4.7),
streamed and whole. A reply that calls nothing is the unguided one token for token. A call
that cannot be read comes back as text, and the request's log line counts it."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conversations import BY_NAME
from helpers.server import CHAT
from helpers.sse import stream
from helpers.tools import TRIP, TRIP_ARGUMENTS, named_calls, unclosable_call

CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [TRIP, CLOCK]
SCHEMAS = {"plan_trip": TRIP_ARGUMENTS, "get_time": CLOCK["function"]["parameters"]}
OPENING = "<tool_call>"  # a special token of tiny-chat's tokenizer (and tiny-rambler's)
SAMPLES = 20


@pytest.fixture(scope="module")
def rambler(launch_module, rambler_model):
    return launch_module(rambler_model)


def body(opening: int, **extra) -> dict:
    return {
        "messages": [{"role": "user", "content": "Plan me a trip, or tell me the time."}],
        "tools": TOOLS,
        "temperature": 1.0,
        "max_tokens": 400,
        "logit_bias": {str(opening): 100},
        "parallel_tool_calls": False,
        **extra,
    }


@pytest.fixture(scope="module")
def tokenizer(rambler_model):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(rambler_model)


@pytest.fixture(scope="module")
def opening(tokenizer) -> int:
    (token,) = tokenizer.encode(OPENING, add_special_tokens=False)
    return token


def valid(message: dict) -> bool:
    """Whether the reply is calls alone, each to a tool of the request with arguments
    its schema accepts."""
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        return False
    for call in calls:
        schema = SCHEMAS.get(call["function"]["name"])
        try:
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        except (TypeError, json.JSONDecodeError, jsonschema.ValidationError):
            return False
    return True


def test_every_sampled_call_is_valid_and_unguided_ones_are_not(rambler, opening):
    replies = []
    for guided in (True, False):
        messages = []
        for _ in range(SAMPLES):
            extra = {} if guided else {"tool_call_grammar": "off"}
            status, _, reply = rambler.post(CHAT, body(opening, **extra))
            assert status == 200, reply
            messages.append(reply["choices"][0])
        replies.append(messages)
    guided, unguided = replies
    assert all(valid(c["message"]) for c in guided), [c["message"] for c in guided]
    assert {c["finish_reason"] for c in guided} == {"tool_calls"}
    # the calls are samples, not one call repeated
    assert len({json.dumps(c["message"]["tool_calls"][0]["function"]) for c in guided}) > 10
    assert sum(valid(c["message"]) for c in unguided) < SAMPLES // 4, unguided
    unparsed = [c for c in unguided if OPENING in (c["message"]["content"] or "")]
    assert unparsed  # an unreadable call comes back as text...
    assert rambler.log_lines("unparsed_calls=1")  # ...and the log line says so


def test_streamed_calls_are_valid_and_stream_as_written(rambler, opening):
    for _ in range(4):
        chunks = stream(rambler.url, CHAT, body(opening)).chunks
        deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
        pieces = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
        assert len(pieces) > 2  # the arguments arrive in more than one piece
        (name,) = [p["function"]["name"] for p in pieces if p["function"].get("name")]
        arguments = "".join(p["function"].get("arguments") or "" for p in pieces)
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        assert not any(d.get("content") for d in deltas)


def test_parallel_calls_are_each_valid(rambler, opening, tokenizer):
    """A slight bias on the newline that separates two calls makes a second call likely."""
    (newline,) = tokenizer.encode("\n", add_special_tokens=False)
    counts = []
    for _ in range(12):
        more = body(opening, parallel_tool_calls=True, max_tokens=1200)
        more["logit_bias"][str(newline)] = 3
        status, _, reply = rambler.post(CHAT, more)
        assert status == 200, reply
        choice = reply["choices"][0]
        if choice["finish_reason"] == "length":
            continue  # the calls went on past the token limit: the last one is cut
        assert valid(choice["message"]), choice
        counts.append(len(choice["message"]["tool_calls"]))
    assert max(counts) > 1, counts


def test_the_setting_turns_the_guiding_off(launch, rambler_model, opening):
    server = launch(rambler_model, "--tool-call-grammar", "off")
    replies = [server.post(CHAT, body(opening))[2]["choices"][0] for _ in range(SAMPLES)]
    assert sum(valid(c["message"]) for c in replies) < SAMPLES // 4


@pytest.mark.parametrize("tool_format", ["qwen3_coder", "glm47"])
def test_other_formats_opening_with_the_same_token(launch, rambler_model, opening, tool_format):
    server = launch(rambler_model, "--tool-parser", tool_format)
    for _ in range(8):
        status, _, reply = server.post(CHAT, body(opening))
        assert status == 200, reply
        assert valid(reply["choices"][0]["message"]), reply


def test_a_trained_call_is_guided_where_the_model_would_not_close_it(server, tiny_model):
    """tiny-chat's trained call, every token holding "}" biased away and the city at most
    five characters, no other key: unguided, the model cannot close its JSON; guided, the
    grammar allows only the close after "Paris", and the call is the trained one."""
    conv = BY_NAME["tool_call"]
    body = unclosable_call(conv.request, tiny_model)
    assert named_calls(server.post(CHAT, body)[2]) == conv.calls
    unguided = server.post(CHAT, {**body, "tool_call_grammar": "off"})[2]
    assert named_calls(unguided) != conv.calls, unguided


@pytest.mark.parametrize("stream_reply", [False, True], ids=["whole", "streamed"])
def test_a_text_answer_is_the_unguided_one_token_for_token(rambler, stream_reply):
    """Greedy, tools offered, no call opened: the guide changes nothing it does not mask."""
    request = {
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "tools": TOOLS,
        "temperature": 0.0,
        "max_tokens": 64,
        "logprobs": True,
    }

    def tokens(extra: dict) -> list[str]:
        if not stream_reply:
            reply = rambler.post(CHAT, {**request, **extra})[2]
            assert not reply["choices"][0]["message"].get("tool_calls"), reply
            return [t["token"] for t in reply["choices"][0]["logprobs"]["content"]]
        chunks = stream(rambler.url, CHAT, {**request, **extra}).chunks
        choices = [c["choices"][0] for c in chunks if c.get("choices")]
        assert not any(c["delta"].get("tool_calls") for c in choices)
        return [t["token"] for c in choices for t in (c.get("logprobs") or {}).get("content") or []]

    guided = tokens({})
    assert len(guided) == 64
    assert guided == tokens({"tool_call_grammar": "off"})
