"""Every client mistake is a 4xx with the OpenAI error object, and the server stays up."""

from __future__ import annotations

import pytest
from conversations import BY_NAME
from helpers.errors import assert_error

CHAT = "/v1/chat/completions"
MESSAGES = BY_NAME["capital"].messages


@pytest.fixture(autouse=True)
def server_still_answers(server):
    yield
    status, _, body = server.post(CHAT, {"messages": MESSAGES})
    assert status == 200 and body["choices"][0]["message"]["content"] == BY_NAME["capital"].reply


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"\xff\xfe{}",
        b"[1, 2]",
        b"",
        b'"text"',
        b'{"messages": [{"role": "user", "content": "\\ud800 lone"}]}',
        b'{"prompt": "\\udfff"}',
        b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"seed": ' + b"9" * 5000 + b', "messages": []}',
    ],
    ids=[
        "malformed",
        "invalid-utf8",
        "array",
        "empty",
        "string",
        "surrogate",
        "surrogate-prompt",
        "nested-too-deeply",
        "integer-too-long",
    ],
)
def test_bodies_that_are_not_a_json_object(server, raw):
    assert_error(server.post(CHAT, raw), 400)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": "ten"}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_completion_tokens": -3}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"stop": 3}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": "x"}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        (
            {"repetition_penalty": 1.1, "repetition_context_size": 1 << 62},
            "repetition_context_size",
        ),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 500}}, "logit_bias.1"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"seed": "x"}, "seed"),
        ({"logprobs": 1}, "logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        ({"xtc_threshold": 0.9}, "xtc_threshold"),
        # OpenAI fields that would change the reply and are not served: never dropped
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"verbosity": "low"}, "verbosity"),
    ],
)
def test_invalid_chat_fields(server, extra, param):
    body = {"messages": MESSAGES, **extra}
    assert_error(server.post(CHAT, body), 400, param=param)


def test_the_text_modality_and_nulls_are_served(server):
    body = {"messages": MESSAGES, "modalities": ["text"], "audio": None, "web_search_options": None}
    body |= {"verbosity": "medium"}  # how the model writes
    status, _, reply = server.post(CHAT, body)
    assert status == 200 and reply["choices"][0]["message"]["content"] == BY_NAME["capital"].reply


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "hi", "logprobs": True}, "logprobs"),
        ({"prompt": "hi", "best_of": 2}, "best_of"),  # more candidates than n, ranked
        ({"prompt": "hi", "best_of": 1, "n": 2}, "best_of"),
    ],
)
def test_invalid_completion_fields(server, body, param):
    assert_error(server.post("/v1/completions", body), 400, param=param)


def test_best_of_as_many_as_n_is_served(server):
    status, _, reply = server.post("/v1/completions", {"prompt": "hi", "best_of": 2, "n": 2})
    assert status == 200 and len(reply["choices"]) == 2


def test_image_part_for_a_text_model(server):
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    response = server.post(CHAT, {"messages": [{"role": "user", "content": parts}]})
    assert_error(response, 400, param="messages[0].content[1]", code="images_not_supported")


def test_unknown_content_part(server):
    parts = [{"type": "audio", "data": "x"}]
    response = server.post(CHAT, {"messages": [{"role": "user", "content": parts}]})
    assert_error(response, 400, param="messages[0].content[0]")


def test_unknown_model(server):
    response = server.post(CHAT, {"model": "nobody/nothing", "messages": MESSAGES})
    assert_error(response, 404, param="model", code="model_not_found")
    response = server.post("/v1/completions", {"model": "gpt-4", "prompt": "hi"})
    assert_error(response, 404, param="model", code="model_not_found")


def test_a_nul_byte_in_a_name_is_a_client_mistake(server):
    response = server.post(CHAT, {"model": "bad\u0000name", "messages": MESSAGES})
    assert_error(response, 404, param="model", code="model_not_found")
    response = server.post(CHAT, {"model": "./bad\u0000name", "messages": MESSAGES})
    assert_error(response, 404, param="model", code="model_not_found")


def test_unknown_path_and_wrong_method(server):
    assert_error(server.post("/v1/nothing", {}), 404, code="unknown_url")
    assert_error(server.get("/v1/chat/completions"), 405, code="method_not_allowed")
    assert_error(server.post("/v1/models", {}), 405, code="method_not_allowed")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"function": {"name": "f", "parameters": {"properties": []}}}]},
            "tools[0].function.parameters",
        ),
        ({"chat_template_kwargs": {"tools": 5}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ],
)
def test_invalid_tools_and_template_kwargs(server, gemma, extra, param):
    for srv in (server, gemma):  # a template with tools, and one that gets them injected
        assert_error(srv.post(CHAT, {"messages": MESSAGES, **extra}), 400, param=param)


def nested(depth: int) -> dict:
    value: dict = {"type": "string"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"a": value}}
    return value


def deep_tool(depth: int) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": nested(depth)}}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (CHAT, {"messages": MESSAGES, "tools": [deep_tool(450)]}, "tools[0].function.parameters"),
        (
            "/v1/messages",
            {
                "model": "default",
                "max_tokens": 5,
                "messages": MESSAGES,
                "tools": [{"name": "f", "input_schema": nested(450)}],
            },
            "tools[0].input_schema.properties",
        ),
        (
            "/v1/responses",
            {
                "input": "Hi",
                "tools": [{"type": "function", "name": "f", "parameters": nested(450)}],
            },
            "tools[0].parameters.properties",
        ),
        (
            CHAT,
            {"messages": MESSAGES, "chat_template_kwargs": {"x": nested(450)}},
            "chat_template_kwargs.x.properties.a",
        ),
        (
            "/tokenize",
            {"messages": MESSAGES, "tools": [deep_tool(450)]},
            "tools[0].function.parameters",
        ),
        (
            CHAT,
            {
                "messages": MESSAGES,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": nested(450)},
                },
            },
            "response_format.json_schema.schema.properties",
        ),
    ],
)
def test_deep_nesting_is_a_400_naming_the_field(server, path, body, field):
    """Schemas and template arguments are walked recursively by the grammar compiler, the
    template engine and the validators: 900 levels would exhaust the stack there."""
    status, _, reply = server.post(path, body)
    assert status == 400, reply
    error = reply.get("error", {})
    message = error["message"] if isinstance(error, dict) else str(reply)
    assert field in message and "nests deeper than 64 levels" in message, reply
