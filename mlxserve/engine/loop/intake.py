"""What other threads hand the generation loop, as typed messages on one queue: a
request's jobs, a call to run on the loop's thread, a wake-up, the stop."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from mlxserve.engine.generation.jobs import GenerationJob

# Gathering a burst: wait up to GAP for the next arrival, GATHER_MAX in all.
GATHER_GAP_SECONDS = 0.004
GATHER_MAX_SECONDS = 0.03


@dataclass(frozen=True)
class Submitted:
    """One request's jobs."""

    jobs: list[GenerationJob]


@dataclass(frozen=True)
class Call:
    """Run `fn` on the generation thread (it reports its own result)."""

    fn: Callable[[], None]


@dataclass(frozen=True)
class Wake:
    """Something the loop waits for ended (a load, an image's encoding): look again."""


@dataclass(frozen=True)
class Stop:
    """Finish at the next step."""


Message = Submitted | Call | Wake | Stop


class Intake:
    def __init__(self) -> None:
        self._queue: queue.Queue[Message] = queue.Queue()

    def put(self, message: Message) -> None:
        """Any thread."""
        self._queue.put(message)

    def submitted(self) -> list[list[GenerationJob]]:
        """Requests submitted and not taken yet (a snapshot; any thread)."""
        with self._queue.mutex:
            return [m.jobs for m in self._queue.queue if isinstance(m, Submitted)]

    def next(self) -> Message:
        """The next message, waiting for one."""
        return self._queue.get()

    def take(self, block: bool, timeout: float | None) -> list[list[GenerationJob]] | None:
        """Submitted requests, in order; None on stop. Calls run at once, and while
        sequences decode (`block` False), one call a step (they step between a request's
        calls). Woken from idle, it keeps taking while requests keep arriving (a burst of
        clients is still rendering its prompts), so that the burst starts as one batch.
        `timeout`: how long an idle wait lasts (None: until a message comes)."""
        arrived: list[list[GenerationJob]] = []
        try:
            message = self._queue.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return arrived
        gather_until = time.monotonic() + GATHER_MAX_SECONDS if block else 0.0
        while True:
            if isinstance(message, Stop):
                return None
            if isinstance(message, Submitted):
                arrived.append(message.jobs)
            else:
                if isinstance(message, Call):
                    message.fn()
                if not block:  # one call a step while sequences decode (embedding batches)
                    return arrived
            wait = min(GATHER_GAP_SECONDS, gather_until - time.monotonic())
            try:
                message = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                return arrived

    def drain(self) -> list[list[GenerationJob]]:
        """Take every request still queued (at shutdown), dropping the rest."""
        requests: list[list[GenerationJob]] = []
        while True:
            try:
                message = self._queue.get_nowait()
            except queue.Empty:
                return requests
            if isinstance(message, Submitted):
                requests.append(message.jobs)
