"""What every dialect's error rendering gives the HTTP handler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlxserve.protocol.errors import ServiceError


@dataclass(frozen=True)
class ErrorReply:
    status: int
    body: dict
    error: ServiceError

    @property
    def headers(self) -> dict[str, str]:
        retry = self.error.retry_after
        return {"Retry-After": str(retry)} if retry is not None else {}


ErrorRenderer = Callable[[ServiceError], ErrorReply]
