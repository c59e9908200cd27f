"""What an endpoint may do with the connection it answers, beyond returning a reply."""

from __future__ import annotations

from io import BufferedIOBase
from typing import Protocol


class Responder(Protocol):
    def client_gone(self) -> bool:
        """Whether the client has closed its end (generation for it can stop)."""
        ...

    def open_stream(self) -> BufferedIOBase:
        """Begin a server-sent event stream: its headers go out now, and from here an
        error can no longer be an HTTP reply. Returns where the chunked body goes."""
        ...
