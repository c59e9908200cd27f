"""Who is asking: the key a request came with, held in a context variable by the thread
answering it, so that the service can refuse a model the key may not use."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from mlxserve.protocol.errors import ErrorKind, ServiceError


@dataclass(frozen=True)
class Caller:
    name: str | None  # None: an open server (no keys): no limits, no accounting
    models: tuple[str, ...] | None = None  # None: every model
    admin: bool = True

    def allows(self, *names: str | None) -> bool:
        """Whether any of `names` (a model's id, an alias, its adapter's) is the key's."""
        return self.models is None or any(n in self.models for n in names if n)


OPEN = Caller(None)

_current: contextvars.ContextVar[Caller] = contextvars.ContextVar("mlxserve_caller", default=OPEN)


def current_caller() -> Caller:
    return _current.get()


@contextmanager
def calling(caller: Caller) -> Iterator[Caller]:
    token = _current.set(caller)
    try:
        yield caller
    finally:
        _current.reset(token)


def model_refused(model: str) -> ServiceError:
    return ServiceError(
        ErrorKind.FORBIDDEN,
        f"This API key may not use the model '{model}'.",
        param="model",
        code="model_not_allowed",
    )


def admin_only() -> ServiceError:
    return ServiceError(
        ErrorKind.FORBIDDEN, "This endpoint needs an admin API key.", code="admin_required"
    )
