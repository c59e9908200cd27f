"""The server's side of keys: who a secret belongs to, whether they may start a request
now (rate, concurrency and daily quota), and their usage, written as it is known.

The store is read again within `REFRESH_SECONDS` of another process changing it, so a
key created or revoked with `mlxserve keys` counts on a running server without a restart.
Per-minute rates and concurrency are counted in this process; the daily quota is read
from the store, so servers sharing one file share it."""

from __future__ import annotations

import hmac
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlxserve.keys.caller import OPEN, Caller
from mlxserve.keys.records import API_KEY_NAME, MAX_SECRET_CHARS, KeyRecord, digest
from mlxserve.keys.store import KeyStore, UsageRow, day_of
from mlxserve.protocol.errors import ErrorKind, ServiceError
from mlxserve.telemetry.record import Metered

log = logging.getLogger(__name__)

REFRESH_SECONDS = 0.25
WINDOW_SECONDS = 60.0  # what "per minute" counts
DAY_SECONDS = 86_400


@dataclass
class _Traffic:
    """One key's recent requests and tokens, and its requests in flight."""

    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    in_flight: int = 0

    def forget_before(self, since: float) -> None:
        while self.requests and self.requests[0] <= since:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= since:
            self.tokens.popleft()


class KeyGate:
    def __init__(self, path: Path, api_key: str | None, create: bool):
        """`create`: open (or make) the store now (--keys-db was given); else it is
        opened once a file exists at `path` (the first `mlxserve keys create`)."""
        self.path = path
        self._api_key = api_key
        self._store: KeyStore | None = KeyStore(path) if create or path.exists() else None
        self._keys: dict[str, KeyRecord] = {}
        self._version: int | None = None
        self._checked = 0.0
        self._traffic: dict[str, _Traffic] = {}
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._refresh(force=True)

    @property
    def required(self) -> bool:
        """Whether a request needs a key: --api-key was given, or the store has keys (a
        revoked last key does not open the server again)."""
        self._refresh()
        return bool(self._api_key) or bool(self._keys)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    @contextmanager
    def admit(self, secret: str | None, spends: bool = True) -> Iterator[Caller]:
        """The caller `secret` belongs to, counted as in flight while the block runs; a
        401 for no key or an unknown one, a 429 (with Retry-After) over a limit. A request
        that `spends` no tokens (a read: models, usage, a batch's state) is held to the
        request rate and concurrency only, so a key out of tokens can still look."""
        given = (secret or "").strip()
        if given and not self.required:
            self._refresh(force=True)  # the first key, made a moment ago, counts at once
        if not self.required:
            yield OPEN
            return
        if self._api_key and hmac.compare_digest(given.encode(), self._api_key.encode()):
            yield Caller(API_KEY_NAME)
            return
        record = self._known(given)
        with self._lock:
            traffic = self._traffic.setdefault(record.name, _Traffic())
            self._check(record, traffic, time.time(), spends)
            traffic.requests.append(time.monotonic())
            traffic.in_flight += 1
        try:
            yield Caller(record.name, record.models, record.admin)
        finally:
            with self._lock:
                traffic.in_flight -= 1

    def charge(self, key: str, model: str, cost: Metered) -> None:
        """Count `cost` (on disk before the reply that reports it goes out)."""
        if self._store is None:
            return
        self._store.charge(key, model, cost, time.time())
        if cost.tokens:
            with self._lock:
                traffic = self._traffic.setdefault(key, _Traffic())
                traffic.tokens.append((time.monotonic(), cost.tokens))

    def caller_named(self, name: str | None) -> Caller:
        """The caller a batch line runs as: its batch's owner, as the key stands now (a
        401 once it is revoked, a 429 once its quota for the day is spent)."""
        if name is None:
            return OPEN
        if name == API_KEY_NAME:
            return Caller(API_KEY_NAME)
        self._refresh(force=True)  # a line started after a revocation sees it
        record = next((k for k in self._keys.values() if k.name == name), None)
        if record is None:
            raise _unauthorized(f"The API key '{name}' no longer exists.")
        record = self._known_record(record)
        self._check_quota(record, time.time())
        return Caller(record.name, record.models, record.admin)

    def usage(self, key: str | None, start: str | None, end: str | None) -> list[UsageRow]:
        return self._store.usage(key, start, end) if self._store is not None else []

    def all_keys(self) -> list[KeyRecord]:
        return self._store.all_keys() if self._store is not None else []

    # Checks -------------------------------------------------------------------------

    def _known(self, given: str) -> KeyRecord:
        if not 0 < len(given) <= MAX_SECRET_CHARS:
            raise _unauthorized("Invalid or missing API key.")
        hashed = digest(given)
        if hashed not in self._keys:
            self._refresh(force=True)  # a key made a moment ago works at once
        record = self._keys.get(hashed)
        if record is None:
            raise _unauthorized("Invalid or missing API key.")
        return self._known_record(record)

    def _known_record(self, record: KeyRecord) -> KeyRecord:
        if record.revoked_at is not None:
            raise _unauthorized(f"The API key '{record.name}' has been revoked.")
        if not record.usable(time.time()):
            raise _unauthorized(f"The API key '{record.name}' has expired.")
        return record

    def _check(self, record: KeyRecord, traffic: _Traffic, now: float, spends: bool) -> None:
        moment = time.monotonic()
        traffic.forget_before(moment - WINDOW_SECONDS)
        if record.max_concurrent is not None and traffic.in_flight >= record.max_concurrent:
            raise _limited(
                f"The API key '{record.name}' has {traffic.in_flight} requests in flight, "
                f"its limit.",
                "concurrency_limit_exceeded",
                1,
            )
        if record.rpm is not None and len(traffic.requests) >= record.rpm:
            wait = traffic.requests[0] + WINDOW_SECONDS - moment
            raise _limited(
                f"Rate limit reached for the API key '{record.name}': {record.rpm} requests "
                f"per minute. Try again in {math.ceil(wait)}s.",
                "rate_limit_exceeded",
                math.ceil(wait),
            )
        if not spends:
            return
        if record.tpm is not None:
            self._check_tpm(record, traffic, moment)
        self._check_quota(record, now)

    def _check_tpm(self, record: KeyRecord, traffic: _Traffic, moment: float) -> None:
        assert record.tpm is not None
        used = sum(tokens for _, tokens in traffic.tokens)
        if used < record.tpm:
            return
        wait, left = 1, used  # until enough of the last minute's tokens drop out
        for at, tokens in traffic.tokens:
            left -= tokens
            wait = math.ceil(at + WINDOW_SECONDS - moment)
            if left < record.tpm:
                break
        raise _limited(
            f"Rate limit reached for the API key '{record.name}': {record.tpm} tokens per "
            f"minute (used {used}). Try again in {wait}s.",
            "rate_limit_exceeded",
            max(wait, 1),
        )

    def _check_quota(self, record: KeyRecord, now: float) -> None:
        if record.tokens_per_day is None or self._store is None:
            return
        used = self._store.tokens_on(record.name, day_of(now))
        if used >= record.tokens_per_day:
            midnight = (math.floor(now / DAY_SECONDS) + 1) * DAY_SECONDS
            raise ServiceError(
                ErrorKind.QUOTA_EXCEEDED,
                f"The API key '{record.name}' has used its {record.tokens_per_day} tokens "
                f"for today ({used} used); the quota renews at 00:00 UTC.",
                code="insufficient_quota",
                retry_after=math.ceil(midnight - now),
            )

    # Live changes -------------------------------------------------------------------

    def _refresh(self, force: bool = False) -> None:
        """Read the keys again if another process changed the store (looked at every
        REFRESH_SECONDS at most, or now when `force`d); open the store once its file
        appears. Requests arriving meanwhile wait for the fresh keys."""
        if not force and time.monotonic() - self._checked < REFRESH_SECONDS:
            return
        with self._refreshing:
            now = time.monotonic()
            if not force and now - self._checked < REFRESH_SECONDS:
                return  # another thread has just looked
            self._reload()
            self._checked = now

    def _reload(self) -> None:
        if self._store is None:
            if not self.path.exists():
                return
            self._store = KeyStore(self.path)
            log.info("API keys: %s", self.path)
        version = self._store.version()
        if version != self._version:
            self._keys = self._store.by_hash()
            self._version = version


def _unauthorized(message: str) -> ServiceError:
    return ServiceError(ErrorKind.AUTHENTICATION, message, code="invalid_api_key")


def _limited(message: str, code: str, retry_after: int) -> ServiceError:
    return ServiceError(ErrorKind.RATE_LIMITED, message, code=code, retry_after=retry_after)
