"""WebSocket connections on the standard library's HTTP server (RFC 6455).

The `websockets` library's sans-I/O protocol does the framing, masking, UTF-8 and size
checks, ping/pong and the closing handshake; this module feeds it the connection's bytes on
the connection's own thread (http.server gives each connection one) and writes what it
answers. The handshake request was already read by http.server: its head is handed to the
protocol as it arrived."""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from email.message import Message
from io import BufferedIOBase

from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from mlxserve.api.sse import Paced
from mlxserve.protocol.errors import ClientGone, bad_request

log = logging.getLogger(__name__)
# The protocol's own lines ("connection open") repeat the server's: its warnings only.
protocol_log = logging.getLogger(f"{__name__}.protocol")
protocol_log.setLevel(logging.WARNING)

READ_SIZE = 64 * 1024
CLOSING_SECONDS = 2.0  # how long a closing handshake waits for the client's answer
LEAVING_POLL_SECONDS = 0.25  # how often a waiting session looks whether the server stops
# Browsers cannot set headers on a WebSocket: they send the key as a subprotocol.
KEY_SUBPROTOCOL = "openai-insecure-api-key."


def is_upgrade(headers: Message) -> bool:
    """Whether a request asks to become a WebSocket."""
    upgrade = headers.get("Upgrade", "").lower()
    connection = headers.get("Connection", "").lower()
    return upgrade == "websocket" and "upgrade" in connection


def subprotocol_key(headers: Message) -> str | None:
    """The API key a browser sent as the `openai-insecure-api-key.KEY` subprotocol."""
    for offered in _offered(headers):
        if offered.startswith(KEY_SUBPROTOCOL):
            return offered[len(KEY_SUBPROTOCOL) :]
    return None


def _offered(headers: Message) -> list[str]:
    values = headers.get_all("Sec-WebSocket-Protocol") or []
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _choose_subprotocol(
    _protocol: ServerProtocol, offered: Sequence[Subprotocol]
) -> Subprotocol | None:
    """A browser that offers subprotocols fails the connection unless one is chosen: the
    first one that is not a key (`realtime`), else the key's own (echoed to this client
    only, which sent it)."""
    plain = [name for name in offered if not name.startswith(KEY_SUBPROTOCOL)]
    chosen = plain or list(offered)
    return chosen[0] if chosen else None


class ClosedSocket(Exception):
    """The connection is closed (by the client, or by the server)."""


class WebSocket:
    """One open WebSocket: messages in (`receive`), JSON text frames out (`send_json`)."""

    def __init__(
        self, protocol: ServerProtocol, connection: socket.socket, idle: float, path: str = ""
    ):
        self.path = path  # the request's target, its query included
        # a session may send from a thread of its own while the connection's reads
        self._lock = threading.RLock()
        self._protocol = protocol
        self._connection = connection
        self._idle = idle
        self._leaving = False  # the server is shutting down (`going_away`)
        self._messages: deque[str | bytes] = deque()
        self._fragments: list[bytes] = []
        self._opcode: Opcode | None = None  # the type of the message being assembled

    @classmethod
    def accept(
        cls,
        path: str,
        headers: Message,
        connection: socket.socket,
        reader: BufferedIOBase,
        max_size: int,
        idle: float,
    ) -> WebSocket:
        """Answer the handshake with 101; a malformed one is a 400 (no reply sent yet)."""
        protocol = ServerProtocol(
            max_size=max_size, select_subprotocol=_choose_subprotocol, logger=protocol_log
        )
        head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        protocol.receive_data(head.encode("latin-1", errors="replace") + b"\r\n")
        request = next(iter(protocol.events_received()), None)
        response = protocol.accept(request) if isinstance(request, Request) else None
        if response is None or response.status_code != 101:
            reason = protocol.handshake_exc or "not a WebSocket handshake"
            raise bad_request(f"The WebSocket handshake failed: {reason}.")
        protocol.send_response(response)
        socket_ = cls(protocol, connection, idle, path)
        socket_._flush()
        socket_._take_buffered(reader)
        return socket_

    @property
    def subprotocol(self) -> str | None:
        return self._protocol.subprotocol

    @property
    def closed(self) -> bool:
        return self._protocol.state is not State.OPEN

    def __iter__(self) -> Iterator[str | bytes]:
        """Each message until the connection closes (the client's close, its silence for
        the idle timeout, a protocol error, a message over the size limit)."""
        while True:
            message = self.receive()
            if message is None:
                return
            yield message

    def receive(self) -> str | bytes | None:
        """The next whole message; None once the connection is closed (the client's
        close, its silence for the idle timeout, the server going away)."""
        deadline = time.monotonic() + self._idle
        while not self._messages:
            if self.closed:
                return None
            if self._leaving:
                self.close(CloseCode.GOING_AWAY, "server shutting down")
                return None
            if time.monotonic() >= deadline:
                self.close(CloseCode.GOING_AWAY, "idle timeout")
                return None
            wait = min(LEAVING_POLL_SECONDS, deadline - time.monotonic())
            try:
                readable, _, _ = select.select([self._connection], [], [], max(wait, 0))
                if readable:
                    self._feed(self._connection.recv(READ_SIZE))
            except (OSError, ValueError):
                self._abort()
        return self._messages.popleft()

    def going_away(self) -> None:
        """From another thread, at shutdown: the session closes with 1001 as soon as its
        turn (if one runs) has ended."""
        self._leaving = True

    def gone(self) -> bool:
        """Whether the client has left, reading what it sent meanwhile without waiting (a
        message is kept for `receive`, a ping answered): a run polls this as it generates."""
        try:
            while not self.closed:
                readable, _, _ = select.select([self._connection], [], [], 0)
                if not readable:
                    break
                self._feed(self._connection.recv(READ_SIZE))
        except (OSError, ValueError):
            self._abort()
        return self.closed

    def send_json(self, payload: dict) -> None:
        """One text frame; ClosedSocket when the connection is closed."""
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        with self._lock:
            if self.closed:
                raise ClosedSocket
            self._protocol.send_text(data)
            self._flush()

    def ping(self) -> None:
        """A keepalive while a long prompt is read (the client's library answers it)."""
        with self._lock:
            if not self.closed:
                self._protocol.send_ping(b"")
                self._flush()

    def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """The closing handshake: our close frame, the client's answer (briefly awaited),
        then the end of the TCP connection."""
        with self._lock:
            if self._protocol.state is State.OPEN:
                self._protocol.send_close(code, reason)
                self._flush()
        self._connection.settimeout(CLOSING_SECONDS)
        try:
            while self._protocol.state is not State.CLOSED:
                self._feed(self._connection.recv(READ_SIZE))  # b"" once shut: the end
        except OSError:
            self._abort()

    def _take_buffered(self, reader: BufferedIOBase) -> None:
        """Bytes that came with the handshake's head (the HTTP reader's buffer): frames the
        client sent without waiting for our answer."""
        self._connection.setblocking(False)
        try:
            buffered = reader.peek()  # type: ignore[attr-defined]  # a BufferedReader's
        finally:
            self._connection.settimeout(CLOSING_SECONDS)  # reads follow select()
        if buffered:
            self._feed(reader.read(len(buffered)))

    def _feed(self, data: bytes) -> None:
        with self._lock:
            if data:
                self._protocol.receive_data(data)
            else:
                self._protocol.receive_eof()
            for event in self._protocol.events_received():
                if isinstance(event, Frame):
                    self._frame(event)
            self._flush()

    def _frame(self, frame: Frame) -> None:
        """Data frames assembled into messages (control frames the protocol answers)."""
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
            self._opcode, self._fragments = frame.opcode, []
        elif frame.opcode is not Opcode.CONT:
            return
        self._fragments.append(bytes(frame.data))
        if not frame.fin:
            return
        data = b"".join(self._fragments)
        self._fragments = []
        if self._opcode is Opcode.BINARY:
            self._messages.append(data)
            return
        try:
            self._messages.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            self._protocol.fail(CloseCode.INVALID_DATA, "text frames must be UTF-8")

    def _flush(self) -> None:
        try:
            for data in self._protocol.data_to_send():
                if data:
                    self._connection.sendall(data)
                else:  # the protocol's end of stream: the closing handshake is done
                    self._connection.shutdown(socket.SHUT_WR)
        except OSError:
            self._abort()

    def _abort(self) -> None:
        """The connection broke: nothing more can be read or sent."""
        with self._lock:
            if self._protocol.state is not State.CLOSED:
                self._protocol.receive_eof()
                self._protocol.data_to_send()  # nothing can go out now


class SocketEvents(Paced):
    """One turn's stream of events as text frames (an EventSink): each event one frame,
    its `type` inside it; keepalives are pings. The socket stays open when it ends."""

    def __init__(self, socket_: WebSocket):
        super().__init__()
        self._socket = socket_
        self.started = False

    def event(self, payload: dict, name: str | None = None) -> None:
        self.started = True
        try:
            self._socket.send_json(payload)
        except ClosedSocket as e:
            raise ClientGone from e
        self.last_write = time.monotonic()

    def comment(self, text: str) -> None:
        self._socket.ping()
        self.last_write = time.monotonic()

    def close(self) -> None:
        """The turn is over; the connection waits for the next message."""


class OpenSockets:
    """The sessions open now: counted on the status page, told to go away at shutdown."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[WebSocket] = set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    @contextmanager
    def holding(self, socket_: WebSocket) -> Iterator[None]:
        with self._lock:
            self._open.add(socket_)
        try:
            yield
        finally:
            with self._lock:
                self._open.discard(socket_)

    def going_away(self) -> None:
        with self._lock:
            open_now = list(self._open)
        for socket_ in open_now:
            socket_.going_away()

    def wait_closed(self, seconds: float) -> bool:
        """Wait up to `seconds` for every session to end; whether all did."""
        deadline = time.monotonic() + seconds
        while len(self) and time.monotonic() < deadline:
            time.sleep(0.02)
        return not len(self)
