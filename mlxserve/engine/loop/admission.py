"""Whether work may be taken: the server's capacity for jobs (a 503 beyond it), and the
memory budget's room for KV caches (a 400 for a request that could never fit beside its
model's weights; a wait, in order for each model, for one that does not fit beside the
other sessions now)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from mlxserve.engine.caches.prompt_cache import PromptCache
from mlxserve.engine.generation.jobs import ErrorEvent, GenerationJob
from mlxserve.engine.loop.model_session import Session
from mlxserve.engine.memory.adapter_residency import AdapterResidency
from mlxserve.engine.memory.residency import RETRY_AFTER_SECONDS, Residency
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import (
    ServiceError,
    bad_request,
    busy,
    internal_error,
    unavailable,
)
from mlxserve.units import format_bytes

log = logging.getLogger(__name__)

SHUTTING_DOWN = "The server is shutting down."
KV_SAMPLE_SECONDS = 0.5  # how often running sessions' KV bytes are noted for the status page


class Capacity:
    """Jobs running or waiting, counted from submit to release; any thread."""

    def __init__(self, capacity: int):
        self._capacity = capacity  # more are refused
        self._in_flight = 0
        self._lock = threading.Lock()
        self._refusal: ServiceError | None = None  # what submits get once stopping

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def take(self, count: int) -> None:
        """Count a request's `count` jobs in, or refuse them: a 503 when the server already
        holds `capacity` jobs (a request that finds the server idle is always taken,
        however many choices it has), or the refusal once stopping."""
        with self._lock:
            if self._refusal is not None:
                raise self._refusal
            if self._in_flight and self._in_flight + count > self._capacity:
                raise busy(
                    f"The server is busy: {self._in_flight} sequences are running or waiting "
                    f"(the limit is {self._capacity}). Retry later.",
                    RETRY_AFTER_SECONDS,
                )
            self._in_flight += count

    def release(self, count: int) -> None:
        with self._lock:
            self._in_flight -= count

    def refuse(self, error: ServiceError | None = None) -> None:
        """From now on submits get `error`; without one, the refusal already given, else
        "shutting down"."""
        with self._lock:
            if error is not None or self._refusal is None:
                self._refusal = error or unavailable(SHUTTING_DOWN)


class Admission:
    """Requests waiting to start, and the memory budget (bytes for weights and every KV
    cache) as the loop applies it when it starts them."""

    def __init__(
        self,
        budget: int | None,
        cache: PromptCache,
        residency: Residency,
        touch: Callable[[ModelSpec], None],
        adapters: AdapterResidency | None = None,
    ):
        """`touch`: note that a model was just used (it is unloaded last); `adapters`:
        makes the adapters a request names resident before it starts."""
        self.budget = budget  # None: unbounded
        self._cache = cache
        self._residency = residency
        self._adapters = adapters
        self._touch = touch
        self.pending: deque[list[GenerationJob]] = deque()  # requests, in order
        self.starting: list[GenerationJob] = []  # jobs being admitted now
        self.kv_bytes = 0  # what the sessions' KV caches held when last noted
        self._kv_noted = 0.0

    def check(
        self, spec: ModelSpec, prompt_tokens: int, max_tokens: int, sequences: int, param: str
    ) -> None:
        """A 400 for a request whose KV caches alone would exceed what the memory budget
        leaves beside its model's weights (known once its model is loaded): it could
        never run."""
        session = self._residency.sessions.get(spec)
        footprint = session.footprint if session is not None else None
        if session is None or footprint is None or self.budget is None:
            return
        room = self.budget - session.weight_bytes
        need = footprint.batch([prompt_tokens + max_tokens] * sequences)
        if need > room:
            raise bad_request(
                f"This request needs {format_bytes(need)} of KV cache ({sequences} x "
                f"({prompt_tokens} prompt + {max_tokens} max_tokens) tokens), more than the "
                f"{format_bytes(room)} the memory budget leaves after the weights.",
                param=param,
                code="insufficient_memory",
            )

    def adapter_in_use(self, name: str) -> bool:
        """Whether requests under the adapter `name` run or wait."""
        sessions = self._residency.open_sessions()
        jobs = [
            *(job for request in self.pending for job in request),
            *self.starting,
            *(job for session in sessions for job in session.jobs()),
        ]
        return any(job.adapter == name for job in jobs)

    def waits(self, spec: ModelSpec) -> bool:
        """Whether requests for `spec` wait to start."""
        return any(job.spec == spec for request in self.pending for job in request)

    def admit(self) -> None:
        """Start pending requests, in order for each model: a request that does not fit
        its model's memory yet waits (and the later ones for that model with it), while
        other models' requests go ahead. Idle-priority requests (batch work) come after
        every other, and start only into free decode slots while nothing else waits; an
        interactive request short of memory ends idle-priority jobs to make room."""
        waiting: set[ModelSpec] = set()
        for request in sorted(self.pending, key=lambda jobs: jobs[0].idle_priority):
            jobs = [job for job in request if not job.cancelled.is_set()]
            spec = jobs[0].spec if jobs else None
            idle = request[0].idle_priority
            if spec in waiting or (idle and waiting):
                continue
            try:
                if spec is not None and not self._start(spec, jobs, idle):
                    waiting.add(spec)
                    continue
            except ServiceError as e:
                answer(jobs, e)
            except Exception as e:  # a bug: this request fails, the others go on
                log.exception("admitting a request failed")
                answer(jobs, internal_error(f"Generation failed: {e}"))
            self.pending.remove(request)

    def _start(self, spec: ModelSpec, jobs: list[GenerationJob], idle: bool) -> bool:
        """Admit a request's jobs into its model's session; False if they must wait (for
        memory, for their model's load, or, idle-priority ones, for a free slot)."""
        session = self._residency.session_when_loaded(spec)
        if session is None or (idle and session.idle_slots < len(jobs)):
            return False
        if not session.fits(jobs, self.kv_room(session)):
            if not idle:
                for other in self._residency.open_sessions():
                    other.preempt_idle()
            return False
        for adapter in {job.adapter for job in jobs if job.adapter is not None}:
            if self._adapters is not None:
                self._adapters.ready(spec, adapter)
        self.starting = jobs
        try:
            for job in jobs:
                session.admit(job)
        finally:
            self.starting = []
        self._touch(spec)
        return True

    def kv_room(self, session: Session) -> int | None:
        """What the memory budget leaves for `session`'s KV caches: the budget less every
        resident model's weights and what the other sessions may grow to. A session alone
        in the thread may take its whole share (what `check` let in fits it)."""
        if self.budget is None:
            return None
        others = [s for s in self._residency.open_sessions() if s is not session]
        if len(session) == 0 and not any(len(s) for s in others):
            return None
        reserved = sum(s.reserved_bytes() for s in others)
        return self.budget - self._residency.weight_bytes() - reserved

    def trim_prompt_cache(self) -> None:
        """The prompt cache's byte budget covers the caches of running sequences too; the
        memory budget, less the weights, bounds it as well."""
        budgets = [self._cache.max_bytes]
        if self.budget is not None:
            budgets.append(self.budget - self._residency.weight_bytes())
        known = [b for b in budgets if b is not None]
        if known:
            live = sum(s.live_bytes() for s in self._residency.open_sessions())
            self._cache.trim_to(min(known) - live)

    def note_kv_bytes(self) -> None:
        """Samples the KV bytes the sessions hold (for the status page; read anywhere):
        every KV_SAMPLE_SECONDS while they run, and 0 once they are empty."""
        active = [s for s in self._residency.open_sessions() if len(s) > 0]
        now = time.monotonic()
        if active and now < self._kv_noted + KV_SAMPLE_SECONDS:
            return
        self._kv_noted = now
        self.kv_bytes = sum(s.live_bytes() for s in active)


def answer(jobs: list[GenerationJob], error: ServiceError) -> None:
    """End `jobs` with `error`."""
    for job in jobs:
        job.emit(ErrorEvent(error))
