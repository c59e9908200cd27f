"""What the server has been doing lately, for the web app's status page: the last requests
answered, and the tokens generated per second across all of them."""

from __future__ import annotations

import threading
import time
from collections import deque

from mlxserve.telemetry.record import RequestRecord

RECENT_REQUESTS = 50
RATE_WINDOW_SECONDS = 10


class Activity:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: deque[dict] = deque(maxlen=RECENT_REQUESTS)
        self._tokens: deque[float] = deque()  # when each token of the window came out

    def token(self, at: float) -> None:
        """A token was generated at `at` (monotonic seconds)."""
        with self._lock:
            self._tokens.append(at)
            self._forget(at)

    def tokens_per_second(self) -> float:
        """Tokens generated over the last RATE_WINDOW_SECONDS, per second."""
        with self._lock:
            self._forget(time.monotonic())
            return len(self._tokens) / RATE_WINDOW_SECONDS

    def _forget(self, now: float) -> None:
        while self._tokens and self._tokens[0] < now - RATE_WINDOW_SECONDS:
            self._tokens.popleft()

    def finished(self, record: RequestRecord) -> None:
        """A request was answered: it joins the recent ones (health checks and polls of
        the status itself do not)."""
        with self._lock:
            self._recent.appendleft(summary(record))

    def recent(self) -> list[dict]:
        with self._lock:
            return list(self._recent)


def summary(record: RequestRecord) -> dict:
    ended = time.time() - (time.monotonic() - (record.finished or time.monotonic()))
    return {
        "request_id": record.request_id,
        "key": record.key,
        "method": record.method,
        "path": record.path,
        "status": record.status,
        "model": record.model,
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "ttft_seconds": record.ttft,
        "seconds": record.elapsed,
        "tokens_per_second": record.tokens_per_second,
        "finished_at": ended,
    }
