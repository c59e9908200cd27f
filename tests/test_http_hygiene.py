"""HTTP hygiene on raw sockets: silent clients are let go, ambiguous framing is refused,
an unread body never becomes the next request, and web pages cannot drive a local
server (DNS rebinding, cross-site form posts)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
from conversations import BY_NAME
from helpers.server import start_server

CHAT = "/v1/chat/completions"
REQUEST = json.dumps(BY_NAME["capital"].request).encode()
READ_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def srv(tiny_model):
    server = start_server(tiny_model, "--read-timeout", str(READ_TIMEOUT))
    yield server
    server.stop()


def connect(server) -> socket.socket:
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    return sock


def host(server) -> str:
    return urlsplit(server.url).netloc


def request(server, head: str, body: bytes = b"") -> bytes:
    """`head`: the request line and headers (without the blank line); returns all the
    server sends until it closes the connection."""
    sock = connect(server)
    sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n" + body)
    return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def post_head(server, path: str = CHAT, length: int = len(REQUEST), **headers) -> str:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host(server)}", f"Content-Length: {length}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return "\n".join(lines)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def json_of(reply: bytes) -> dict:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"Content-Type: application/json" in head
    return json.loads(body)


def test_a_body_shorter_than_its_length_is_let_go(srv):
    started = time.monotonic()
    reply = request(srv, post_head(srv, length=len(REQUEST) + 10), REQUEST)
    assert time.monotonic() - started < 30
    assert status_of(reply) == 408 and json_of(reply)["error"]["code"] == "request_timeout"


def test_a_chunked_body_that_never_ends_is_let_go(srv):
    head = "\n".join([f"POST {CHAT} HTTP/1.1", f"Host: {host(srv)}", "Transfer-Encoding: chunked"])
    reply = request(srv, head, b'5\r\n{"mes\r\n')
    assert status_of(reply) == 408


def trickle(sock: socket.socket, data: bytes, seconds: float) -> None:
    """Send a byte every `seconds` (well inside the read timeout) until the server hangs
    up or `data` runs out."""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return
        time.sleep(seconds)


def test_a_trickled_head_is_cut_off_at_its_deadline(srv):
    """Each byte well inside --read-timeout, the whole head never: let go after the
    deadline (it was held for good)."""
    sock = connect(srv)
    started = time.monotonic()
    head = post_head(srv).replace("\n", "\r\n").encode() + b"\r\nX-Padding: " + b"a" * 100
    trickle(sock, head, READ_TIMEOUT / 3)
    assert time.monotonic() - started < READ_TIMEOUT + 5
    sock.close()


def test_a_trickled_body_is_cut_off_at_its_deadline(srv):
    sock = connect(srv)
    sock.sendall(post_head(srv).replace("\n", "\r\n").encode() + b"\r\n\r\n")
    started = time.monotonic()
    trickle(sock, REQUEST, READ_TIMEOUT / 3)
    reply = read_all(sock)
    assert time.monotonic() - started < READ_TIMEOUT + 5
    assert status_of(reply) == 408 and json_of(reply)["error"]["code"] == "request_timeout"


def test_an_idle_kept_alive_connection_is_closed(srv):
    sock = connect(srv)
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host(srv)}\r\n\r\n".encode())
    first = sock.recv(65536)
    while b"}" not in first:  # the JSON body may come in a second segment
        first += sock.recv(65536)
    assert status_of(first) == 200
    started = time.monotonic()
    assert read_all(sock) == b""  # the server hangs up on the silent client
    assert time.monotonic() - started < 30


def test_an_unread_body_never_becomes_the_next_request(srv):
    """A refused POST whose body was not read closes its connection: the body's bytes
    would otherwise be parsed as the next request on it."""
    get = f"GET /health HTTP/1.1\r\nHost: {host(srv)}\r\n\r\n".encode()
    for path in ("/v1/unknown", "/v1/models"):
        sock = connect(srv)
        sock.sendall(post_head(srv, path).replace("\n", "\r\n").encode() + b"\r\n\r\n")
        sock.sendall(REQUEST + get)
        reply = read_all(sock)
        assert status_of(reply) in (404, 405)
        assert b"Connection: close" in reply.partition(b"\r\n\r\n")[0]
        assert reply.count(b"HTTP/1.1") == 1  # nothing answered the body as a request


def test_ambiguous_framing_is_refused(srv):
    twice = post_head(srv) + f"\nContent-Length: {len(REQUEST) + 1}"
    both = post_head(srv) + "\nTransfer-Encoding: chunked"
    for head, body in ((twice, REQUEST + b" "), (both, b"0\r\n\r\n")):
        reply = request(srv, head, body)
        assert status_of(reply) == 400
        assert b"Connection: close" in reply.partition(b"\r\n\r\n")[0]


def chunked(body: bytes, size: str = "{:x}") -> bytes:
    return size.format(len(body)).encode() + b"\r\n" + body + b"\r\n0\r\n\r\n"


def test_lax_framing_is_refused(srv):
    """What Python's int() or a substring match would take, and a proxy in front may read
    otherwise: request-smuggling material. The plain forms are answered."""
    base = "\n".join([f"POST {CHAT} HTTP/1.1", f"Host: {host(srv)}"])
    refused = [
        (f"{base}\nContent-Length: +{len(REQUEST)}", REQUEST),
        (f"{base}\nContent-Length: 0_{len(REQUEST)}", REQUEST),
        (f"{base}\nContent-Length: {len(REQUEST)}, {len(REQUEST) + 1}", REQUEST),
        (f"{base}\nTransfer-Encoding: xchunked", chunked(REQUEST)),
        (f"{base}\nTransfer-Encoding: gzip, chunked", chunked(REQUEST)),
        (f"{base}\nTransfer-Encoding: chunked\nTransfer-Encoding: chunked", chunked(REQUEST)),
        (f"{base}\nTransfer-Encoding: chunked", chunked(REQUEST, "0x{:x}")),
        (f"{base}\nTransfer-Encoding: chunked", chunked(REQUEST, "+{:x}")),
    ]
    for head, body in refused:
        reply = request(srv, head, body)
        assert status_of(reply) == 400, (head, reply)
        assert b"Connection: close" in reply.partition(b"\r\n\r\n")[0]
    answered = [
        (f"{base}\nContent-Length: {len(REQUEST)}, {len(REQUEST)}", REQUEST),
        (f"{base}\nTransfer-Encoding: Chunked", chunked(REQUEST, "{:X};ext=1")),
    ]
    for head, body in answered:
        reply = request(srv, head + "\nConnection: close", body)
        assert status_of(reply) == 200, (head, reply)


def test_a_foreign_host_name_is_refused(srv):
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1."""
    status, _, body = srv.post(CHAT, BY_NAME["capital"].request, {"Host": "evil.example"})
    assert status == 403 and body["error"]["code"] == "host_not_allowed"
    assert srv.get("/health", {"Host": "evil.example:80"})[0] == 403
    for name in ("localhost:1234", "127.0.0.1", "[::1]:8080", "host.docker.internal:8080"):
        assert srv.get("/health", {"Host": name})[0] == 200, name


def test_allowed_hosts_widens_the_names(launch, tiny_model):
    named = launch(tiny_model, "--allowed-hosts", "mac.lan")
    assert named.get("/health", {"Host": "mac.lan:8080"})[0] == 200
    assert named.get("/health", {"Host": "localhost"})[0] == 403
    anyone = launch(tiny_model, "--allowed-hosts", "*")
    assert anyone.get("/health", {"Host": "evil.example"})[0] == 200


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_web_page_cannot_post_without_a_preflight(srv, content_type):
    page = {"Origin": "https://evil.example", "Content-Type": content_type}
    status, _, body = srv.post(CHAT, BY_NAME["capital"].request, page)
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    # curl -d sends a form type too, but no Origin: it still works.
    status, _, body = srv.post(CHAT, BY_NAME["capital"].request, {"Content-Type": content_type})
    assert status == 200, body


def test_an_origin_not_allowed_is_refused(launch, tiny_model):
    strict = launch(tiny_model, "--allowed-origins", "https://chat.example")
    ok = {"Origin": "https://chat.example"}
    assert strict.post(CHAT, BY_NAME["capital"].request, ok)[0] == 200
    status, _, body = strict.post(
        CHAT, BY_NAME["capital"].request, {"Origin": "https://evil.example"}
    )
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"


def test_a_server_other_machines_reach_without_a_key_says_so(launch, tiny_model, srv):
    """Bound wider than loopback with no key: a warning on the start-up screen, in the
    log, and in /v1/status (the web app shows it on every page); with a key, or on
    loopback, none."""
    exposed = launch(tiny_model, "--host", "0.0.0.0")
    warning = (
        "This server listens on 0.0.0.0 without an API key: anyone who can reach this "
        "machine can use it, load and unload its models included. Give --api-key (or "
        "MLXSERVE_API_KEY), or bind to 127.0.0.1."
    )
    assert f"  Warning   {warning}\n" in exposed.log
    assert any(
        line.rstrip().endswith(f"WARNING mlxserve.server: {warning}") for line in exposed.log
    )
    assert exposed.get("/v1/status")[2]["warnings"] == [warning]
    keyed = launch(tiny_model, "--host", "0.0.0.0", "--api-key", "sk-test")
    status = keyed.get("/v1/status", {"Authorization": "Bearer sk-test"})[2]
    assert status["warnings"] == [] and not any("Warning" in line for line in keyed.log)
    assert srv.get("/v1/status")[2]["warnings"] == []
