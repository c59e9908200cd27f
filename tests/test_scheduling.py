"""Fair scheduling: prompts are processed a chunk per decode step, so running streams keep
going while a long prompt arrives; short prompts get their first token before long ones;
a full server says 503 with Retry-After; chunking changes no output."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from conversations import AGENT_REPLY, BY_NAME, CONVERSATIONS, HARMONY_CONVERSATIONS, LONG_ANSWER
from helpers.server import server_model
from helpers.streams import (
    ENDS,
    TimedStream,
    beside_a_stream,
    endless,
    endless_stream,
    tokens_and_message,
)

CHAT = "/v1/chat/completions"


def long_request(words: int, **extra) -> dict:
    """A prompt of about `words` tokens (the fixture tokenizer has a token per word)."""
    text = " ".join(["the"] * words)
    return {"messages": [{"role": "user", "content": text}], **extra}


def prompt_tokens(srv, body: dict) -> int:
    status, _, reply = srv.post(CHAT, {**body, "max_tokens": 1})
    assert status == 200, reply
    return reply["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("model_fixture", "conversations"),
    [("tiny_model", CONVERSATIONS), ("harmony_model", HARMONY_CONVERSATIONS)],
    ids=["qwen3", "gpt-oss"],
)
def test_chunked_prefill_gives_the_same_tokens(request, launch, model_fixture, conversations):
    """Prompts split into 8-token chunks across decode steps, batched beside a running
    stream, continuing from cached prefixes, give the tokens of unsplit prompts processed
    alone by a server without a prompt cache; so do seeded samples, a stop string and a
    long prompt split into 100 chunks."""
    model = request.getfixturevalue(model_fixture)
    whole = launch(model, "--prompt-cache-size", "0", "--prefill-chunk", "4096")
    chunked = launch(model, "--prefill-chunk", "8")  # prompt cache on: shared prefixes reused
    story = BY_NAME["story"].request
    seeded = {**story, "temperature": 1.5, "seed": 5, "max_tokens": 30}
    stopped = {**story, "stop": ["blue boat"]}
    jobs = [c.request for c in conversations] + [long_request(800, max_tokens=20), seeded]
    jobs += [stopped] if model_fixture == "tiny_model" else []
    alone = [tokens_and_message(whole, body, streamed=False) for body in jobs]
    together = beside_a_stream(
        chunked,
        model,
        ENDS[model_fixture],
        lambda i: tokens_and_message(chunked, jobs[i], streamed=i % 2 == 0),
        list(range(len(jobs))),
    )
    assert together == alone
    if model_fixture == "tiny_model":
        assert alone[-1][1]["content"] == LONG_ANSWER.split("blue boat")[0]


def test_running_streams_keep_decoding_while_a_long_prompt_is_processed(launch, tiny_model):
    """Each chunk of the new prompt is followed by a decode step of the running stream:
    it gets a token per chunk instead of pausing for the whole prompt."""
    srv = launch(tiny_model, "--prefill-chunk", "16", "--prompt-cache-size", "0")
    body = long_request(800, max_tokens=2)
    chunks = prompt_tokens(srv, body) // 16
    assert chunks >= 50
    running = TimedStream(srv, endless(tiny_model, max_tokens=4000))
    try:
        while len(running.data_times()) < 3:
            time.sleep(0.01)
        sent = time.monotonic()
        arriving = TimedStream(srv, body)
        arriving.wait()
        first = arriving.first_data()
        during = [t for t in running.data_times() if sent < t < first]
    finally:
        running.close()
    assert len(during) >= chunks - 3


def test_a_short_prompt_overtakes_a_long_one(launch, tiny_model):
    """A short request sent while a long prompt is being processed is answered first; the
    long one's client gets keepalive comments meanwhile."""
    srv = launch(
        tiny_model,
        "--prefill-chunk",
        "4",
        "--prompt-cache-size",
        "0",
        "--keepalive-seconds",
        "0.2",
    )
    clock = TimedStream(srv, endless(tiny_model, max_tokens=4000))
    try:
        long = TimedStream(srv, long_request(3000, max_tokens=2))
        ticks = len(clock.data_times())
        while len(clock.data_times()) < ticks + 5:  # the long prompt is being processed
            time.sleep(0.01)
        short = TimedStream(srv, BY_NAME["capital"].request)
        short.wait()
        long.wait()
    finally:
        clock.close()
    assert short.data_times()[-1] < long.first_data()
    assert any(line == ": keepalive" for t, line in long.lines if t < long.first_data())
    assert short.text() == BY_NAME["capital"].reply


def test_an_abandoned_long_prompt_stops_and_keeps_what_was_processed(launch, tiny_model):
    """A client that leaves while its prompt is split across steps stops the processing;
    the part processed so far is reused by the next request with that prompt."""
    srv = launch(tiny_model, "--prefill-chunk", "4", "--keepalive-seconds", "0.2")
    # Long enough that half a second of processing (about 1,000 tokens with OpenBLAS on
    # two cores) is far from all of it.
    body = long_request(4000, max_tokens=1)
    clock = endless_stream(srv, tiny_model, ENDS["tiny_model"])
    try:
        abandoned = TimedStream(srv, body)
        time.sleep(0.5)
        abandoned.close()
        time.sleep(0.5)
    finally:
        clock.close()
    status, _, reply = srv.post(CHAT, body)
    assert status == 200
    usage = reply["usage"]
    assert 0 < usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"] - 1000
    assert any("prompt processing" in line for line in srv.log)


def test_a_full_server_answers_503_with_retry_after(launch, agent_model):
    """One running and one waiting sequence fill a server with --max-concurrent 1 and
    --max-queue 1: a third request is refused at once, and served once room is back."""
    srv = launch(agent_model, "--max-concurrent", "1", "--max-queue", "1")
    model = server_model(srv)
    holders = [TimedStream(srv, endless(agent_model, max_tokens=130_000))]
    while not holders[0].data_times():
        time.sleep(0.01)
    holders.append(TimedStream(srv, endless(agent_model, max_tokens=130_000)))
    time.sleep(0.3)
    try:
        status, headers, reply = srv.post(CHAT, BY_NAME["capital"].request)
        assert status == 503
        assert headers["Retry-After"] == "1"
        assert reply == {
            "error": {
                "message": "The server is busy: 2 sequences are running or waiting "
                "(the limit is 2). Retry later.",
                "type": "server_error",
                "param": None,
                "code": "server_busy",
            }
        }
        client = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model=model, messages=BY_NAME["capital"].messages)
        assert refused.value.status_code == 503
    finally:
        for holder in holders:
            holder.close()
    patient = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=5)
    reply = patient.chat.completions.create(model=model, messages=BY_NAME["capital"].messages)
    assert reply.choices[0].message.content == AGENT_REPLY


def test_identical_prompts_arriving_together_are_processed_once(launch, tiny_model):
    """Clients sending one prompt at once share its processing (one progress line for the
    prompt, not one per client); each still gets its own sampling and token limit, and
    one of them leaving does not disturb the others."""
    whole = launch(tiny_model, "--prompt-cache-size", "0", "--prefill-chunk", "4096")
    srv = launch(
        tiny_model,
        "--prompt-cache-size",
        "0",
        "--prefill-chunk",
        "2",
        "--keepalive-seconds",
        "0.1",
    )
    prompt = long_request(1100)
    bodies = [
        {**prompt, "max_tokens": 3},
        {**prompt, "max_tokens": 12},
        {**prompt, "max_tokens": 12, "temperature": 1.5, "seed": 3},
    ]
    alone = [tokens_and_message(whole, body, streamed=False) for body in bodies]
    clock = endless_stream(srv, tiny_model, ENDS["tiny_model"])
    try:
        with ThreadPoolExecutor(len(bodies)) as pool:
            leaving = TimedStream(srv, {**prompt, "max_tokens": 12})  # at its first keepalive
            replies = [pool.submit(tokens_and_message, srv, body, True) for body in bodies]
            time.sleep(0.3)
            assert not leaving.data_times()  # it leaves while the prompt is processed
            leaving.close()
            together = [reply.result() for reply in replies]
    finally:
        clock.close()
    assert together == alone
    assert [len(tokens) for tokens, _ in together] == [3, 12, 12]
    assert sum("prompt processing 1024/" in line for line in srv.log) == 1
