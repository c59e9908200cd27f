"""Server-sent events over a chunked HTTP/1.1 response."""

from __future__ import annotations

import json
import time


class ClientGone(Exception):
    """The client closed its connection."""


class SSEWriter:
    def __init__(self, handler):
        self._handler = handler
        self.last_write = time.monotonic()

    def start(self) -> None:
        handler = self._handler
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("X-Accel-Buffering", "no")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

    def event(self, payload: dict) -> None:
        self._write(f"data: {json.dumps(payload, ensure_ascii=False)}\n\n")

    def comment(self, text: str) -> None:
        self._write(f": {text}\n\n")

    def done(self) -> None:
        self._write("data: [DONE]\n\n")
        self._send(b"0\r\n\r\n")

    def _write(self, text: str) -> None:
        data = text.encode("utf-8")
        self._send(b"%x\r\n%s\r\n" % (len(data), data))

    def _send(self, data: bytes) -> None:
        try:
            self._handler.wfile.write(data)
            self._handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, OSError) as e:
            raise ClientGone from e
        self.last_write = time.monotonic()
