"""Hard limits: every prompt fits the model's context (a clear 400 before any prefill
otherwise, in each dialect's words); max_tokens is a ceiling, clipped to the room the
context leaves, and a reply the context cut short says so in each dialect."""

from __future__ import annotations

import threading

import anthropic
import pytest
from conversations import BY_NAME
from helpers.server import start_server
from helpers.sse import open_stream, stream
from helpers.streams import endless

from mlxserve.units import GB, format_bytes

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


def test_completions_check_their_prompt(server):
    error = openai_error(server.post("/v1/completions", {"prompt": "lemon tree " * 3000}))
    assert error["param"] == "prompt"
    ids = [42] * CONTEXT
    error = openai_error(server.post("/v1/completions", {"prompt": ids, "max_tokens": 1}))
    assert error["param"] == "prompt"
    assert f"your prompt is {CONTEXT} tokens" in error["message"]


ROOM = 7  # tokens of output the short context leaves after the story prompt


@pytest.fixture(scope="module")
def short(server, tiny_model):
    """A server whose context holds the story prompt and ROOM tokens more."""
    used = prompt_tokens(server, STORY.messages)
    srv = start_server(tiny_model, "--max-context", str(used + ROOM), "--max-tokens", "500")
    yield srv
    srv.stop()


def test_the_default_output_is_clipped_to_the_context(short):
    status, _, body = short.post(CHAT, {"messages": STORY.messages})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == ROOM
    assert STORY.reply.startswith(body["choices"][0]["message"]["content"])


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_is_a_ceiling_not_a_reservation(short, field):
    """Claude Code asks for 128,000 output tokens whatever the model: a prompt that fits
    is served, and generation stops when the context is full."""
    for streamed in (False, True):
        request = {"messages": STORY.messages, field: 128000, "stream": streamed}
        if not streamed:
            status, _, body = short.post(CHAT, request)
            assert status == 200, body
            choice = body["choices"][0]
            text, finish = choice["message"]["content"], choice["finish_reason"]
            assert body["usage"]["completion_tokens"] == ROOM
        else:
            chunks = stream(short.url, CHAT, request).chunks
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            finish = chunks[-1]["choices"][0]["finish_reason"]
        assert finish == "length"
        assert text and STORY.reply.startswith(text)


def test_anthropic_says_the_context_window_ended_the_reply(short):
    request = {"model": "default", "messages": STORY.messages}
    # raw HTTP: the SDK insists on streaming for a max_tokens this large
    status, _, whole = short.post("/v1/messages", {**request, "max_tokens": 128000})
    assert status == 200, whole
    assert whole["stop_reason"] == "model_context_window_exceeded"
    assert whole["usage"]["output_tokens"] == ROOM
    claude = anthropic.Anthropic(base_url=short.url, api_key="none", max_retries=0)
    with claude.messages.stream(**request, max_tokens=128000) as streamed:
        final = streamed.get_final_message()
    assert final.stop_reason == "model_context_window_exceeded"
    assert final.content[0].text == whole["content"][0]["text"]
    # an output limit inside the room ends as max_tokens
    assert claude.messages.create(**request, max_tokens=ROOM - 2).stop_reason == "max_tokens"


def test_responses_end_incomplete_when_the_context_fills(short):
    request = {"input": STORY.messages, "max_output_tokens": 128000}
    status, _, body = short.post("/v1/responses", request)
    assert status == 200, body
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == ROOM


def test_a_prompt_that_fills_the_context_is_refused_in_each_dialect(short):
    messages = [{"role": "user", "content": STORY.messages[0]["content"] + " Once more."}]
    error = openai_error(short.post(CHAT, {"messages": messages * 4, "max_tokens": 1}))
    assert error["param"] == "messages"
    status, _, body = short.post("/v1/responses", {"input": messages * 4})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert body["error"]["param"] == "input"


@pytest.fixture
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


def test_anthropic_words_it_as_anthropic_does(server, claude):
    """Claude Code recognises Anthropic's wording and compacts its conversation."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="default", max_tokens=10, messages=long_messages(3000))
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ")
    assert error["message"].endswith(f" tokens > {CONTEXT} maximum")
    counted = int(error["message"].removeprefix("prompt is too long: ").split()[0])
    assert (
        counted
        == claude.messages.count_tokens(model="default", messages=long_messages(3000)).input_tokens
    )


# Memory: tiny-chat's weights take 0.96 MB and its KV cache 512 bytes a token, so a budget
# of 0.0025 GB (2.56 MB: a GB is 2**30 bytes) leaves about 1.6 MB: some 3,360 tokens of KV cache in all.
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
    assert any(f"Memory budget {format_bytes(int(0.0025 * GB))}" in line for line in srv.log)


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
    budget = format_bytes(int(0.0005 * GB))
    assert f"The memory budget ({budget}) does not hold the weights" in str(error.value)


def test_text_that_cannot_fit_is_refused_before_it_is_tokenized(server):
    """15 MB of text (no context holds it) to each place that tokenizes: refused from its
    length, in each dialect's words, and the server's memory stays where it was
    (tokenized, it took seconds and gigabytes, most never given back)."""
    import psutil

    huge = "lemon tree " * 1_400_000  # 15 MB
    process = psutil.Process(server.process.pid)
    before = process.memory_info().rss
    error = openai_error(server.post(CHAT, {"messages": [{"role": "user", "content": huge}]}))
    assert error["param"] == "messages" and "prompt is at least " in error["message"]
    error = openai_error(server.post("/tokenize", {"prompt": huge}))
    assert error["param"] == "prompt"
    error = openai_error(server.post("/v1/completions", {"prompt": huge}))
    assert error["param"] == "prompt"
    status, _, body = server.post(
        "/v1/messages/count_tokens",
        {"model": "default", "messages": [{"role": "user", "content": huge}]},
    )
    assert status == 400 and body["error"]["message"].startswith("prompt is too long: ")
    assert body["error"]["message"].endswith(f" tokens > {CONTEXT} maximum")
    assert process.memory_info().rss - before < 200 * 1024 * 1024
