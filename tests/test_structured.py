"""Structured output: response_format, vLLM's guided_* fields and a forced tool_choice are
enforced while decoding. The fixture models answer in fixed prose, so every JSON reply
below exists only because the grammar made it."""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Annotated

import jsonschema
import openai
import pytest
from conversations import BY_NAME, HARMONY_BY_NAME, WEATHER_TOOL
from helpers.server import server_model
from helpers.speculation import DRAFT_ALWAYS
from helpers.streams import concurrently, tokens_and_message
from helpers.structured import NO_THINKING, SCHEMAS, assert_valid, constrained, schema_format

from mlxserve.structured.lark import MAX_CHOICES

CHAT = "/v1/chat/completions"

TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {
                "zone": {"enum": ["UTC", "CET", "JST"]},
                "hour24": {"type": "boolean"},
            },
            "required": ["zone", "hour24"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]
# The fixture knows no city names in these formats: a bounded one makes the call end.
SHORT_CITY = {"type": "string", "maxLength": 12}
BOUNDED_WEATHER_TOOL = {
    "type": "function",
    "function": {
        **WEATHER_TOOL["function"],
        "parameters": {
            **WEATHER_TOOL["function"]["parameters"],
            "properties": {"city": SHORT_CITY},
        },
    },
}
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def test_unconstrained_replies_are_prose(server):
    """The premise of every other test here."""
    for name in ("capital", "count", "story"):
        _, _, reply = server.post(CHAT, {**BY_NAME[name].request, "max_tokens": 40})
        with pytest.raises(json.JSONDecodeError):
            json.loads(reply["choices"][0]["message"]["content"])


@pytest.mark.parametrize("schema", list(SCHEMAS))
@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_json_schema_replies_validate(family, schema, streamed):
    for conversation in ("capital", "story"):
        body = constrained(conversation, schema, **NO_THINKING)
        tokens, message = tokens_and_message(family, body, streamed)
        assert_valid(message["content"], SCHEMAS[schema])
        assert len(tokens) < 200  # the reply ended: it was not cut off by max_tokens


def test_six_constrained_requests_at_once_match_each_alone(launch, tiny_model):
    """Constrained requests batched together (and beside an unconstrained one, which keeps
    its own answer) give exactly what each gives alone."""
    srv = launch(tiny_model, "--prompt-cache-size", "0")
    bodies = [constrained(c, s) for c in ("capital", "count") for s in list(SCHEMAS)[:3]]
    bodies.append(BY_NAME["capital"].request)
    alone = [tokens_and_message(srv, body, streamed=False) for body in bodies]
    together = concurrently(
        lambda i: tokens_and_message(srv, bodies[i], streamed=i % 2 == 1), list(range(len(bodies)))
    )
    assert together == alone
    for body, (_, message) in zip(bodies[:-1], together[:-1], strict=True):
        assert_valid(message["content"], body["response_format"]["json_schema"]["schema"])
    assert together[-1][1]["content"] == BY_NAME["capital"].reply


def test_n_sampled_choices_each_validate(server):
    body = constrained("story", "refs", n=3, temperature=1.0, seed=4)
    status, _, reply = server.post(CHAT, body)
    assert status == 200, reply
    contents = [choice["message"]["content"] for choice in reply["choices"]]
    assert len(set(contents)) == 3
    for content in contents:
        assert_valid(content, SCHEMAS["refs"])


def test_json_object(server):
    """(Byte-level only: the other families' fixtures, free to write any object, write
    `{"city": "Paris` and then ramble inside the string until max_tokens.)"""
    body = {**BY_NAME["think"].request, "response_format": {"type": "json_object"}}
    status, _, reply = server.post(CHAT, {**body, "max_tokens": 400})
    assert status == 200, reply
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(reply["choices"][0]["message"]["content"]), dict)


def test_guided_choice_and_regex_at_top_level_and_in_extra_body(family):
    """With thinking turned off in the template, the reply is the constrained answer."""
    request = {
        "messages": BY_NAME["capital"].messages,
        **NO_THINKING,
    }
    options = ["Lyon", "Marseille", "Nice"]
    for body in ({"guided_choice": options}, {"extra_body": {"guided_choice": options}}):
        _, _, reply = family.post(CHAT, {**request, **body})
        assert reply["choices"][0]["message"]["content"] in options
    pattern = r"[A-Z][a-z]{3,6} is [0-9]{2}\."
    for body in ({"guided_regex": pattern}, {"extra_body": {"guided_regex": pattern}}):
        _, _, reply = family.post(CHAT, {**request, **body})
        assert re.fullmatch(pattern, reply["choices"][0]["message"]["content"])


def test_a_model_that_may_think_first_can_still_think(server):
    """Without a think block in the prompt the grammar lets the model open one; here the
    fixture, given options it finds unlikely, thinks instead of answering at once."""
    body = {**BY_NAME["capital"].request, "guided_choice": ["Lyon", "Nice"], "max_tokens": 30}
    _, _, reply = server.post(CHAT, body)
    message = reply["choices"][0]["message"]
    assert message["reasoning_content"] and "<think>" not in message["content"]


def test_guided_json_as_a_string(server):
    schema = SCHEMAS["enum_and_range"]
    body = {**BY_NAME["capital"].request, "guided_json": json.dumps(schema)}
    _, _, reply = server.post(CHAT, body)
    assert_valid(reply["choices"][0]["message"]["content"], schema)


def test_logprobs_leave_out_the_tokens_the_grammar_forbids(server):
    """They have logprob -inf, which JSON cannot carry; the allowed ones stay."""
    body = {"prompt": "Hi", "guided_choice": ["yes", "no"], "logprobs": 3}
    _, _, reply = server.post("/v1/completions", body)
    tops = reply["choices"][0]["logprobs"]["top_logprobs"]
    assert reply["choices"][0]["text"] in ("yes", "no")
    assert all(math.isfinite(v) for top in tops for v in top.values())
    assert set(tops[0]) == {"y", "n"}


def test_text_completions_are_constrained_too(family):
    body = {"prompt": "Once upon a time", "max_tokens": 50}
    _, _, reply = family.post("/v1/completions", {**body, "guided_choice": ["yes", "no"]})
    assert reply["choices"][0]["text"] in ("yes", "no")
    _, _, reply = family.post(
        "/v1/completions", {**body, "max_tokens": 200, "response_format": schema_format("refs")}
    )
    assert_valid(reply["choices"][0]["text"], SCHEMAS["refs"])


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_the_constraint_starts_after_the_reasoning(server, streamed):
    """The model thinks as it always does; only the answer after </think> is JSON."""
    _, message = tokens_and_message(server, constrained("think", "enum_and_range"), streamed)
    assert message["reasoning_content"] == BY_NAME["think"].reasoning
    assert "<think>" not in message["content"] and "</think>" not in message["content"]
    assert_valid(message["content"], SCHEMAS["enum_and_range"])


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_harmony_final_channel_is_constrained(harmony, streamed):
    conversation = HARMONY_BY_NAME["capital"]
    body = {**conversation.request, "response_format": schema_format("nested"), "max_tokens": 200}
    _, message = tokens_and_message(harmony, body, streamed)
    assert message["reasoning_content"] == conversation.reasoning
    assert_valid(message["content"], SCHEMAS["nested"])


def assert_forced_calls(message: dict, allowed: set[str]) -> None:
    assert message["content"] is None
    assert message["tool_calls"]
    for call in message["tool_calls"]:
        name = call["function"]["name"]
        assert name in allowed
        arguments = json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, PARAMETERS[name])
        assert set(arguments) <= set(PARAMETERS[name]["properties"])  # none made up


def assert_required_and_named_calls(srv, body: dict, name: str) -> None:
    """tool_choice "required" gives calls to the body's tools; naming one gives it."""
    for streamed in (False, True):
        _, message = tokens_and_message(srv, {**body, "tool_choice": "required"}, streamed)
        assert_forced_calls(message, {t["function"]["name"] for t in body["tools"]})
        named = {"type": "function", "function": {"name": name}}
        _, message = tokens_and_message(srv, {**body, "tool_choice": named}, streamed)
        assert_forced_calls(message, {name})


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_tool_choice_required_and_named_force_a_valid_call(family, streamed):
    """The question has nothing to do with tools: the model would answer in prose. (The
    city is bounded: some families' fixtures, forced to name one, write a word forever.)"""
    tools = [BOUNDED_WEATHER_TOOL, TIME_TOOL]
    base = {**BY_NAME["capital"].request, "tools": tools, "max_tokens": 200}
    _, message = tokens_and_message(family, {**base, "tool_choice": "required"}, streamed)
    assert_forced_calls(message, {"get_weather", "get_time"})
    named = {"type": "function", "function": {"name": "get_time"}}
    _, message = tokens_and_message(family, {**base, "tool_choice": named}, streamed)
    assert_forced_calls(message, {"get_time"})


@pytest.mark.parametrize(
    "tool_format", ["mistral", "kimi_k2", "qwen3_coder", "pythonic", "gemma4", "minimax_m2"]
)
def test_forced_calls_in_other_formats(launch, tiny_model, tool_format):
    """Served as if the model wrote these formats (--tool-parser): the forced calls are
    written in them and the post-processor reads them back. (Thinking is off: the fixture,
    finding these markers unlikely, would otherwise think first until max_tokens.)"""
    srv = launch(tiny_model, "--tool-parser", tool_format)
    body = {
        **BY_NAME["capital"].request,
        "tools": [BOUNDED_WEATHER_TOOL, TIME_TOOL],
        "max_tokens": 200,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert_required_and_named_calls(srv, body, "get_weather")


def test_forced_tool_call_finishes_with_tool_calls_in_the_sdk(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="none")
    reply = client.chat.completions.create(
        model=server_model(server),
        messages=BY_NAME["count"].messages,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS["get_weather"])


def test_harmony_forced_tool_call(harmony):
    conversation = HARMONY_BY_NAME["capital"]
    named = {"type": "function", "function": {"name": "get_time"}}
    body = {**conversation.request, "tools": TOOLS, "tool_choice": named, "max_tokens": 200}
    status, _, reply = harmony.post(CHAT, body)
    assert status == 200, reply
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    assert_forced_calls(reply["choices"][0]["message"], {"get_time"})


def test_sdk_parse_returns_the_pydantic_object(server):
    """`client.chat.completions.parse` sends a strict schema made from a pydantic model."""
    from pydantic import BaseModel, Field

    class Answer(BaseModel):
        verdict: bool
        score: int = Field(ge=1, le=9)
        tags: list[Annotated[str, Field(max_length=8)]] = Field(max_length=2)

    client = openai.OpenAI(base_url=server.base_url, api_key="none")
    reply = client.chat.completions.parse(
        model=server_model(server),
        messages=BY_NAME["capital"].messages,
        response_format=Answer,
        max_tokens=300,
    )
    assert isinstance(reply.choices[0].message.parsed, Answer)
    choice = client.chat.completions.create(
        model=server_model(server),
        messages=BY_NAME["capital"].messages,
        extra_body={"guided_choice": ["Paris", "Rome"]},
    ).choices[0]
    assert choice.message.content in ("Paris", "Rome")


UNENFORCEABLE = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "strin"}},
            }
        },
        "response_format.json_schema.schema",
        "Invalid type: strin",
    ),
    (
        {"guided_json": {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}},
        "guided_json",
        'Unimplemented keys: ["if", "then"]',
    ),
    ({"guided_regex": "(?=a)b"}, "guided_regex", "look-around"),
    (
        {"response_format": {"type": "json_object"}, "guided_choice": ["a"]},
        "guided_choice",
        "Only one constraint may be given",
    ),
    ({"guided_json": "{not json"}, "guided_json", "is not valid JSON"),
    (
        {"response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        "needs a 'json_schema'",
    ),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice requires tools"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}},
        "tool_choice",
        "'fly', which is not among the tools",
    ),
    (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
        "cannot be combined",
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "not": {}}},
                }
            ],
            "tool_choice": "required",
        },
        "tools",
        'Unimplemented keys: ["not"]',
    ),
    # 100,000 options took 12 s to fail with a panic's backtrace in the message.
    (
        {"guided_choice": [f"option {i}" for i in range(MAX_CHOICES + 1)]},
        "guided_choice",
        f"List should have at most {MAX_CHOICES} items",
    ),
    # Nesting beyond the engine's recursion limit is its 400, not a crash.
    (
        {
            "guided_json": functools.reduce(
                lambda inner, _: {"type": "array", "items": inner}, range(200), {}
            )
        },
        "guided_json.items.items.items",  # the edge's nesting limit names it first
        "nests deeper than 64 levels",
    ),
]


@pytest.mark.parametrize(("extra", "param", "message"), UNENFORCEABLE)
def test_what_cannot_be_enforced_is_a_400(server, extra, param, message):
    status, _, reply = server.post(CHAT, {**BY_NAME["capital"].request, **extra})
    assert status == 400, reply
    assert reply["error"]["param"] == param
    assert reply["error"]["type"] == "invalid_request_error"
    assert message in reply["error"]["message"]


def test_injected_tools_are_forced_as_tool_code_calls(gemma):
    """Tools injected into a template without tool support are called in ```tool_code
    blocks of Python; the forced call is written there, its values in JSON."""
    body = {
        "messages": BY_NAME["capital"].messages,
        "tools": [BOUNDED_WEATHER_TOOL, TIME_TOOL],
        "max_tokens": 200,
    }
    assert_required_and_named_calls(gemma, body, "get_time")


def test_a_draft_model_server_serves_constraints(launch, tiny_model):
    """A constrained row drafts, its guesses and their verification under its grammar,
    as the rows beside it do (test_speculation checks the tokens against a server without
    the draft model)."""
    srv = launch(tiny_model, "--draft-model", str(tiny_model), *DRAFT_ALWAYS)
    choices = ["Rome", "Paris"]
    body = {**BY_NAME["capital"].request, "guided_choice": choices, **NO_THINKING}
    status, _, reply = srv.post(CHAT, body)
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] in choices
    status, _, reply = srv.post(CHAT, BY_NAME["capital"].request)
    assert reply["choices"][0]["message"]["content"] == BY_NAME["capital"].reply
