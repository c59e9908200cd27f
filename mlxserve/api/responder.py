"""What an endpoint may do with the connection it answers, beyond returning a reply."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from io import BufferedIOBase
from typing import Protocol

from mlxserve.service.context import RequestContext

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


@dataclass(frozen=True)
class RawReply:
    """A whole reply given as bytes: one that is not JSON (a transcript as text,
    synthesised audio, a page), or JSON with a status other than 200."""

    content_type: str
    data: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


def json_reply(status: int, body: dict) -> RawReply:
    return RawReply("application/json", json.dumps(body, ensure_ascii=False).encode(), status)


class Responder(Protocol):
    # The request this answers, as the core is told of it: its caller, its record, its
    # client's leaving, its priority.
    context: RequestContext

    def client_gone(self) -> bool:
        """Whether the client has closed its end (generation for it can stop)."""
        ...

    def open_stream(self, content_type: str = SSE_CONTENT_TYPE) -> BufferedIOBase:
        """Begin a streamed reply (server-sent events unless told otherwise): its headers
        go out now, and from here an error can no longer be an HTTP reply. Returns where
        the chunked body goes."""
        ...

    def header(self, name: str) -> str | None:
        """A header of the request (multipart bodies name their boundary in one)."""
        ...
