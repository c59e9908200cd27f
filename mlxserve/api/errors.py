"""What every dialect's error rendering gives the HTTP handler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
