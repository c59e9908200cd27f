"""HTTP plumbing: health, models, CORS, API keys, body limits, keepalive, disconnects."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import openai
import pytest
from conversations import AGENT_REPLY, BY_NAME
from helpers.server import start_server
from helpers.sse import open_stream, stream
from helpers.streams import endless

CHAT = "/v1/chat/completions"
MESSAGES = BY_NAME["capital"].messages


def connect(server) -> http.client.HTTPConnection:
    parts = urlsplit(server.url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)


def test_health(server):
    for path in ("/health", "/v1/health"):
        status, _, body = server.get(path)
        assert status == 200 and body["status"] == "ok"


def test_models(server, tiny_model):
    status, _, body = server.get("/v1/models")
    assert status == 200 and body["object"] == "list"
    served = body["data"][0]
    assert served == {
        "id": str(tiny_model),
        "object": "model",
        "created": 0,
        "owned_by": "mlxserve",
        "kind": "chat",
        "input_modalities": ["text"],
        "context_length": 4096,
        "max_model_len": 4096,
        "state": "loaded",
        "pinned": False,
        "size_bytes": sum(f.stat().st_size for f in tiny_model.glob("*.safetensors")),
        "capabilities": {"tools": True, "reasoning": True},
    }
    status, _, one = server.get(f"/v1/models/{tiny_model}")
    assert status == 200 and one == served
    status, _, missing = server.get("/v1/models/nobody/nothing")
    assert status == 404 and missing["error"]["code"] == "model_not_found"


def test_cors_preflight_and_origin(server):
    conn = connect(server)
    conn.request(
        "OPTIONS",
        CHAT,
        headers={"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"},
    )
    response = conn.getresponse()
    response.read()
    assert response.status == 204
    allowed = response.getheader("Access-Control-Allow-Headers")
    assert "Authorization" in allowed and "Content-Type" in allowed
    assert "POST" in response.getheader("Access-Control-Allow-Methods")
    assert response.getheader("Access-Control-Allow-Origin") == "*"
    _, headers, _ = server.post(CHAT, {"messages": MESSAGES})
    assert headers["Access-Control-Allow-Origin"] == "*"


def test_cors_preflight_allows_the_headers_asked_for(server):
    """The SDKs in a browser send headers of their own (anthropic-version, x-stainless-*)."""
    asked = "anthropic-version, x-api-key, x-stainless-os, content-type"
    conn = connect(server)
    conn.request(
        "OPTIONS",
        "/v1/messages",
        headers={
            "Origin": "http://ui.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": asked,
        },
    )
    response = conn.getresponse()
    response.read()
    assert response.status == 204
    assert response.getheader("Access-Control-Allow-Headers") == asked


def test_allowed_origins(launch, tiny_model):
    srv = launch(tiny_model, "--allowed-origins", "http://ui.example, http://other.example")
    _, headers, _ = srv.get("/v1/models", headers={"Origin": "http://ui.example"})
    assert headers["Access-Control-Allow-Origin"] == "http://ui.example"
    _, headers, _ = srv.get("/v1/models", headers={"Origin": "http://evil.example"})
    assert headers.get("Access-Control-Allow-Origin") is None


def test_api_key(launch, tiny_model):
    srv = launch(tiny_model, env={"MLXSERVE_API_KEY": "s3cret"})
    status, _, body = srv.get("/v1/models")
    assert status == 401
    assert body["error"]["type"] == "authentication_error"
    assert srv.get("/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert srv.post(CHAT, {"messages": MESSAGES})[0] == 401
    assert srv.get("/v1/models", headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert srv.get("/v1/models", headers={"x-api-key": "s3cret"})[0] == 200
    assert srv.get("/health")[0] == 200
    client = openai.OpenAI(base_url=srv.base_url, api_key="s3cret")
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=MESSAGES)
    assert reply.choices[0].message.content == BY_NAME["capital"].reply
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.base_url, api_key="nope").models.list()


def test_body_limit(launch, tiny_model):
    srv = launch(tiny_model, "--max-body-bytes", "2000")
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    status, _, body = srv.post(CHAT, big)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    # A huge declared length is refused without reading (and waiting for) the body.
    conn = connect(srv)
    conn.putrequest("POST", CHAT)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(10**9))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    assert json.loads(response.read())["error"]["code"] == "request_too_large"
    conn.close()
    status, _, body = srv.post(CHAT, {"messages": MESSAGES})
    assert status == 200


def chunked_post(server, payload: bytes, piece: int = 7):
    conn = connect(server)
    conn.putrequest("POST", CHAT)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for i in range(0, len(payload), piece):
        part = payload[i : i + piece]
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_a_negative_chunk_size_is_a_400_not_a_hang(server):
    """int("-5", 16) is -5, and reading -5 bytes reads to the end of the stream."""
    conn = http.client.HTTPConnection(*urlsplit(server.url)[1].split(":"), timeout=10)
    conn.putrequest("POST", CHAT)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"-5\r\n{}\r\n")
    response = conn.getresponse()
    assert response.status == 400
    assert json.loads(response.read())["error"]["message"] == (
        "Malformed chunked request body: a chunk size is hex digits."
    )


def test_chunked_request_body(server, launch, tiny_model):
    status, body = chunked_post(server, json.dumps({"messages": MESSAGES}).encode())
    assert status == 200 and body["choices"][0]["message"]["content"] == BY_NAME["capital"].reply
    small = launch(tiny_model, "--max-body-bytes", "100")
    payload = json.dumps({"messages": [{"role": "user", "content": "y" * 500}]}).encode()
    status, body = chunked_post(small, payload, piece=64)
    assert status == 413


def test_keepalive_comments_while_waiting(launch, tiny_model):
    """With room for one sequence, a second request waits for the first to finish."""
    single = launch(tiny_model, "--max-concurrent", "1", "--keepalive-seconds", "0.5")
    busy = threading.Thread(target=single.post, args=(CHAT, endless(tiny_model, max_tokens=1500)))
    busy.start()
    time.sleep(0.3)
    result = stream(single.url, CHAT, {"messages": MESSAGES})
    busy.join()
    assert result.comments and result.lines[0] == ": keepalive"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in result.chunks) == (
        BY_NAME["capital"].reply
    )


@pytest.fixture(scope="module")
def long_context(agent_model):
    """The agent model (a 131,072-token context): room for endless generations."""
    srv = start_server(agent_model)
    yield srv
    srv.stop()


def test_stream_disconnect_cancels_generation(long_context, agent_model):
    srv = long_context
    conn, response = open_stream(
        srv.url, CHAT, endless(agent_model, max_tokens=130_000, stream=True)
    )
    for _ in range(5):
        response.fp.readline()
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    # 130,000 tokens would take many minutes: the next answer proves the slot is free.
    status, _, body = srv.post(CHAT, {"messages": MESSAGES}, timeout=60)
    assert status == 200 and body["choices"][0]["message"]["content"] == AGENT_REPLY
    assert srv.log_lines("client closed the connection")


def test_non_stream_disconnect_cancels_generation(long_context, agent_model):
    srv = long_context
    parts = urlsplit(srv.url)
    payload = json.dumps(endless(agent_model, max_tokens=130_000)).encode()
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    time.sleep(1.0)
    sock.close()
    status, _, body = srv.post(CHAT, {"messages": MESSAGES}, timeout=60)
    assert status == 200 and body["choices"][0]["message"]["content"] == AGENT_REPLY
    assert not any(" 400" in line or " 403" in line for line in srv.log)


def test_keep_alive_connection_serves_several_requests(server):
    conn = connect(server)
    for _ in range(3):
        conn.request(
            "POST", CHAT, json.dumps({"messages": MESSAGES}), {"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        assert (
            json.loads(response.read())["choices"][0]["message"]["content"]
            == BY_NAME["capital"].reply
        )
    conn.request("POST", CHAT, json.dumps({"messages": MESSAGES, "stream": True}), {})
    response = conn.getresponse()
    assert response.read().decode().endswith("data: [DONE]\n\n")
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()
