"""Structured output that ends: served by tiny-looper (looper_fixture.py), a model on each
tokenizer family that, under a grammar, writes a number for as long as it may, opens
every key and item it may, and ends nothing it is not made to. Every schema whose strings
it can close must still give valid JSON that ends before max_tokens: strict objects are
closed, and numbers hold no more than an int64 or a float64."""

from __future__ import annotations

import json
import math
import re

import anthropic
import jsonschema
import openai
import pytest
from catalog import looper_model
from helpers.server import server_model, start_server
from helpers.streams import tokens_and_message

CHAT = "/v1/chat/completions"
MAX_TOKENS = 300
INT64 = (-(2**63), 2**63 - 1)
FLOAT = re.compile(r"-?(?P<int>\d+)(?:\.(?P<frac>\d+))?(?:[eE][+-]?(?P<exp>\d+))?")

SHAPES = {
    "open_object": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
        },
        "required": ["ok", "tags"],
    },
    "closed_object": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    },
    "optional_keys": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "string", "maxLength": 3}},
    },
    "integer": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    "bounded_integer": {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 120}},
        "required": ["n"],
    },
    "number": {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "number"}}, "required": ["b"]}
        },
        "required": ["a"],
    },
    "bounded_number": {
        "type": "object",
        "properties": {"t": {"type": "number", "minimum": -50, "maximum": 50}},
        "required": ["t"],
    },
    "array_of_numbers": {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "number"}, "maxItems": 3}},
        "required": ["xs"],
    },
    "array_of_integers": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
}
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module", params=["byte_level", "metaspace", "sentencepiece", "tiktoken"])
def looper(request):
    srv = start_server(looper_model(request.param), "--trust-remote-code")
    yield srv
    srv.stop()


def strict_format(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}


def bounded(text: str):
    """The JSON `text` parsed, each of its numbers checked against the bounds as written."""

    def integer(literal: str) -> int:
        assert INT64[0] <= int(literal) <= INT64[1], literal
        return int(literal)

    def number(literal: str) -> float:
        parts = FLOAT.fullmatch(literal)
        assert parts is not None, literal
        significant = (parts["int"] + (parts["frac"] or "")).lstrip("0")
        assert len(significant) <= 17, literal
        assert parts["exp"] is None or len(parts["exp"]) <= 3, literal
        assert math.isfinite(float(literal)), literal
        return float(literal)

    return json.loads(text, parse_int=integer, parse_float=number)


def ask(srv, body: dict) -> tuple[str, str, int]:
    """(content, finish_reason, completion tokens); the streamed answer is the same."""
    status, _, reply = srv.post(CHAT, body)
    assert status == 200, reply
    choice = reply["choices"][0]
    _, streamed = tokens_and_message(srv, body, streamed=True)
    assert streamed["content"] == choice["message"]["content"]
    usage = reply["usage"]["completion_tokens"]
    return choice["message"]["content"], choice["finish_reason"], usage


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_strict_shape_ends_in_valid_json(looper, shape):
    body = {
        "messages": MESSAGES,
        "response_format": strict_format(SHAPES[shape]),
        "max_tokens": MAX_TOKENS,
        **NO_THINKING,
    }
    content, finish, used = ask(looper, body)
    assert finish == "stop" and used < MAX_TOKENS, content
    jsonschema.validate(bounded(content), SHAPES[shape])


def test_the_looper_writes_numbers_to_their_bounds(looper):
    """What the bounds leave a model that wants digits forever: an int64's 18 nines (19
    would pass 9223372036854775807), a float's 17 significant digits then the exponent
    that keeps it finite."""
    answers = {}
    for shape in ("integer", "number", "bounded_number"):
        body = {"messages": MESSAGES, "response_format": strict_format(SHAPES[shape])}
        _, _, reply = looper.post(CHAT, {**body, **NO_THINKING, "max_tokens": MAX_TOKENS})
        answers[shape] = reply["choices"][0]["message"]["content"]
    assert answers == {
        "integer": '{"n": 999999999999999999}',
        "number": '{"a": {"b": 99999999999999999e99}}',
        "bounded_number": '{"t": 9.9999999999999999}',
    }


def test_without_strict_an_object_stays_open(looper):
    """JSON Schema's own reading: the model may add keys (and this one does, forever)."""
    body = {
        "messages": MESSAGES,
        "response_format": strict_format(SHAPES["integer"], strict=False),
        "max_tokens": 60,
        **NO_THINKING,
    }
    _, _, reply = looper.post(CHAT, body)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].startswith('{"n": 999999999999999999, "')


def test_responses_json_schema_answers_parse(looper):
    client = openai.OpenAI(base_url=looper.base_url, api_key="none")
    for strict in (True, False):
        response = client.responses.create(
            model=server_model(looper),
            input="What is the weather?",
            text={
                "format": {
                    "type": "json_schema",
                    "name": "weather",
                    "schema": {
                        "type": "object",
                        "properties": {
                            "sky": {"enum": ["sunny", "cloudy"]},
                            "temp_c": {"type": "number"},
                        },
                        "required": ["sky", "temp_c"],
                        "additionalProperties": False,
                    },
                    "strict": strict,
                }
            },
            max_output_tokens=MAX_TOKENS,
            extra_body=NO_THINKING,
        )
        assert response.status == "completed"
        assert bounded(response.output_text)["sky"] in ("sunny", "cloudy")


STRICT_TOOL = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "description": "Set an alarm.",
        "parameters": {
            "type": "object",
            "properties": {
                "when": {
                    "type": "object",
                    "properties": {"hour": {"type": "integer"}, "minute": {"type": "number"}},
                },
            },
            "required": ["when"],
        },
        "strict": True,
    },
}


def test_a_forced_strict_tool_call_is_closed_and_bounded(looper):
    body = {
        "messages": MESSAGES,
        "tools": [STRICT_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": MAX_TOKENS,
        **NO_THINKING,
    }
    for streamed in (False, True):
        _, message = tokens_and_message(looper, body, streamed)
        (call,) = message["tool_calls"]
        arguments = bounded(call["function"]["arguments"])
        jsonschema.validate(arguments, STRICT_TOOL["function"]["parameters"])
        assert set(arguments["when"]) <= {"hour", "minute"}  # nothing made up inside


def test_anthropic_forced_tool_and_json_output_end(looper):
    client = anthropic.Anthropic(base_url=looper.url, api_key="none")
    function = STRICT_TOOL["function"]
    tool = {
        "name": function["name"],
        "description": function["description"],
        "input_schema": function["parameters"],
        "strict": True,
    }
    reply = client.messages.create(
        model=server_model(looper),
        max_tokens=MAX_TOKENS,
        messages=MESSAGES,
        tools=[tool],
        tool_choice={"type": "tool", "name": "set_alarm", "disable_parallel_tool_use": True},
        extra_body={"thinking": {"type": "disabled"}},
    )
    assert reply.stop_reason == "tool_use"
    (block,) = reply.content
    bounded(json.dumps(block.input))
    assert set(block.input["when"]) <= {"hour", "minute"}
    reply = client.messages.create(
        model=server_model(looper),
        max_tokens=MAX_TOKENS,
        messages=MESSAGES,
        output_config={"format": {"type": "json_schema", "schema": SHAPES["number"]}},
        extra_body={"thinking": {"type": "disabled"}},
    )
    assert reply.stop_reason == "end_turn"
    (text,) = reply.content
    jsonschema.validate(bounded(text.text), SHAPES["number"])
