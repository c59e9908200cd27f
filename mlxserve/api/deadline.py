"""A deadline on reading from a connection. A socket timeout bounds each read, not their
sum: a client sending a byte every few seconds would hold its connection for ever. When the
deadline passes, a timer stops the connection's reading side, so the read in progress
returns what has arrived and the handler can still answer 408."""

from __future__ import annotations

import contextlib
import socket
import threading


class ReadDeadline:
    def __init__(self, connection: socket.socket):
        self._connection = connection
        self._timer: threading.Timer | None = None
        self.expired = False

    def start(self, seconds: float) -> None:
        self.cancel()
        self.expired = False
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _cut(self) -> None:
        self.expired = True
        with contextlib.suppress(OSError):  # already closed
            self._connection.shutdown(socket.SHUT_RD)
