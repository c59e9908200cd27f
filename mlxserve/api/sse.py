"""Streamed replies over a chunked HTTP/1.1 response: server-sent events, and NDJSON."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from io import BufferedIOBase
from typing import Protocol

from mlxserve.api.responder import SSE_CONTENT_TYPE, Responder
from mlxserve.protocol.errors import ClientGone, ServiceError, internal_error

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where a dialect's stream of events goes: server-sent events on an HTTP reply
    (SSEWriter), or text frames on a WebSocket (websocket.SocketEvents)."""

    started: bool  # the first event went out: an error can no longer be a plain reply

    def event(self, payload: dict, name: str | None = None) -> None: ...

    def comment(self, text: str) -> None:
        """Nothing for the client to read: a keepalive."""
        ...

    def keepalive(self, seconds: float, send: Callable[[], None]) -> Callable[[], None]: ...

    def close(self) -> None:
        """The end of the stream."""
        ...


class Paced:
    """A stream that knows when it last wrote, for its keepalives."""

    def __init__(self) -> None:
        self.last_write = time.monotonic()

    def silent_for(self, seconds: float) -> bool:
        """Whether nothing was written for `seconds`: time for a keepalive."""
        return time.monotonic() - self.last_write >= seconds

    def keepalive(self, seconds: float, send: Callable[[], None]) -> Callable[[], None]:
        """What a run calls while nothing arrives: `send` (the dialect's ping, a comment)
        once nothing was written for `seconds`, so that proxies and clients do not give up
        on a long prompt."""

        def tick() -> None:
            if self.silent_for(seconds):
                send()

        return tick


class ChunkedWriter(Paced):
    """A streamed body in HTTP/1.1 chunks. Sends the response headers with the first
    write, so that until then the request can still be answered with a plain HTTP error."""

    content_type = SSE_CONTENT_TYPE

    def __init__(self, responder: Responder):
        super().__init__()
        self._responder = responder
        self._body: BufferedIOBase | None = None
        self.started = False

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        self._body = self._responder.open_stream(self.content_type)

    def close(self) -> None:
        """The end of the body."""
        self.start()
        self._send(b"0\r\n\r\n")

    def _write(self, text: str) -> None:
        self.start()
        data = text.encode("utf-8")
        self._send(b"%x\r\n%s\r\n" % (len(data), data))

    def _send(self, data: bytes) -> None:
        body = self._body
        if body is None:  # opened by `start`, which every write calls first
            raise RuntimeError("the stream was not opened")
        try:
            body.write(data)
            body.flush()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, OSError) as e:
            raise ClientGone from e
        self.last_write = time.monotonic()


class SSEWriter(ChunkedWriter):
    """Server-sent events: `data:` lines, named events and comments."""

    def event(self, payload: dict, name: str | None = None) -> None:
        """A `data:` line with the payload; with `name`, an `event:` line before it."""
        data = f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
        self._write(f"event: {name}\n{data}" if name else data)

    def comment(self, text: str) -> None:
        self._write(f": {text}\n\n")

    def done(self) -> None:
        """OpenAI's end of stream: `data: [DONE]`, then the end of the body."""
        self._write("data: [DONE]\n\n")
        self.close()


class NDJSONWriter(ChunkedWriter):
    """Newline-delimited JSON (Ollama's streams): one object a line, never a blank one."""

    content_type = "application/x-ndjson"

    def line(self, payload: dict) -> None:
        self._write(json.dumps(payload, ensure_ascii=False) + "\n")


def keepalive(
    sink: EventSink | None, seconds: float, ping: Callable[[], None] | None = None
) -> Callable[[], None]:
    """What a run calls while nothing arrives (`GenerationRun.steps`): the dialect's `ping`
    (a `: keepalive` comment if none) once the stream was silent for `seconds`
    (--keepalive-seconds); nothing for a whole reply (no sink)."""
    if sink is None:
        return lambda: None
    return sink.keepalive(seconds, ping or (lambda: sink.comment("keepalive")))


def stream_failure(sse: EventSink | ChunkedWriter, error: Exception) -> ServiceError:
    """The error a begun stream ends with, in the dialect's error event: a bug is one too
    (a stream cut short without its last event looks like a network fault). Before the
    stream began, or when the client left, the error goes on to the HTTP handler."""
    if isinstance(error, ClientGone) or not sse.started:
        raise error
    if isinstance(error, ServiceError):
        return error
    log.error("unhandled error mid-stream", exc_info=error)
    return internal_error(f"Internal error: {error}")
