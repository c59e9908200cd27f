"""Hard limits: every request fits the model's context (a clear 400 before any prefill
otherwise, in each dialect's words), and the server's default output is clipped to fit."""

from __future__ import annotations

import threading

import anthropic
import pytest
from conftest import start_server
from conversations import BY_NAME
from sse import open_stream
from test_http import endless

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


# Memory: tiny-chat's weights take 0.96 MB and its KV cache 512 bytes a token, so a budget
# of 0.0025 GB (2.68 MB) leaves about 1.72 MB: some 3,360 tokens of KV cache in all.
BUDGET = ("--memory-budget-gb", "0.0025")


def memory_error(response) -> dict:
    status, _, body = response
    assert status == 400, body
    assert body["error"]["code"] == "insufficient_memory"
    return body["error"]


def test_a_request_that_could_never_fit_the_memory_budget_is_refused(launch, tiny_model):
    srv = launch(tiny_model, *BUDGET)
    request = BY_NAME["capital"].request
    error = memory_error(srv.post(CHAT, {**request, "max_tokens": 3500}))
    assert error["param"] == "max_tokens"
    assert "3500 max_tokens" in error["message"] and "memory budget" in error["message"]
    # n sequences take n KV caches
    error = memory_error(srv.post(CHAT, {**request, "max_tokens": 1700, "n": 2}))
    assert "2 x (" in error["message"]
    status, _, body = srv.post(CHAT, {**request, "max_tokens": 1700})
    assert status == 200 and body["choices"][0]["message"]["content"] == BY_NAME["capital"].reply
    assert any("Memory budget 0.00 GB" in line for line in srv.log)


def test_a_request_that_does_not_fit_now_waits_for_memory(launch, tiny_model):
    """Each request fits alone; two at once would not: the second waits for the first."""
    srv = launch(tiny_model, *BUDGET, "--keepalive-seconds", "0.5")
    conn, response = open_stream(
        srv.url, CHAT, {**endless(tiny_model, max_tokens=3000), "stream": True}
    )
    response.readline()  # the first is decoding
    second: list = []
    waiting = threading.Thread(
        target=lambda: second.append(
            srv.post(CHAT, {**BY_NAME["capital"].request, "max_tokens": 1000})
        )
    )
    waiting.start()
    waiting.join(timeout=1.5)
    assert waiting.is_alive(), second  # not answered while the first holds the memory
    conn.close()
    waiting.join(timeout=30)
    status, _, body = second[0]
    assert status == 200 and body["choices"][0]["message"]["content"] == BY_NAME["capital"].reply


def test_a_budget_smaller_than_the_weights_is_a_clear_start_up_error(tiny_model):
    with pytest.raises(RuntimeError) as error:
        start_server(tiny_model, "--memory-budget-gb", "0.0005")
    assert "The memory budget (0.00 GB) does not hold the weights" in str(error.value)
