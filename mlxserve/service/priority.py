"""The priority of the work the current thread asks for: batch work runs at idle priority
(engine/generation/jobs.py's `idle_priority`). A context variable, so that the batch runner replays a
line through the same endpoint a client calls, and every run it starts is marked."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_idle = contextvars.ContextVar("idle_priority", default=False)


@contextmanager
def idle_priority() -> Iterator[None]:
    """Generation asked for inside runs at idle priority."""
    token = _idle.set(True)
    try:
        yield
    finally:
        _idle.reset(token)


def at_idle_priority() -> bool:
    return _idle.get()
