"""What every dialect's error rendering gives the HTTP handler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message

from mlxserve.protocol.errors import ErrorKind, ServiceError


@dataclass(frozen=True)
class ErrorReply:
    status: int
    body: dict
    error: ServiceError

    @property
    def headers(self) -> dict[str, str]:
        retry = self.error.retry_after
        headers = {"Retry-After": str(retry)} if retry is not None else {}
        if self.error.kind is ErrorKind.QUOTA_EXCEEDED:
            # Hours away: the SDKs would sleep that long before their retry (Anthropic's
            # does); both obey this header and raise at once.
            headers["X-Should-Retry"] = "false"
        return headers


ErrorRenderer = Callable[[ServiceError], ErrorReply]


@dataclass(frozen=True)
class ErrorShape:
    """A dialect's error body: how a neutral error is rendered in it, and the name of its
    schema in the OpenAPI document."""

    component: str
    render: ErrorRenderer


@dataclass(frozen=True)
class Errors:
    """The shape a route's errors go out in; `asked`: another shape a request may ask
    for by its headers (Anthropic's model list, asked with anthropic-version)."""

    shape: ErrorShape
    asked: tuple[Callable[[Message], bool], ErrorShape] | None = None

    def renderer(self, headers: Message | None) -> ErrorRenderer:
        if self.asked is not None and headers is not None and self.asked[0](headers):
            return self.asked[1].render
        return self.shape.render

    @property
    def components(self) -> tuple[str, ...]:
        return (self.shape.component,) + ((self.asked[1].component,) if self.asked else ())
