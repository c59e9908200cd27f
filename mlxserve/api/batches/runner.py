"""Runs batch lines, each through the same endpoint a client's request takes, at idle
priority (RequestContext.idle_priority), and ends each batch once its lines are answered.

A line's reply (or its error, in the endpoint's dialect) is written to the store before
it counts. A line whose run did not end in an answer (it gave its slot to an interactive
request, the server is busy or stopping, its batch was cancelled) is left pending and runs
again: no line is lost, and the store writes a result only once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from io import BufferedIOBase

from mlxserve.api.errors import ErrorRenderer
from mlxserve.api.responder import RawReply, Responder
from mlxserve.batches.store import (
    CANCELED,
    CANCELLED,
    CANCELLING,
    COMPLETED,
    ERRORED,
    EXPIRED,
    FINALIZING,
    IN_PROGRESS,
    LINE_EXPIRED,
    SUCCEEDED,
    BatchRecord,
    BatchStore,
    LineRecord,
    Usage,
)
from mlxserve.keys.caller import calling
from mlxserve.keys.gate import KeyGate
from mlxserve.protocol.errors import (
    PREEMPTED,
    ClientGone,
    ErrorKind,
    ServiceError,
    internal_error,
)
from mlxserve.service.context import RequestContext
from mlxserve.telemetry.record import RequestRecord, recording

log = logging.getLogger(__name__)
access_log = logging.getLogger("mlxserve.access")

LOOK_SECONDS = 1.0  # how often the runner looks for work (and expiries) when not woken
RETRY_SECONDS = 1.0  # a line the server was too busy for waits this long
# POST endpoints as routes.py holds them: (body, responder) -> a reply
Endpoint = Callable[[bytes, Responder], dict | RawReply | None]
# A batch's result files as its dialect writes them: (kind, file name, content)
Outputs = Callable[[BatchStore, BatchRecord], list[tuple[str, str, bytes]]]


@dataclass(frozen=True)
class Answer:
    """What a line's request got."""

    status: int
    body: dict


class _LineResponder:
    """The connection a batch line's endpoint sees: never streamed; gone once its batch is
    cancelled or the server stops."""

    def __init__(self, context: RequestContext):
        self.context = context

    def client_gone(self) -> bool:
        return self.context.client_gone()

    def open_stream(self, content_type: str = "") -> BufferedIOBase:
        raise RuntimeError("a batch line is never streamed")

    def header(self, name: str) -> str | None:
        return None


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        endpoints: dict[str, Endpoint],
        errors: Callable[[str], ErrorRenderer],
        outputs: dict[str, Outputs],
        concurrency: int,
        keys: KeyGate,
        on_token: Callable[[float], None],
    ):
        """`endpoints`: by path, what runs a line; `errors`: a path's error shape;
        `outputs`: by dialect, the result files an ended batch gets; `concurrency`: most
        lines running at once (the batch's decode slots); `keys`: who a line runs as (its
        batch's owner), charged its usage; `on_token`: told each generated token's time."""
        self._store = store
        self._endpoints = endpoints
        self._errors = errors
        self._outputs = outputs
        self._concurrency = concurrency
        self._keys = keys
        self._on_token = on_token
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="batch-line")
        self._running: set[tuple[str, int]] = set()
        self._not_before: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="batch-runner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Lines running now end unanswered (they run again after a restart)."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def wake(self) -> None:
        """Look for work now (a batch was created or cancelled)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopping:
            try:
                self._end_batches()
                self._start_lines()
            except Exception:
                log.exception("the batch runner failed a round; it goes on")
            self._wake.wait(LOOK_SECONDS)
            self._wake.clear()

    def _start_lines(self) -> None:
        with self._lock:
            now = time.monotonic()
            self._not_before = {k: t for k, t in self._not_before.items() if t > now}
            skip = self._running | set(self._not_before)
            free = self._concurrency - len(self._running)
            lines = self._store.pending(skip, free) if free > 0 else []
            self._running.update(line.key for line in lines)
        for line in lines:
            self._pool.submit(self._run, line)

    def _end_batches(self) -> None:
        """Batches whose lines are all answered (or whose time ran out, or that were
        cancelled) end once none of their lines runs: their result files, then the
        status."""
        for batch in self._store.running():
            with self._lock:
                busy = any(batch_id == batch.id for batch_id, _ in self._running)
            expired = batch.status == IN_PROGRESS and batch.expires_at <= time.time()
            if batch.status == CANCELLING or expired:
                self._store.end_pending(batch.id, CANCELED if not expired else LINE_EXPIRED)
            elif batch.status == IN_PROGRESS and batch.counts.pending:
                continue
            if busy:
                continue
            status = CANCELLED if batch.status == CANCELLING else EXPIRED if expired else COMPLETED
            if batch.status == IN_PROGRESS and not expired:
                self._store.set_status(batch.id, FINALIZING, when=(IN_PROGRESS,))
            ended = self._store.batch(batch.id)
            if ended is None:
                continue
            outputs = self._outputs.get(ended.dialect)
            self._store.finish(ended.id, status, outputs(self._store, ended) if outputs else [])
            log.info("Batch %s %s: %s", batch.id, status, ended.counts)

    def _run(self, line: LineRecord) -> None:
        try:
            answer, record = self._answer(line)
            if answer is not None and not self._stopping:
                outcome = SUCCEEDED if answer.status == 200 else ERRORED
                usage = _usage(answer.body) if outcome == SUCCEEDED else Usage()
                written = self._store.record(line.key, outcome, answer.status, answer.body, usage)
                if written and line.owner is not None and record.metered.requests:
                    # charged once its result is written: a line run again is not
                    self._keys.charge(line.owner, record.model or "", record.metered)
        except Exception:
            log.exception("batch line %s:%d failed", line.batch_id, line.line)
        finally:
            with self._lock:
                self._running.discard(line.key)
            self._wake.set()

    def _answer(self, line: LineRecord) -> tuple[Answer | None, RequestRecord]:
        """The line's request through its endpoint (None where it must run again), and
        what it cost."""
        target = f"{line.url} (batch {line.batch_id})"
        record = RequestRecord(line.request_id, "POST", target, on_token=self._on_token)
        with recording(record):
            answer = self._reply(line, record)
            if answer is not None:
                record.status = answer.status
                record.finished = time.monotonic()
                access_log.info(record.access_line())
        return answer, record

    def _reply(self, line: LineRecord, record: RequestRecord) -> Answer | None:
        endpoint = self._endpoints[line.url]

        def gone() -> bool:
            return self._stopping or self._cancelled(line.batch_id)

        try:
            caller = self._keys.caller_named(line.owner)  # a 401 once revoked: its answer
            responder = _LineResponder(RequestContext(caller, record, gone, idle_priority=True))
            with calling(caller):  # the records it makes are its owner's
                reply = endpoint(line.body or b"{}", responder)
            if not isinstance(reply, dict):
                raise RuntimeError(f"{line.url} gave no JSON reply")
            return Answer(200, reply)
        except ClientGone:
            return None
        except ServiceError as e:
            if e.code == PREEMPTED:
                log.info("Batch line %d gave its slot to an interactive request", line.line)
                return None
            if e.kind in (ErrorKind.UNAVAILABLE, ErrorKind.OVERLOADED):
                with self._lock:
                    self._not_before[line.key] = time.monotonic() + RETRY_SECONDS
                return None
            error = e
        except Exception as e:  # a bug: the line is answered with it, the batch goes on
            log.exception("batch line %s:%d failed", line.batch_id, line.line)
            error = internal_error(f"Internal error: {e}")
        reply_error = self._errors(line.url)(error)
        return Answer(reply_error.status, reply_error.body)

    def _cancelled(self, batch_id: str) -> bool:
        return self._store.status(batch_id) != IN_PROGRESS


def _usage(body: dict) -> Usage:
    """A reply's token usage, as each endpoint words it (chat and completions, Responses,
    Messages, embeddings)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return Usage()
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens", usage.get("cache_read_input_tokens", 0)) or 0
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
    output = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    return Usage(prompt or 0, cached, completion, output.get("reasoning_tokens", 0) or 0)
