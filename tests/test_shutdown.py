"""Shutdown: SIGTERM and SIGINT always exit 0, and every open stream ends with its
dialect's error event and proper end instead of being cut."""

from __future__ import annotations

import json
import signal

import pytest
from helpers.server import start_server
from helpers.sse import open_stream
from helpers.streams import endless
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import connect


def open_endless(srv, model, path: str):
    body = endless(model, max_tokens=3000, stream=True)
    if path == "/v1/messages":
        body = {**body, "model": "default"}
    conn, response = open_stream(srv.url, path, body)
    assert response.status == 200
    response.readline()  # the stream has begun (chunk-aware: the rest is read later)
    return conn, response


# 50 tries in all: the exit that used to abort ("terminate called without an active
# exception", 134) came one time in three; each try takes about 1.5 s.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("attempt", range(25))
def test_a_signal_ends_open_streams_and_exits_0(tiny_model, sig, attempt):
    srv = start_server(tiny_model)
    try:
        openai = open_endless(srv, tiny_model, "/v1/chat/completions")
        anthropic = open_endless(srv, tiny_model, "/v1/messages")
        srv.process.send_signal(sig)
        assert srv.process.wait(timeout=30) == 0
        # read() on a chunked body raises IncompleteRead when it is cut short.
        text = openai[1].read().decode()
        assert text.rstrip().endswith("data: [DONE]")
        assert '"code": "service_unavailable"' in text and "shutting down" in text
        events = anthropic[1].read().decode()
        assert "event: error" in events and "shutting down" in events
        assert "message_stop" not in events
    finally:
        srv.stop()


def test_ctrl_c_stops_a_server_started_with_it_ignored(tiny_model):
    """A script's background job starts with SIGINT ignored (Python then leaves it so):
    the server sets its own handler, so Ctrl-C still shuts it down."""
    srv = start_server(tiny_model, preexec=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        srv.process.send_signal(signal.SIGINT)
        assert srv.process.wait(timeout=30) == 0
    finally:
        srv.stop()


def test_a_signal_closes_websockets_as_going_away(tiny_model):
    """An idle session and one whose turn waits for a slot: the turn ends with its error
    and `response.failed`, then both sockets get a close frame, 1001, before the exit."""
    srv = start_server(tiny_model, "--max-concurrent", "1", "--keepalive-seconds", "0.3")
    url = srv.url.replace("http://", "ws://") + "/v1/responses"
    try:
        busy = open_endless(srv, tiny_model, "/v1/chat/completions")
        idle, waiting = connect(url), connect(url)
        turn = {"type": "response.create", "model": "default", "input": "Hello"}
        waiting.send(json.dumps(turn))
        assert json.loads(waiting.recv(timeout=30))["type"] == "response.created"
        srv.process.send_signal(signal.SIGTERM)
        assert srv.process.wait(timeout=30) == 0
        busy[1].read()
        events = []
        with pytest.raises(ConnectionClosedOK):
            while True:
                events.append(json.loads(waiting.recv(timeout=30))["type"])
        assert events[-2:] == ["error", "response.failed"]
        for socket_ in (idle, waiting):
            closed = socket_.protocol.close_rcvd
            assert closed is not None
            assert (closed.code, closed.reason) == (1001, "server shutting down")
    finally:
        srv.stop()
