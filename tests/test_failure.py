"""A failure inside the generation loop: the requests in flight get a 500 server_error
with the message, the loop starts again, and the server keeps serving."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conversations import BY_NAME
from helpers.inprocess import in_process
from helpers.streams import endless
from websockets.sync.client import connect

from mlxserve.engine.continuous import continuous_batch
from mlxserve.engine.loop import worker

CHAT = "/v1/chat/completions"


@pytest.fixture
def failing_once(monkeypatch):
    """The first decode step with two sequences in the batch raises."""
    step = continuous_batch.ContinuousBatch.step
    failed = threading.Event()

    def fail_once(self) -> None:
        if len(self) >= 2 and not failed.is_set():
            failed.set()
            raise RuntimeError("injected failure")
        step(self)

    monkeypatch.setattr(continuous_batch.ContinuousBatch, "step", fail_once)
    return failed


def test_requests_in_flight_get_500_and_the_server_recovers(tiny_model, failing_once, monkeypatch):
    """The loop is back before the clients hear of the failure: /health right after the
    500s says ok (the restart made slow, so that an order the other way round shows)."""
    reseed = worker.reseed_random
    monkeypatch.setattr(worker, "reseed_random", lambda: (time.sleep(0.5), reseed()))
    with in_process(tiny_model, monkeypatch) as client:
        bodies = [endless(tiny_model, max_tokens=3000), BY_NAME["capital"].request]
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(client.post, CHAT, bodies[0])
            threading.Event().wait(0.5)  # the long request is decoding
            second = pool.submit(client.post, CHAT, bodies[1])
            replies = [first.result(timeout=60), second.result(timeout=60)]
        assert failing_once.is_set()
        for status, _, body in replies:
            assert status == 500
            assert body["error"]["type"] == "server_error"
            assert "injected failure" in body["error"]["message"]
        status, _, health = client.get("/health")
        assert status == 200 and health["status"] == "ok"
        status, _, body = client.post(CHAT, BY_NAME["capital"].request)
        assert (
            status == 200 and body["choices"][0]["message"]["content"] == BY_NAME["capital"].reply
        )


@pytest.fixture
def failing_tenth_step(monkeypatch):
    """The tenth decode step raises: a stream has begun by then."""
    step, steps = continuous_batch.ContinuousBatch.step, []

    def fail_on_the_tenth(self) -> None:
        steps.append(1)
        if len(steps) == 10:
            raise RuntimeError("injected failure")
        step(self)

    monkeypatch.setattr(continuous_batch.ContinuousBatch, "step", fail_on_the_tenth)


def test_a_failure_mid_stream_is_an_error_event(tiny_model, failing_tenth_step, monkeypatch):
    """An Anthropic stream that has begun ends with `event: error` in Anthropic's shape."""
    from helpers.sse import named_events, stream

    story = {"model": "default", "max_tokens": 300, "messages": BY_NAME["story"].messages}
    with in_process(tiny_model, monkeypatch) as client:
        events = named_events(stream(client.url, "/v1/messages", story))
        assert [name for name, _ in events[:3]] == [
            "message_start",
            "content_block_start",
            "content_block_delta",
        ]
        assert events[-1][0] == "error"
        error = events[-1][1]["error"]
        assert error["type"] == "api_error" and "injected failure" in error["message"]


def test_a_failure_mid_stream_is_a_failed_response(tiny_model, failing_tenth_step, monkeypatch):
    """A Responses stream that has begun ends with an `error` event and
    `response.failed`, whose response (the text so far, the error) is the one stored."""
    from helpers.sse import stream

    story = {"model": "default", "max_output_tokens": 300, "input": BY_NAME["story"].messages}
    with in_process(tiny_model, monkeypatch) as client:
        events = stream(client.url, "/v1/responses", story).chunks
        assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
        error = events[-2]
        assert error["code"] == "internal_error" and "injected failure" in error["message"]
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and failed["usage"] is None
        assert failed["error"] == {k: error[k] for k in ("code", "message", "param")}
        [message] = failed["output"]
        assert BY_NAME["story"].reply.startswith(message["content"][0]["text"])
        status, _, stored = client.get(f"/v1/responses/{failed['id']}")
        assert status == 200 and stored == failed


def test_a_bug_mid_stream_still_ends_the_stream_properly(tiny_model, monkeypatch):
    """An unexpected exception while a stream is written (here: in the OpenAI chunk
    renderer) ends it with an error event, `[DONE]` and the chunked body's last chunk."""
    from helpers.sse import stream

    from mlxserve.api.openai.responses import ChatFormat

    event_chunk, chunks = ChatFormat.event_chunk, []

    def fail_on_the_fifth(self, *args):
        chunks.append(1)
        if len(chunks) == 5:
            raise KeyError("injected bug")
        return event_chunk(self, *args)

    monkeypatch.setattr(ChatFormat, "event_chunk", fail_on_the_fifth)
    with in_process(tiny_model, monkeypatch) as client:
        # stream() reads the body to its end: a cut chunked body raises IncompleteRead.
        got = stream(client.url, CHAT, BY_NAME["story"].request)
        assert got.data[-1] == "[DONE]"
        assert len(got.chunks) == 6  # the role chunk, four deltas, the error
        error = got.chunks[-1]["error"]
        assert error["type"] == "server_error" and "injected bug" in error["message"]


def socket_to(server):
    return connect(server.url.replace("http://", "ws://") + "/v1/responses")


def test_a_bug_in_a_websocket_turn_fails_that_turn_only(tiny_model, monkeypatch):
    """An unexpected exception before a socket's turn has begun (here: in the Responses
    request's translation) is a 500 `error` event; the session goes on with the next."""
    from mlxserve.api.responses import endpoints

    translate, calls = endpoints.chat_request, []

    def fail_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("injected bug")
        return translate(*args, **kwargs)

    monkeypatch.setattr(endpoints, "chat_request", fail_first)
    turn = {"type": "response.create", "model": "default", "input": "Hello"}
    with in_process(tiny_model, monkeypatch) as client, socket_to(client) as ws:
        ws.send(json.dumps(turn))
        error = json.loads(ws.recv(timeout=60))
        assert error["type"] == "error" and error["status"] == 500
        assert "injected bug" in error["error"]["message"]
        ws.send(json.dumps(turn))
        ends = ("response.completed", "response.incomplete")
        while (event := json.loads(ws.recv(timeout=60)))["type"] not in ends:
            assert event["type"] != "error", event


def test_a_failure_while_joining_the_batch_answers_the_request(tiny_model, monkeypatch):
    """A request whose prompt is done but whose insertion into the batch fails was held
    by nobody: it waited forever. It gets the 500, and the next request is served."""
    insert = continuous_batch.ContinuousBatch._insert
    failed = threading.Event()

    def fail_once(self, *args) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("injected failure")
        insert(self, *args)

    monkeypatch.setattr(continuous_batch.ContinuousBatch, "_insert", fail_once)
    with in_process(tiny_model, monkeypatch) as client:
        with ThreadPoolExecutor(1) as pool:
            status, _, body = pool.submit(client.post, CHAT, BY_NAME["capital"].request).result(
                timeout=60
            )
        assert status == 500 and "injected failure" in body["error"]["message"]
        status, _, body = client.post(CHAT, BY_NAME["capital"].request)
        assert (
            status == 200 and body["choices"][0]["message"]["content"] == BY_NAME["capital"].reply
        )
