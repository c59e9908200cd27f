"""One request's record: its id (the client's X-Request-Id, or a new one), what it asked
for and what it cost. The HTTP thread answering a request holds it in a context variable,
so the service fills it in and every log line of the request carries its id."""

from __future__ import annotations

import contextvars
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

# A client's id is kept if it is short and plain (it goes into headers and log lines).
CLIENT_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def request_id(given: str | None) -> str:
    """The client's X-Request-Id when it is usable, else a new one."""
    if given and CLIENT_ID.fullmatch(given.strip()):
        return given.strip()
    return f"req_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class Metered:
    """What one request (or a sum of them) cost, as usage accounting counts it."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    audio_seconds: float = 0.0
    images: int = 0
    embedding_inputs: int = 0
    mcp_calls: int = 0  # calls to MCP tools the server ran for the request
    mcp_seconds: float = 0.0  # their time, waiting on the MCP servers

    @property
    def tokens(self) -> int:
        """What rate limits and quotas count: prompt (cached included) and completion."""
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Metered) -> Metered:
        return Metered(*(a + b for a, b in zip(_fields(self), _fields(other), strict=True)))


def _fields(metered: Metered) -> tuple:
    return tuple(getattr(metered, f.name) for f in fields(metered))


@dataclass
class RequestRecord:
    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.monotonic)
    model: str | None = None  # the served model, once the request names one that exists
    key: str | None = None  # the name of the API key it came with (None: no keys)
    status: int | None = None
    generated: bool = False  # it ran a generation (its tokens and latencies count)
    first_token: float | None = None  # monotonic time of the first generated token
    finished: float | None = None
    # Told each gap between two tokens of a sequence (model, seconds), as it happens.
    on_token_gap: Callable[[str, float], None] | None = None
    on_token: Callable[[float], None] | None = None  # told each token's time
    # Told each cost as it is known (usage accounting: it is written before it is
    # reported); the first carries the request itself (requests=1).
    on_metered: Callable[[Metered], None] | None = None
    metered: Metered = field(default_factory=Metered)
    unparsed_calls: int = 0  # tool-call blocks returned as content: they could not be read

    def token(self, at: float, previous: float | None) -> None:
        """A token arrived at `at`; `previous` is its sequence's last token, if any."""
        if self.first_token is None:
            self.first_token = at
        if self.on_token is not None:
            self.on_token(at)
        if previous is not None and self.on_token_gap is not None:
            self.on_token_gap(self.model or "", at - previous)

    def add_usage(self, prompt: int, cached: int, completion: int) -> None:
        self.meter(
            Metered(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion)
        )

    @property
    def prompt_tokens(self) -> int:
        return self.metered.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return self.metered.cached_tokens

    @property
    def completion_tokens(self) -> int:
        return self.metered.completion_tokens

    def meter(self, cost: Metered) -> None:
        """Count `cost` against the request (the first cost also counts the request)."""
        if not self.metered.requests:
            cost += Metered(requests=1)
        self.metered += cost
        if self.on_metered is not None:
            self.on_metered(cost)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    @property
    def tokens_per_second(self) -> float | None:
        """Decoding speed after the first token."""
        if self.first_token is None or self.completion_tokens < 2:
            return None
        decoding = (self.finished or time.monotonic()) - self.first_token
        return (self.completion_tokens - 1) / decoding if decoding > 0 else None

    def access_line(self) -> str:
        parts = [f'"{self.method} {self.path}" {self.status}']
        if self.model is not None:
            parts.append(f"model={self.model}")
        if self.prompt_tokens or self.completion_tokens:
            parts.append(
                f"prompt={self.prompt_tokens} cached={self.cached_tokens} "
                f"completion={self.completion_tokens}"
            )
        if self.ttft is not None:
            parts.append(f"ttft={self.ttft:.3f}s")
        if (speed := self.tokens_per_second) is not None:
            parts.append(f"tok/s={speed:.1f}")
        if self.unparsed_calls:
            parts.append(f"unparsed_calls={self.unparsed_calls}")
        parts.append(f"time={self.elapsed:.3f}s")
        return " ".join(parts)


_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "mlxserve_request", default=None
)


@contextmanager
def recording(record: RequestRecord) -> Iterator[RequestRecord]:
    """The block's log lines carry the request's id (RequestIdFilter). Only the logs read
    it from here: the core is given the request (service/context.py)."""
    token = _current.set(record)
    try:
        yield record
    finally:
        _current.reset(token)


class RequestIdFilter(logging.Filter):
    """Puts `[request id] ` before every log line written while a request is answered
    (as `%(request)s`; empty outside requests)."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = _current.get()
        record.request = f"[{current.request_id}] " if current is not None else ""
        return True
