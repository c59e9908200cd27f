"""HTTP plumbing on the standard library: routing, auth, body limits, CORS, error bodies."""

from __future__ import annotations

import json
import logging
import select
import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Protocol, cast
from urllib.parse import unquote, urlsplit

from mlxserve.api.access import SPENDING_METHODS, WEBSOCKET_METHOD, admitted, count_request
from mlxserve.api.batches.routes import is_batch_path
from mlxserve.api.deadline import ReadDeadline
from mlxserve.api.errors import ErrorReply
from mlxserve.api.guards import (
    body_framing,
    check_browser_post,
    check_host,
    check_origin,
    chunk_size,
)
from mlxserve.api.images.links import LINK_PREFIX
from mlxserve.api.openapi.document import document
from mlxserve.api.responder import SSE_CONTENT_TYPE, RawReply
from mlxserve.api.responses.conversations import is_conversation_path
from mlxserve.api.routes import (
    GET_PATHS,
    HEAD_PATHS,
    HEALTH_PATHS,
    KEYS_PATHS,
    MCP_SERVERS_PATHS,
    METRICS_PATHS,
    MODEL_PREFIXES,
    MODELS_PATHS,
    OLLAMA_DELETE_PATHS,
    OLLAMA_PS_PATHS,
    OLLAMA_TAGS_PATHS,
    OLLAMA_VERSION_PATHS,
    OPENAPI_PATHS,
    RESPONSE_PREFIXES,
    STATUS_PATHS,
    USAGE_PATHS,
    Routes,
    is_keyless,
)
from mlxserve.api.websocket import WebSocket, is_upgrade
from mlxserve.config import ServerConfig
from mlxserve.protocol.errors import (
    ClientGone,
    ErrorKind,
    ServiceError,
    internal_error,
    not_found,
)
from mlxserve.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from mlxserve.telemetry.metrics import Metrics
from mlxserve.telemetry.record import RequestRecord, recording, request_id
from mlxserve.webapp import HEADERS as PAGE_HEADERS
from mlxserve.webapp import asset, is_asset_path

log = logging.getLogger(__name__)
# A body must arrive at this rate at least (its deadline grows with its size), and never
# needs to arrive faster than within --read-timeout.
MIN_BODY_BYTES_PER_SECOND = 64 * 1024


def body_seconds(size: int, floor: float) -> float:
    return max(floor, size / MIN_BODY_BYTES_PER_SECOND)


access_log = logging.getLogger("mlxserve.access")
# A reply's prompt-cache hit: "cached/prompt" tokens (a whole reply; a stream's usage)
PROMPT_CACHE_HEADER = "X-Prompt-Cache-Hit"
EXPOSED_HEADERS = f"X-Request-Id, {PROMPT_CACHE_HEADER}"


# Request headers a browser may send cross-origin: OpenAI's and Anthropic's clients'.
ALLOWED_HEADERS = (
    "Authorization, Content-Type, X-API-Key, anthropic-version, anthropic-beta, "
    "anthropic-dangerous-direct-browser-access, X-Request-Id"
)


class Serving(Protocol):
    """What the handler needs of the HTTP server it runs under (server.MLXServer)."""

    config: ServerConfig
    routes: Routes
    metrics: Metrics

    def answering(self) -> AbstractContextManager[None]: ...


class APIHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mlxserve"
    streaming = False  # an SSE response has begun: errors can no longer be a reply
    record: RequestRecord | None = None  # the request being answered

    @property
    def app(self) -> Serving:
        return cast(Serving, self.server)

    # Entry points -----------------------------------------------------------------------

    def do_OPTIONS(self) -> None:
        self.record = RequestRecord(request_id(self.headers.get("X-Request-Id")), "OPTIONS", "")
        self._drain()
        self.send_response(204)
        self.send_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
        # The SDKs in a browser also send their own x-stainless-* headers: allow what is asked.
        asked = self.headers.get("Access-Control-Request-Headers")
        self.send_header("Access-Control-Allow-Headers", asked or ALLOWED_HEADERS)
        self.send_header("Access-Control-Max-Age", "86400")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if is_upgrade(self.headers) and path in self.app.routes.sockets:
            self._handle(self._upgrade)  # each of its messages is answered as a request
            return
        with self.app.answering():
            self._handle(self._get)

    def do_POST(self) -> None:
        with self.app.answering():
            self._handle(self._post)

    def do_DELETE(self) -> None:
        with self.app.answering():
            self._handle(self._delete)

    def do_HEAD(self) -> None:
        """Headers only, where Ollama's clients probe (HEAD_PATHS); elsewhere a 405."""
        with self.app.answering():
            self._handle(self._head)

    def __getattr__(self, name: str):
        """Any other method (PUT, PATCH, TRACE, HEAD...): a 405 in the path's dialect,
        where http.server would answer 501 in HTML."""
        if name.startswith("do_"):
            return self._other_method
        raise AttributeError(name)

    def _other_method(self) -> None:
        with self.app.answering():
            self._handle(self._not_allowed)

    def _not_allowed(self, path: str) -> None:
        raise ServiceError(
            ErrorKind.METHOD_NOT_ALLOWED,
            f"Method {self.command} is not allowed; this server answers GET, POST, DELETE "
            "and OPTIONS.",
            code="method_not_allowed",
        )

    def setup(self) -> None:
        # A client silent this long (an unfinished body, an idle kept-alive connection) is
        # let go instead of holding a thread and a file descriptor forever.
        self.timeout = self.app.config.read_timeout  # type: ignore[misc]  # per connection, as socketserver reads it
        super().setup()
        self.deadline = ReadDeadline(self.connection)

    def handle_one_request(self) -> None:
        """The next request's head (line and headers) must arrive within --read-timeout
        of waiting for it, however its bytes trickle in."""
        self.deadline.start(self.app.config.read_timeout)
        try:
            super().handle_one_request()
        finally:
            self.deadline.cancel()
        if self.deadline.expired:
            self.close_connection = True

    def parse_request(self) -> bool:
        self.record = None  # a malformed request line is answered without the last one's id
        parsed = super().parse_request()
        self.deadline.cancel()  # the head is in
        return parsed

    def _handle(self, route) -> None:
        """Answer one request, then write its access-log line and count it."""
        self.record = RequestRecord(
            request_id(self.headers.get("X-Request-Id")),
            self.command,
            self.path,
            on_token_gap=self.app.metrics.observe_token_gap,
            on_token=self.app.routes.activity.token,
        )
        with recording(self.record):
            path = self._answer(route)
            self._account(self.record, path)

    def _account(self, record: RequestRecord, path: str) -> None:
        """A request answered: its access-log line, its metrics, its place in the activity."""
        count_request(record)
        record.finished = time.monotonic()
        access_log.info(record.access_line())
        self.app.metrics.observe(record, self.app.routes.endpoint(path))
        if record.method in SPENDING_METHODS:  # the work itself, not the pages polling for it
            self.app.routes.activity.finished(record)

    # WebSockets -------------------------------------------------------------------------

    def _upgrade(self, path: str) -> None:
        """The handshake, then the session on this connection's thread until it closes."""
        config = self.app.config
        check_origin(self.headers, config.allowed_origins)
        socket_ = WebSocket.accept(
            self.path,
            self.headers,
            self.connection,
            self.rfile,
            config.max_body_bytes,
            config.websocket_idle_timeout,
        )
        assert self.record is not None
        self.record.status = 101
        self.close_connection = True  # the connection is the socket's now
        self.streaming = True  # from here an error can no longer be an HTTP reply
        peer = self.client_address[0]
        log.info("WebSocket opened on %s for %s", path, peer)
        try:
            with self.app.routes.open_sockets.holding(socket_):
                self.app.routes.sockets[path](socket_, lambda: self._turn(path))
        finally:
            socket_.close()
            log.info("WebSocket closed on %s for %s", path, peer)

    @contextmanager
    def _turn(self, path: str) -> Iterator[None]:
        """One message of a WebSocket session, answered as a request of its own: admitted
        with the session's key (rate limits and quotas apply to each), recorded, counted."""
        record = RequestRecord(
            request_id(None),
            WEBSOCKET_METHOD,
            path,
            status=200,
            on_token_gap=self.app.metrics.observe_token_gap,
            on_token=self.app.routes.activity.token,
        )
        routes = self.app.routes
        with recording(record):
            try:
                with (
                    self.app.answering(),
                    admitted(routes.keys, self.headers, path, record, self.app.metrics),
                ):
                    yield
            except ServiceError as e:
                record.status = routes.errors(path)(e).status
                raise
            except ClientGone:
                raise
            except Exception:
                record.status = 500
                raise
            finally:
                self._account(record, path)

    def _answer(self, route) -> str:
        """Route the request; errors become the dialect's error reply. Returns the path."""
        self.streaming = False
        self.body_read = False
        if self.command != "POST" and not self._reads_body(self.path.split("?")[0].rstrip("/")):
            self._drain()
        routes: Routes = self.app.routes
        config = self.app.config
        path = "/"
        try:
            path = urlsplit(self.path).path.rstrip("/") or "/"
            check_host(self.headers, config.allowed_hosts, config.host)
            if is_keyless(path) or is_asset_path(path):
                route(path)  # the web app's files hold no data: its API calls do
            else:
                assert self.record is not None
                with admitted(routes.keys, self.headers, path, self.record, self.app.metrics):
                    route(path)
        except ServiceError as e:
            self._send_error(routes.errors(path, self.headers)(e))
        except ClientGone:
            log.info("client closed the connection: %s %s", self.command, self.path)
            self.close_connection = True
        except Exception as e:
            log.exception("unhandled error on %s %s", self.command, self.path)
            error = internal_error(f"Internal error: {e}")
            self._send_error(routes.errors(path, self.headers)(error))
        return path

    def _reads_body(self, path: str) -> bool:
        """A request other than a POST whose body an endpoint reads (Ollama's delete)."""
        return self.command == "DELETE" and path in OLLAMA_DELETE_PATHS

    def _head(self, path: str) -> None:
        if path not in HEAD_PATHS:
            self._not_allowed(path)
        self._get(path)

    def _get(self, path: str) -> None:
        endpoints = self.app.routes.openai
        ollama = self.app.routes.ollama
        if is_asset_path(path):
            self._send_asset(path)
        elif path in OLLAMA_VERSION_PATHS:
            self._send_json(200, ollama.version())
        elif path in OLLAMA_TAGS_PATHS:
            self._send_json(200, ollama.tags())
        elif path in OLLAMA_PS_PATHS:
            self._send_json(200, ollama.ps())
        elif path in HEALTH_PATHS:
            status, body = endpoints.health()
            self._send_json(status, body)
        elif path in MODELS_PATHS:
            query = urlsplit(self.path).query
            self._send_json(200, self.app.routes.models(self.headers, query))
        elif path in STATUS_PATHS:
            self._send_json(200, self.app.routes.status.status())
        elif path in METRICS_PATHS:
            self._send(200, self.app.metrics.render(), METRICS_CONTENT_TYPE)
        elif path in USAGE_PATHS:
            self._send_json(200, self.app.routes.usage.usage(urlsplit(self.path).query))
        elif path in KEYS_PATHS:
            self._send_json(200, self.app.routes.usage.keys())
        elif path in MCP_SERVERS_PATHS:
            self._send_json(200, {"object": "list", "data": self.app.routes.mcp.states()})
        elif path in OPENAPI_PATHS:
            self._send_json(200, document())
        elif path.startswith(MODEL_PREFIXES):
            model_id = unquote(path.split("/models/", 1)[1])
            self._send_json(200, self.app.routes.model(self.headers, model_id))
        elif path.startswith(RESPONSE_PREFIXES):
            self._send_json(200, self._stored_response(path))
        elif path.startswith(LINK_PREFIX):
            self._reply(self.app.routes.image_links.get(path))
        elif is_batch_path(path):
            self._batch(path)
        elif is_conversation_path(path):
            self._conversation(path)
        elif path in self.app.routes.sockets:
            raise ServiceError(
                ErrorKind.METHOD_NOT_ALLOWED,
                f"GET {path} opens a WebSocket (send Upgrade: websocket)"
                + ("; POST creates a response." if path in self.app.routes.post else "."),
                code="method_not_allowed",
            )
        else:
            self._unknown(path, tuple(self.app.routes.post))

    def _send_asset(self, path: str) -> None:
        found = asset(path)
        if found is None:
            raise not_found(f"Unknown path: {path}", code="unknown_url")
        self._send(200, found.data, found.content_type, PAGE_HEADERS)

    def _batch(self, path: str) -> None:
        """Files, OpenAI's batches and Anthropic's message batches (any method)."""
        batches = self.app.routes.batches
        self._routed(
            path, lambda query, body: batches.answer(self.command, path, query, body, self)
        )

    def _conversation(self, path: str) -> None:
        """Conversations and their items (any method)."""
        conversations = self.app.routes.responses.conversations
        self._routed(
            path, lambda query, body: conversations.answer(self.command, path, query, body)
        )

    def _routed(self, path: str, answer) -> None:
        """A path with ids in it, answered by its router: `answer(query, read_body)`."""

        def body() -> bytes:
            check_browser_post(self.headers, self.app.config.allowed_origins)
            return self._read_body(self.app.routes.body_limit(path))

        self._reply(answer(urlsplit(self.path).query, body))

    def _reply(self, result: dict | RawReply | None) -> None:
        """An endpoint's whole reply (None: it was streamed)."""
        if isinstance(result, RawReply):
            self._send(200, result.data, result.content_type)
        elif result is not None:
            self._send_json(200, result)

    def _delete(self, path: str) -> None:
        if is_batch_path(path):
            self._batch(path)
            return
        if is_conversation_path(path):
            self._conversation(path)
            return
        if path in OLLAMA_DELETE_PATHS:
            limit = self.app.routes.body_limit(path)
            self._reply(self.app.routes.ollama.delete(self._read_body(limit), self))
            return
        if not path.startswith(RESPONSE_PREFIXES):
            self._unknown(path, (*self.app.routes.post, *GET_PATHS))
        self._send_json(200, self._stored_response(path))

    def _stored_response(self, path: str) -> dict:
        query = urlsplit(self.path).query
        return self.app.routes.stored_response(self.command, unquote(path), query)

    def _post(self, path: str) -> None:
        endpoint = self.app.routes.post.get(path)
        if endpoint is None and is_batch_path(path):
            self._batch(path)
            return
        if endpoint is None and is_conversation_path(path):
            self._conversation(path)
            return
        if endpoint is None:
            self._unknown(path, GET_PATHS)
            return
        check_browser_post(self.headers, self.app.config.allowed_origins)
        self._reply(endpoint(self._read_body(self.app.routes.body_limit(path)), self))

    def _unknown(self, path: str, other_method_paths: tuple[str, ...]) -> None:
        if path in other_method_paths:
            raise ServiceError(
                ErrorKind.METHOD_NOT_ALLOWED,
                f"Method {self.command} is not allowed on {path}.",
                code="method_not_allowed",
            )
        raise not_found(f"Unknown path: {path}", code="unknown_url")

    # Requests ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """A body no endpoint reads (a GET's, a preflight's...) is read and dropped, so
        that it is never taken for the next request on the connection; one past the body
        limit closes the connection after the reply instead."""
        self.body_read = False
        if not self._has_body():
            return
        try:
            self._read_body(self.app.config.max_body_bytes)
        except ServiceError:
            self.close_connection = True

    def _read_body(self, limit: int) -> bytes:
        framing = body_framing(self.headers)
        if framing.length > limit:
            raise self._too_large(limit)
        silence = self.app.config.read_timeout
        seconds = body_seconds(framing.length if not framing.chunked else limit, silence)
        self.deadline.start(seconds)
        timed_out = False
        try:
            if framing.chunked:
                body = self._read_chunked(limit)
            else:
                body = self.rfile.read(framing.length) if framing.length else b""
        except TimeoutError:  # silent longer than --read-timeout
            body, timed_out = b"", True
        finally:
            self.deadline.cancel()
        short = not framing.chunked and len(body) < framing.length
        if timed_out or self.deadline.expired or short:
            self.close_connection = True
            raise ServiceError(
                ErrorKind.TIMEOUT,
                f"The request body did not arrive in time ({seconds:g} seconds for its "
                f"size; a silence of {silence:g}).",
                code="request_timeout",
            )
        self.body_read = True
        return body

    def _read_chunked(self, limit: int) -> bytes:
        body = bytearray()
        while True:
            size = chunk_size(self.rfile.readline(1024))
            if size == 0:
                while self.rfile.readline(1024).strip():
                    pass
                return bytes(body)
            if len(body) + size > limit:
                raise self._too_large(limit)
            body += self.rfile.read(size)
            self.rfile.readline(1024)

    def _too_large(self, limit: int) -> ServiceError:
        return ServiceError(
            ErrorKind.TOO_LARGE,
            f"The request body exceeds the limit of {limit} bytes.",
            code="request_too_large",
        )

    def open_stream(self, content_type: str = SSE_CONTENT_TYPE) -> BufferedIOBase:
        """Begin a streamed reply (the `Responder` endpoints are given)."""
        self.streaming = True
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Accel-Buffering", "no")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        return self.wfile

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def client_gone(self) -> bool:
        """Whether the client closed its end (the socket reads EOF) while we generate."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # Responses --------------------------------------------------------------------------

    def send_response(self, code: int, message: str | None = None) -> None:
        if self.record is not None:
            self.record.status = code
        super().send_response(code, message)

    def end_headers(self) -> None:
        record = self.record
        if record is not None:
            self.send_header("X-Request-Id", record.request_id)
            if record.generated and not self.streaming:  # a stream's usage says it instead
                hit = f"{record.cached_tokens}/{record.prompt_tokens}"
                self.send_header(PROMPT_CACHE_HEADER, hit)
        origin = self._allowed_origin()
        if origin:
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Access-Control-Expose-Headers", EXPOSED_HEADERS)
            if origin != "*":
                self.send_header("Vary", "Origin")
        super().end_headers()

    def _allowed_origin(self) -> str | None:
        allowed = self.app.config.allowed_origins
        if "*" in allowed:
            return "*"
        origin = self.headers.get("Origin")
        return origin if origin in allowed else None

    def _send_json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self._send(status, data, "application/json", headers)

    def _send(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command == "HEAD":  # its headers only, as HTTP has it
            return
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_error(self, reply: ErrorReply) -> None:
        if self.streaming:  # mid-stream: the only honest signal left is to hang up
            self.close_connection = True
            return
        if not self.body_read and self._has_body():
            self.close_connection = True  # its unread body would be taken as the next request
        if reply.status >= 500:
            log.error("%s %s -> %d: %s", self.command, self.path, reply.status, reply.error)
        else:  # why a client was refused, for the operator reading the log
            log.info("%s %s -> %d: %s", self.command, self.path, reply.status, reply.error)
        self._send_json(reply.status, reply.body, reply.headers)

    def _has_body(self) -> bool:
        length = self.headers.get("Content-Length", "0").strip()
        return length not in ("", "0") or "Transfer-Encoding" in self.headers

    def log_message(self, format: str, *args) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def log_request(self, code="-", size="-") -> None:
        """Answered requests get their access-log line from `_handle`; this line is for
        what http.server refuses itself (a malformed request line)."""
        if self.record is None:
            access_log.info('"%s" %s', self.requestline, code)
