"""HTTP plumbing on the standard library: routing, auth, body limits, CORS, error bodies."""

from __future__ import annotations

import json
import logging
import select
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Protocol, cast
from urllib.parse import urlsplit

from mlxserve.api.access import SPENDING_METHODS, WEBSOCKET_METHOD, admitted, count_request
from mlxserve.api.deadline import ReadDeadline
from mlxserve.api.errors import ErrorReply
from mlxserve.api.guards import (
    body_framing,
    check_browser_post,
    check_host,
    check_origin,
    chunk_size,
)
from mlxserve.api.responder import SSE_CONTENT_TYPE, RawReply
from mlxserve.api.router import Found, Router
from mlxserve.api.table import Call, Reply, Turn
from mlxserve.api.websocket import OpenSockets, WebSocket, is_upgrade
from mlxserve.config import ServerConfig
from mlxserve.keys.caller import OPEN
from mlxserve.keys.gate import KeyGate
from mlxserve.protocol.errors import ClientGone, ErrorKind, ServiceError, internal_error
from mlxserve.service.context import RequestContext
from mlxserve.telemetry.activity import Activity
from mlxserve.telemetry.metrics import Metrics
from mlxserve.telemetry.record import RequestRecord, recording, request_id

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


class Edge(Protocol):
    """What the handler answers with (api.routes.Routes): the route table, the key gate,
    the counters."""

    router: Router
    keys: KeyGate
    activity: Activity
    open_sockets: OpenSockets
    metrics: Metrics


class Serving(Protocol):
    """What the handler needs of the HTTP server it runs under (server.MLXServer)."""

    config: ServerConfig

    @property
    def routes(self) -> Edge: ...

    def answering(self) -> AbstractContextManager[None]: ...


class APIHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mlxserve"
    streaming = False  # an SSE response has begun: errors can no longer be a reply
    record: RequestRecord | None = None  # the request being answered
    context: RequestContext  # the same, as the core is told of it (set once admitted)

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
        if is_upgrade(self.headers) and path in self.app.routes.router.sockets:
            self._handle(upgrade=True)  # each of its messages is answered as a request
            return
        self._answering()

    def __getattr__(self, name: str):
        """POST, DELETE, HEAD and any other method (PUT, PATCH...): answered by the route
        table, a 405 in the path's dialect where no route takes it (http.server would
        answer 501 in HTML)."""
        if name.startswith("do_"):
            return self._answering
        raise AttributeError(name)

    def _answering(self) -> None:
        with self.app.answering():
            self._handle()

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

    def _handle(self, upgrade: bool = False) -> None:
        """Answer one request (or open a WebSocket), then write its access-log line and
        count it."""
        self.record = RequestRecord(
            request_id(self.headers.get("X-Request-Id")),
            self.command,
            self.path,
            on_token_gap=self.app.routes.metrics.observe_token_gap,
            on_token=self.app.routes.activity.token,
        )
        with recording(self.record):
            path = self._answer(upgrade)
            self._account(self.record, path)

    def _account(self, record: RequestRecord, path: str) -> None:
        """A request answered: its access-log line, its metrics, its place in the activity."""
        count_request(record)
        record.finished = time.monotonic()
        access_log.info(record.access_line())
        self.app.routes.metrics.observe(record, self.app.routes.router.label(path))
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
                route, endpoints = self.app.routes.router.sockets[path]
                route.session(endpoints, socket_, self.context, self._turns(path))
        finally:
            socket_.close()
            log.info("WebSocket closed on %s for %s", path, peer)

    def _turns(self, path: str) -> Turn:
        return lambda gone: self._turn(path, gone)

    @contextmanager
    def _turn(self, path: str, gone: Callable[[], bool]) -> Iterator[RequestContext]:
        """One message of a WebSocket session, answered as a request of its own: admitted
        with the session's key (rate limits and quotas apply to each), recorded, counted;
        `gone`: whether the session's client has left."""
        record = RequestRecord(
            request_id(None),
            WEBSOCKET_METHOD,
            path,
            status=200,
            on_token_gap=self.app.routes.metrics.observe_token_gap,
            on_token=self.app.routes.activity.token,
        )
        routes = self.app.routes
        with recording(record):
            try:
                with (
                    self.app.answering(),
                    admitted(routes.keys, self.headers, False, record, routes.metrics) as caller,
                ):
                    yield RequestContext(caller, record, gone)
            except ServiceError as e:
                record.status = routes.router.errors("POST", path)(e).status
                raise
            except ClientGone:
                raise
            except Exception:
                record.status = 500
                raise
            finally:
                self._account(record, path)

    def _answer(self, upgrade: bool) -> str:
        """Route the request; errors become the dialect's error reply. Returns the path."""
        self.streaming = False
        self.body_read = False
        edge = self.app.routes
        config = self.app.config
        path = urlsplit(self.path).path.rstrip("/") or "/"
        found: Found | None = None
        unrouted: ServiceError | None = None
        if not upgrade:
            try:
                found = edge.router.resolve(self.command, path)
            except ServiceError as e:
                unrouted = e  # answered once the key is checked: no key, no map of paths
        if self.command != "POST" and not (found is not None and found.route.takes_body):
            self._drain()
        try:
            check_host(self.headers, config.allowed_hosts, config.host)
            assert self.record is not None
            if found is not None and found.route.keyless:
                self.context = RequestContext(OPEN, self.record, self.client_gone)
                self._dispatch(found)
            else:
                admin = found is not None and found.route.admin
                with admitted(edge.keys, self.headers, admin, self.record, edge.metrics) as caller:
                    self.context = RequestContext(caller, self.record, self.client_gone)
                    if unrouted is not None:
                        raise unrouted
                    if found is None:
                        self._upgrade(path)
                    else:
                        self._dispatch(found)
        except ServiceError as e:
            self._send_error(edge.router.errors(self.command, path, self.headers)(e))
        except ClientGone:
            log.info("client closed the connection: %s %s", self.command, self.path)
            self.close_connection = True
        except Exception as e:
            log.exception("unhandled error on %s %s", self.command, self.path)
            error = internal_error(f"Internal error: {e}")
            self._send_error(edge.router.errors(self.command, path, self.headers)(error))
        return path

    def _dispatch(self, found: Found) -> None:
        """Call the route's handler; send its whole reply (None: it streamed)."""
        route = found.route

        def read_body() -> bytes:
            check_browser_post(self.headers, self.app.config.allowed_origins)
            return self._read_body(route.limit(self.app.config))

        query = urlsplit(self.path).query
        self._reply(found.mounted.answer(Call(found.params, query, self.headers, self, read_body)))

    def _reply(self, result: Reply) -> None:
        if isinstance(result, RawReply):
            self._send(result.status, result.data, result.content_type, result.headers)
        elif result is not None:
            self._send_json(200, result)

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
