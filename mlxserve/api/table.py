"""The route table's entries: each route declared once, beside its dialect, with all its
facts (method, path, handler, what its body and replies are, its error shape, who may ask,
how large its body may be). The router serves them, the access gate reads who may ask,
the OpenAPI document describes them and the metrics label requests by them: a route that
exists is served, guarded and documented by construction."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from email.message import Message
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from mlxserve.api.errors import Errors
from mlxserve.api.responder import RawReply, Responder
from mlxserve.config import ServerConfig
from mlxserve.keys.caller import Caller
from mlxserve.service.context import RequestContext

Schema = dict[str, Any]
# An endpoint's whole reply: JSON, another type (RawReply), or None once it streamed.
Reply = dict | RawReply | None
# A WebSocket session's turn: one message answered as a request of its own (admitted,
# recorded, counted), given whether the session's client has left.
Turn = Callable[[Callable[[], bool]], AbstractContextManager[RequestContext]]
UPLOAD_OVERHEAD = 64 * 1024  # a multipart form's fields beside its file


@dataclass
class Call:
    """What a route's handler is given of its request."""

    params: dict[str, str]  # the path's {parameters}, unquoted
    query: str
    headers: Message
    responder: Responder
    read_body: Callable[[], bytes]  # within the route's body limit

    @cached_property
    def body(self) -> bytes:
        return self.read_body()

    @property
    def context(self) -> RequestContext:
        return self.responder.context


E = TypeVar("E")
Handler = Callable[[E, Call], Reply]


@dataclass(frozen=True)
class Route(Generic[E]):
    """One method on one path. `path` is its documented spelling, `{name}` a segment,
    `{name:path}` the rest of the path (a model id has slashes). A path under /v1 also
    answers without it; `also`: more spellings."""

    method: str
    path: str
    handler: Callable[[E, Call], Reply]
    summary: str
    tag: str
    reply: dict[str, Schema]  # content type -> schema of a 200
    errors: Errors
    # The wire model of its JSON body (or any of several), or the schema of its form.
    body: type[BaseModel] | tuple[type[BaseModel], ...] | Schema | None = None
    query: dict[str, Schema] = field(default_factory=dict)
    headers: dict[str, Schema] = field(default_factory=dict)  # that change the reply
    admin: bool = False  # an admin key, where the server has keys
    keyless: bool = False  # answered without a key
    head: bool = False  # HEAD answers its headers too
    body_limit: Callable[[ServerConfig], int] | None = None  # else --max-body-bytes
    also: tuple[str, ...] = ()

    @property
    def spellings(self) -> tuple[str, ...]:
        return (*spellings(self.path), *self.also)

    @property
    def takes_body(self) -> bool:
        return self.method == "POST" or self.body is not None

    @property
    def models(self) -> tuple[type[BaseModel], ...]:
        if isinstance(self.body, type):
            return (self.body,)
        return self.body if isinstance(self.body, tuple) else ()

    def limit(self, config: ServerConfig) -> int:
        if self.body_limit is None:
            return config.max_body_bytes
        return max(config.max_body_bytes, self.body_limit(config))


def spellings(path: str) -> tuple[str, ...]:
    """The paths a route answers at: a path under /v1 answers without it too."""
    return (path, path.removeprefix("/v1")) if path.startswith("/v1/") else (path,)


def upload(limit: Callable[[ServerConfig], int]) -> Callable[[ServerConfig], int]:
    """The body limit of a form carrying a file of up to `limit` bytes, with its fields."""
    return lambda config: limit(config) + UPLOAD_OVERHEAD


def with_body(
    endpoint: Callable[[E, bytes, Responder], Reply],
) -> Callable[[E, Call], Reply]:
    """A handler for the endpoints that take the request's body and its connection."""
    return lambda endpoints, call: endpoint(endpoints, call.body, call.responder)


def plain(endpoint: Callable[[E], Reply]) -> Callable[[E, Call], Reply]:
    """A handler for the endpoints that need nothing of the request."""
    return lambda endpoints, call: endpoint(endpoints)


def as_caller(endpoint: Callable[[E, Caller], Reply]) -> Callable[[E, Call], Reply]:
    """A handler for the endpoints whose reply depends on who asks (what its key may use)."""
    return lambda endpoints, call: endpoint(endpoints, call.context.caller)


def by_id(endpoint: Callable[[E, str], Reply], param: str) -> Callable[[E, Call], Reply]:
    """A handler for the endpoints that take one id of the path."""
    return lambda endpoints, call: endpoint(endpoints, call.params[param])


@dataclass(frozen=True)
class SocketRoute(Generic[E]):
    """A GET path a WebSocket opens on; each of the session's messages is answered as a
    request of its own (`turn`)."""

    path: str
    # (endpoints, socket, the upgrade request's context, turn)
    session: Callable[[E, Any, RequestContext, Turn], None]

    @property
    def spellings(self) -> tuple[str, ...]:
        return spellings(self.path)
