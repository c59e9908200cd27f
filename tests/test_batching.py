"""Continuous batching: concurrent requests decode together and every one of them gets
exactly what it would get alone; abandoned requests leave the batch at once."""

from __future__ import annotations

import time

import pytest
from conversations import AGENT_REPLY, BY_NAME, CONVERSATIONS, HARMONY_CONVERSATIONS
from helpers.sse import open_stream, stream
from helpers.streams import ENDS, beside_a_stream, concurrently, endless, tokens_and_message

CHAT = "/v1/chat/completions"
LLAMA4_TOKENS = 40  # replies long enough to cross two of the fixture's 16-token chunks


@pytest.mark.parametrize(
    ("model_fixture", "conversations", "flags"),
    [
        ("tiny_model", CONVERSATIONS, ()),
        ("harmony_model", HARMONY_CONVERSATIONS, ()),
        ("wide_heads_model", CONVERSATIONS, ("--kv-bits", "4", "--kv-group-size", "32")),
    ],
    ids=["qwen3", "gpt-oss", "qwen3-kv4"],
)
def test_greedy_output_is_identical_alone_and_batched(
    request, launch, model_fixture, conversations, flags
):
    """Alone, then all at once beside a long-running stream (so every one joins a running
    batch), streamed and not: the same tokens and the same message every time. Also with
    a quantized KV cache, whose batched form is mlxserve's own."""
    model = request.getfixturevalue(model_fixture)
    srv = launch(model, "--prompt-cache-size", "0", *flags)
    alone = [tokens_and_message(srv, c.request, streamed=False) for c in conversations]
    assert all(tokens for tokens, _ in alone)
    jobs = [(c.request, i % 2 == 0) for i, c in enumerate(conversations)]
    batched = beside_a_stream(
        srv, model, ENDS[model_fixture], lambda job: tokens_and_message(srv, *job), jobs
    )
    assert batched == alone


def test_llama4_replies_in_a_batch_as_mlx_lm_generates_alone(launch, chunked_model):
    """Llama 4's chunked attention (16-token chunks in the fixture; its global layer's
    query scale grows with the position): prompts of four lengths join a running batch,
    each crossing chunk boundaries as it is read and as it replies, and each reply is
    mlx-lm's own generate's, one prompt at a time with its ChunkedKVCache."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(chunked_model))
    ends = sorted(tokenizer.eos_token_ids)
    forbid = mx.zeros((model.args.text_config.vocab_size,)).at[mx.array(ends)].add(-100.0)
    prompts = [list(range(40, 40 + 3 * n, 3)) for n in (5, 13, 21, 40)]

    def library(prompt: list[int]) -> str:
        steps = generate_step(
            mx.array(prompt),
            model,
            max_tokens=LLAMA4_TOKENS,
            logits_processors=[lambda _, x: x + forbid],
        )
        return tokenizer.decode([int(token) for token, _ in steps])

    expected = [library(p) for p in prompts]
    srv = launch(chunked_model, "--prompt-cache-size", "0")

    def served(prompt: list[int]) -> str:
        body = {
            "prompt": prompt,
            "max_tokens": LLAMA4_TOKENS,
            "temperature": 0,
            "logit_bias": {str(t): -100 for t in ends},
        }
        status, _, reply = srv.post("/v1/completions", body)
        assert status == 200, reply
        return reply["choices"][0]["text"]

    assert [served(p) for p in prompts] == expected
    assert beside_a_stream(srv, chunked_model, ENDS["chunked_model"], served, prompts) == expected
    assert not srv.log_lines("one request at a time")


def test_seeded_sampling_is_the_same_alone_and_batched(server):
    def sample(seed):
        body = {
            "messages": BY_NAME["story"].messages,
            "temperature": 1.5,
            "max_tokens": 25,
            "seed": seed,
        }
        status, _, reply = server.post(CHAT, body)
        assert status == 200, reply
        return reply["choices"][0]["message"]["content"]

    alone = [sample(seed) for seed in (1, 2, 3)]
    assert len(set(alone)) == 3  # different seeds, different texts
    batched = concurrently(sample, [1, 2, 3, None, None, 1])
    assert batched[:3] == alone and batched[5] == alone[0]


def test_n_choices_are_reproducible_and_the_first_matches_n_1(server):
    body = {
        "messages": BY_NAME["story"].messages,
        "temperature": 1.5,
        "max_tokens": 20,
        "seed": 7,
    }
    status, _, three = server.post(CHAT, {**body, "n": 3})
    assert status == 200
    texts = [c["message"]["content"] for c in three["choices"]]
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert len(set(texts)) == 3
    _, _, again = server.post(CHAT, {**body, "n": 3})
    assert [c["message"]["content"] for c in again["choices"]] == texts
    _, _, one = server.post(CHAT, body)
    assert one["choices"][0]["message"]["content"] == texts[0]
    assert three["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]


def test_streamed_n_choices_interleave_and_each_is_whole(server):
    body = {"messages": BY_NAME["capital"].messages, "n": 2}
    result = stream(server.url, CHAT, body)
    indices = [c["choices"][0]["index"] for c in result.chunks]
    assert set(indices) == {0, 1}
    for index in (0, 1):
        chunks = [c for c in result.chunks if c["choices"][0]["index"] == index]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        assert text == BY_NAME["capital"].reply


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "json"])
def test_a_disconnected_client_frees_its_slot(launch, agent_model, streamed):
    """Room for one sequence: an abandoned request of 130,000 tokens (the agent model's
    context is long) must leave at once, or the next request would wait for all of them."""
    single = launch(agent_model, "--max-concurrent", "1")
    body = {**endless(agent_model, max_tokens=130_000), "stream": streamed}
    conn, response = open_stream(single.url, CHAT, body) if streamed else _post_only(single, body)
    if streamed:
        response.readline()
    time.sleep(0.5)  # the job is running
    conn.close()
    status, _, reply = single.post(CHAT, BY_NAME["capital"].request, timeout=60)
    assert status == 200 and reply["choices"][0]["message"]["content"] == AGENT_REPLY


def _post_only(srv, body: dict):
    """Send a request without reading the reply."""
    import http.client
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(srv.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
    return conn, None


def test_n_choices_share_one_prefill_and_match_the_cached_path(launch, tiny_model, server):
    """With no prompt cache the n choices continue from one prefill of their prompt; the
    texts equal those of a server that takes the prompt from its cache."""
    fresh = launch(tiny_model, "--prompt-cache-size", "0")
    greedy = {"messages": BY_NAME["story"].messages, "max_tokens": 30, "n": 3}
    _, _, three = fresh.post(CHAT, greedy)
    _, _, one = fresh.post(CHAT, {**greedy, "n": 1})
    texts = {c["message"]["content"] for c in three["choices"]}
    assert texts == {one["choices"][0]["message"]["content"]}
    assert three["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]
    seeded = {**greedy, "temperature": 1.5, "seed": 11}
    server.post(CHAT, {**seeded, "n": 1})  # the prompt is now in the session server's cache
    results = [srv.post(CHAT, seeded)[2] for srv in (fresh, server)]
    texts = [[c["message"]["content"] for c in r["choices"]] for r in results]
    assert texts[0] == texts[1] and len(set(texts[0])) == 3
    assert results[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert results[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
