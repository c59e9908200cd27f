"""Hard limits: every request fits the model's context (a clear 400 before any prefill
otherwise, in each dialect's words), and the server's default output is clipped to fit."""

from __future__ import annotations

import anthropic
import pytest
from conversations import BY_NAME

CHAT = "/v1/chat/completions"
CONTEXT = 4096  # max_position_embeddings of the tiny chat model
STORY = BY_NAME["story"]


def long_messages(words: int) -> list[dict]:
    return [{"role": "user", "content": "lemon tree " * words}]


def openai_error(response) -> dict:
    status, _, body = response
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "context_length_exceeded"
    return body["error"]


def prompt_tokens(server, messages) -> int:
    status, _, body = server.post(CHAT, {"messages": messages, "max_tokens": 1})
    assert status == 200, body
    return body["usage"]["prompt_tokens"]


def test_a_prompt_over_the_context_is_refused(server):
    messages = long_messages(3000)  # about 6,000 tokens
    error = openai_error(server.post(CHAT, {"messages": messages}))
    assert error["param"] == "messages"
    assert f"maximum context length is {CONTEXT} tokens" in error["message"]
    counted = int(error["message"].split("your prompt is ")[1].split()[0])
    assert counted > CONTEXT


def test_max_tokens_beyond_the_room_left_is_refused(server):
    messages = long_messages(1000)
    used = prompt_tokens(server, messages)
    room = CONTEXT - used
    for field in ("max_tokens", "max_completion_tokens"):
        error = openai_error(server.post(CHAT, {"messages": messages, field: room + 1}))
        assert error["param"] == field
        expected = f"you requested {CONTEXT + 1} tokens ({used} in the prompt, {room + 1} "
        assert expected in error["message"]
    status, _, body = server.post(CHAT, {"messages": messages, "max_tokens": room})
    assert status == 200, body


def test_completions_check_their_prompt(server):
    error = openai_error(server.post("/v1/completions", {"prompt": "lemon tree " * 3000}))
    assert error["param"] == "prompt"
    ids = [42] * (CONTEXT - 10)
    error = openai_error(server.post("/v1/completions", {"prompt": ids, "max_tokens": 11}))
    assert error["param"] == "max_tokens"
    assert f"({CONTEXT - 10} in the prompt, 11 for the output)" in error["message"]


def test_the_default_output_is_clipped_to_the_context(launch, tiny_model):
    used = prompt_tokens(launch(tiny_model), STORY.messages)
    srv = launch(tiny_model, "--max-context", str(used + 7), "--max-tokens", "500")
    status, _, body = srv.post(CHAT, {"messages": STORY.messages})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 7
    assert STORY.reply.startswith(body["choices"][0]["message"]["content"])
    error = openai_error(srv.post(CHAT, {"messages": STORY.messages, "max_tokens": 8}))
    assert f"maximum context length is {used + 7} tokens" in error["message"]


@pytest.fixture
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


def test_anthropic_words_it_as_anthropic_does(server, claude):
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="default", max_tokens=10, messages=long_messages(3000))
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ")
    assert error["message"].endswith(f" tokens > {CONTEXT} maximum")

    messages = long_messages(1000)
    used = claude.messages.count_tokens(model="default", messages=messages).input_tokens
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="default", max_tokens=CONTEXT, messages=messages)
    assert refused.value.body["error"]["message"] == (
        "input length and `max_tokens` exceed context limit: "
        f"{used} + {CONTEXT} > {CONTEXT}, decrease input length or `max_tokens` and try again"
    )
