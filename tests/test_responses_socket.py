"""The Responses API over a WebSocket (OpenAI's WebSocket mode, as Codex and the `openai`
SDK's `responses.connect()` speak it) against the trained tiny model: the same events as the
SSE stream, turns that continue the connection's own unstored response from the prompt
cache, the warm-up, errors as `error` events that leave the socket open, the handshake's
auth and origin checks, size and idle limits, and a client that leaves mid-response."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time

import openai
import pytest
from conversations import BY_NAME, WEATHER_TOOL
from helpers.sse import open_stream, stream
from helpers.streams import endless
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

RESPONSES = "/v1/responses"
CHAT = "/v1/chat/completions"
WEATHER = {"type": "function", **WEATHER_TOOL["function"]}
ENDS = ("response.completed", "response.failed", "response.incomplete")
IDS = re.compile(r'"((?:resp|msg|rs|fc|call)_)[0-9a-f]+"')


def ws_url(srv, path: str = RESPONSES) -> str:
    return srv.url.replace("http://", "ws://") + path


def opened(srv, **options) -> ClientConnection:
    return connect(ws_url(srv), open_timeout=30, **options)


def receive_turn(ws: ClientConnection) -> list[dict]:
    """The events of one turn: up to its last response event, or a refusal (`error`
    with a status)."""
    events = []
    while True:
        event = json.loads(ws.recv(timeout=120))
        events.append(event)
        if event["type"] in ENDS or (event["type"] == "error" and "status" in event):
            return events


def turn(ws: ClientConnection, **request) -> list[dict]:
    ws.send(json.dumps({"type": "response.create", **request}))
    return receive_turn(ws)


def request_of(conv, **extra) -> dict:
    body: dict = {"model": "default", "input": conv.messages, "max_output_tokens": 200}
    if conv.tools:
        body["tools"] = [WEATHER]
    return {**body, **extra}


def comparable(events: list[dict]) -> list[dict]:
    """Events with their ids, times and prompt-cache hits made equal (each stream has its
    own ids, and the later of two equal requests is a cache hit)."""
    events = json.loads(IDS.sub(r'"\1ID"', json.dumps(events)))
    for event in events:
        response = event.get("response") or {}
        response["created_at"] = 0
        if response.get("usage"):
            response["usage"]["input_tokens_details"]["cached_tokens"] = 0
    return events


def refusal(ws: ClientConnection, message: str | bytes) -> dict:
    ws.send(message)
    [event] = receive_turn(ws)
    assert event["type"] == "error", event
    return event


# The same events as the SSE stream ------------------------------------------------------


@pytest.mark.parametrize("name", ["capital", "think", "tool_call", "parallel_tool_calls"])
def test_a_turn_is_the_sse_stream_event_for_event(server, name):
    request = request_of(BY_NAME[name])
    sse = stream(server.url, RESPONSES, {**request, "stream": True})
    assert sse.status == 200
    with opened(server) as ws:
        events = turn(ws, **request)
    assert comparable(events) == comparable(sse.chunks)
    assert events[-1]["type"] == "response.completed"


def test_the_sdk_continues_an_unstored_response_on_its_connection(server):
    """`responses.connect()` as shipped: turn two sends only its new input with the first
    turn's id, unstored, and gets the reply the whole conversation gets over HTTP, its
    prompt continued from the cache. The id means nothing elsewhere."""
    conv = BY_NAME["think"]
    sdk = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    with sdk.responses.connect() as connection:
        connection.response.create(**request_of(conv, store=False))
        first = next(e for e in connection if e.type in ENDS).response
        follow_up = [{"role": "user", "content": "Count to five."}]
        connection.response.create(
            model="default", input=follow_up, previous_response_id=first.id, store=False
        )
        second = next(e for e in connection if e.type in ENDS).response
    assert first.status == second.status == "completed"
    assert second.previous_response_id == first.id
    history = [
        *conv.messages,
        {"role": "assistant", "content": conv.content, "reasoning_content": conv.reasoning},
        *follow_up,
    ]
    status, _, chat = server.post(CHAT, {"messages": history, "max_tokens": 200})
    assert status == 200, chat
    assert second.output_text == chat["choices"][0]["message"]["content"]
    assert second.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    # unstored: not over HTTP, and not on another connection
    status, _, reply = server.get(f"{RESPONSES}/{first.id}")
    assert status == 404 and reply["error"]["code"] == "response_not_found"
    with opened(server) as ws:
        [error] = turn(ws, model="default", input="Hi", previous_response_id=second.id)
        assert error["status"] == 404
        assert error["error"]["code"] == "previous_response_not_found"
        assert error["error"]["param"] == "previous_response_id"
        assert turn(ws, **request_of(BY_NAME["capital"]))[-1]["type"] == "response.completed"


def until_open_sockets(srv, count: int) -> None:
    """Wait until the status counts `count` open sockets (the server counts a session
    once its handshake is answered, and stops once it has seen the close)."""
    deadline = time.monotonic() + 10
    while True:
        status, _, body = srv.get("/v1/status")
        assert status == 200, body
        if body["websockets"] == count:
            return
        assert time.monotonic() < deadline, (body["websockets"], count)
        time.sleep(0.05)


def test_the_status_counts_open_sockets(server):
    with opened(server):
        until_open_sockets(server, 1)
        with opened(server):
            until_open_sockets(server, 2)
        until_open_sockets(server, 1)
    until_open_sockets(server, 0)


def test_a_stored_response_continues_on_any_connection(server):
    request = request_of(BY_NAME["capital"])
    with opened(server) as ws:
        first = turn(ws, **request)[-1]["response"]
    with opened(server) as ws:
        events = turn(ws, model="default", input="Thanks.", previous_response_id=first["id"])
    assert events[-1]["type"] == "response.completed"
    status, _, stored = server.get(f"{RESPONSES}/{events[-1]['response']['id']}")
    assert status == 200 and stored["previous_response_id"] == first["id"]


def test_the_warm_up_answers_nothing_and_the_next_turn_continues_it(server):
    """`generate: false` (Codex's prewarm: instructions and tools, no input): created, in
    progress and completed at once, no output, nothing computed; the next turn continues
    it by id and is answered as the whole request is over HTTP."""
    setup = {"model": "default", "instructions": "You are a weather assistant.", "tools": [WEATHER]}
    conv = BY_NAME["tool_call"]
    with opened(server) as ws:
        warm = turn(ws, **setup, input=[], store=False, generate=False)
        assert [e["type"] for e in warm] == [
            "response.created",
            "response.in_progress",
            "response.completed",
        ]
        ready = warm[-1]["response"]
        assert ready["output"] == [] and ready["usage"]["total_tokens"] == 0
        events = turn(
            ws, **setup, input=conv.messages, previous_response_id=ready["id"], store=False
        )
    answer = events[-1]["response"]
    assert answer["previous_response_id"] == ready["id"]
    status, _, whole = server.post(RESPONSES, {**setup, "input": conv.messages})
    assert status == 200, whole
    assert comparable([{"output": answer["output"]}]) == comparable([{"output": whole["output"]}])
    assert answer["usage"]["input_tokens"] == whole["usage"]["input_tokens"]


def test_turns_sent_together_are_answered_in_turn(server):
    capital, think = request_of(BY_NAME["capital"]), request_of(BY_NAME["think"])
    with opened(server) as ws:
        ws.send(json.dumps({"type": "response.create", **capital}))
        ws.send(json.dumps({"type": "response.create", **think}))
        first, second = receive_turn(ws), receive_turn(ws)
    assert first[0]["type"] == second[0]["type"] == "response.created"
    assert first[-1]["response"]["output"][0]["content"][0]["text"] == BY_NAME["capital"].reply
    assert second[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in second] == list(range(len(second)))


# Mistakes, limits and leaving ------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(launch_module, tiny_model):
    """One sequence at a time, 64 KiB messages, sessions idle for 3 s closed."""
    return launch_module(
        tiny_model,
        "--max-concurrent",
        "1",
        "--max-body-bytes",
        "65536",
        "--websocket-idle-timeout",
        "3",
    )


def test_mistakes_are_error_events_and_the_socket_stays_open(limited):
    with opened(limited) as ws:
        error = refusal(ws, "{not json")
        assert error["status"] == 400 and "not valid JSON" in error["error"]["message"]
        assert error["error"]["type"] == "invalid_request_error"
        assert refusal(ws, b"\x00\x01")["status"] == 400  # a binary frame
        error = refusal(ws, json.dumps({"type": "session.update"}))
        assert error["status"] == 400 and error["error"]["param"] == "type"
        bad = {"type": "response.create", "input": "Hi", "temperature": "hot"}
        error = refusal(ws, json.dumps(bad))
        assert error["status"] == 400 and error["error"]["param"] == "temperature"
        error = refusal(ws, json.dumps({"type": "response.create", "input": []}))
        assert error["error"]["param"] == "input"
        background = {"type": "response.create", "input": "Hi", "background": True}
        assert refusal(ws, json.dumps(background))["error"]["param"] == "background"
        # an acknowledgement some Codex builds send asks nothing and gets nothing
        ws.send(json.dumps({"type": "response.processed", "response_id": "resp_1"}))
        events = turn(ws, **request_of(BY_NAME["capital"]))
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.completed"


def test_a_message_over_the_limit_closes_with_1009(limited):
    with opened(limited) as ws:
        ws.send(json.dumps({"type": "response.create", "input": "x" * 70000}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    with opened(limited) as ws:  # the server goes on
        assert turn(ws, **request_of(BY_NAME["capital"]))[-1]["type"] == "response.completed"


def test_an_idle_session_is_closed_as_going_away_and_pings_are_answered(limited):
    with opened(limited, ping_interval=None) as ws:
        assert ws.ping().wait(10)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "idle timeout")


def test_a_client_that_leaves_ends_its_response(limited, tiny_model):
    """A turn waiting behind another sequence is dropped when its client hangs up without
    a closing handshake; the next client is answered once the slot is free."""
    busy_body = {**endless(tiny_model, max_tokens=4000), "stream": True}
    busy, response = open_stream(limited.url, CHAT, busy_body)
    assert response.status == 200
    response.readline()
    try:
        ws = opened(limited)
        ws.send(json.dumps({"type": "response.create", **request_of(BY_NAME["capital"])}))
        time.sleep(0.5)
        ws.socket.shutdown(socket.SHUT_RDWR)
        ws.socket.close()
        assert limited.log_lines("the client left during a response", timeout=30)
    finally:
        busy.close()
    with opened(limited) as ws:
        assert turn(ws, **request_of(BY_NAME["capital"]))[-1]["type"] == "response.completed"


# The handshake -------------------------------------------------------------------------------


def test_the_handshake_wants_the_key_and_an_allowed_origin(launch, tiny_model):
    srv = launch(tiny_model, "--api-key", "secret", "--allowed-origins", "http://app.example")
    with pytest.raises(InvalidStatus) as refused:
        opened(srv)
    assert refused.value.response.status_code == 401
    with opened(srv, additional_headers={"Authorization": "Bearer secret"}) as ws:
        assert turn(ws, **request_of(BY_NAME["capital"]))[-1]["type"] == "response.completed"
    # a browser: the key as a subprotocol, which the server must choose back
    key = "openai-insecure-api-key.secret"
    page = {"origin": "http://app.example"}
    with opened(srv, subprotocols=[key], **page) as ws:
        assert ws.subprotocol == key
        assert turn(ws, **request_of(BY_NAME["capital"]))[-1]["type"] == "response.completed"
    with opened(srv, subprotocols=["realtime", key], **page) as ws:
        assert ws.subprotocol == "realtime"
    with pytest.raises(InvalidStatus) as refused:
        opened(srv, subprotocols=[key], origin="http://evil.example")
    assert refused.value.response.status_code == 403
    assert srv.log_lines("WebSocket opened on /v1/responses")
    assert srv.log_lines('"WS /v1/responses" 200 model=')


def answered_count(srv) -> float:
    """mlxserve_requests_total of /v1/responses answered 200."""
    status, _, metrics = srv.get("/metrics")
    assert status == 200
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("mlxserve_requests_total{")
        and 'endpoint="/v1/responses"' in line
        and 'status="200"' in line
    )


def test_each_message_is_logged_and_counted_as_a_request(server):
    """A turn has its own access-log line (method WS) and counts in the metrics under
    /v1/responses; the session's own line is the handshake's 101 once it closes."""
    before = answered_count(server)
    with opened(server) as ws:
        turn(ws, **request_of(BY_NAME["capital"]))
        turn(ws, **request_of(BY_NAME["think"]))
    assert answered_count(server) == before + 2
    lines = server.log_lines('"WS /v1/responses" 200')
    assert any("prompt=15" in line and "completion=7" in line for line in lines)
    assert server.log_lines('"GET /v1/responses" 101')


def test_a_malformed_handshake_is_a_400_and_a_plain_get_a_405(server):
    conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=30)
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "8"}
    conn.request("GET", RESPONSES, headers={**upgrade, "Sec-WebSocket-Key": "x"})
    response = conn.getresponse()
    assert response.status == 400
    assert response.getheader("Content-Type") == "application/json"
    message = json.loads(response.read())["error"]["message"]
    assert message.startswith("The WebSocket handshake failed: "), message
    status, _, body = server.get(RESPONSES)
    assert status == 405 and "opens a WebSocket" in body["error"]["message"]
