"""The generation thread: the only thread that makes MLX calls.

HTTP threads submit a request's jobs and read events from the queue the jobs share. The
thread admits jobs into the running batch between decode steps; jobs for another model
wait until the batch drains, then the model is swapped. If the loop fails, the requests in
flight get a server error and the loop starts again with a fresh batch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from mlxserve.engine.batch import BatchLimits, BatchSession, can_batch
from mlxserve.engine.jobs import ErrorEvent, GenerationJob
from mlxserve.engine.memory import GB
from mlxserve.engine.prompt_cache import PromptCache
from mlxserve.engine.sampling import reseed_random
from mlxserve.engine.single import generate_single
from mlxserve.engine.vision import generate_vision
from mlxserve.models.provider import LoadedModel, ModelProvider, ModelSpec
from mlxserve.protocol.errors import (
    ServiceError,
    bad_request,
    busy,
    internal_error,
    unavailable,
)

log = logging.getLogger(__name__)


RETRY_AFTER_SECONDS = 1
SHUTTING_DOWN = "The server is shutting down."
# Gathering a burst: wait up to GAP for the next arrival, GATHER_MAX in all.
GATHER_GAP_SECONDS = 0.004
GATHER_MAX_SECONDS = 0.03


class GenerationWorker:
    def __init__(
        self,
        provider: ModelProvider,
        cache: PromptCache,
        limits: BatchLimits,
        capacity: int,
        memory_budget: int | None = None,
    ):
        self._provider = provider
        self._memory_budget = memory_budget  # bytes for weights and KV caches
        self._cache = cache
        self._limits = limits
        self._capacity = capacity  # jobs running or waiting; more are refused
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._intake: queue.Queue = queue.Queue()
        self._pending: deque[list[GenerationJob]] = deque()
        self._session: BatchSession | None = None
        self._current: LoadedModel | None = None  # the model the session was made for
        self._starting: list[GenerationJob] = []
        self._serving = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="generation", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish at the next step: requests in flight or waiting end with a 503 (their
        streams with an error event), and the prompt cache is written to its disk tier."""
        self._intake.put(None)
        self._thread.join(timeout=60)

    @property
    def prompt_cache(self) -> PromptCache:
        return self._cache

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._serving.is_set()

    @property
    def running(self) -> int:
        """Sequences decoding now (read from any thread: a snapshot). Without a batch,
        the request being generated one at a time."""
        session = self._session
        return session.decoding if session is not None else len(self._starting)

    @property
    def waiting(self) -> int:
        """Sequences accepted and not decoding yet."""
        return max(0, self._in_flight - self.running)

    def check_memory(
        self, spec: ModelSpec, prompt_tokens: int, max_tokens: int, sequences: int, param: str
    ) -> None:
        """A 400 for a request whose KV caches alone would exceed the memory budget (known
        once its model is loaded): it could never run."""
        session = self._session
        if session is None or session.spec != spec or session.kv_bytes is None:
            return
        need = session.footprint.batch([prompt_tokens + max_tokens] * sequences)
        if need > session.kv_bytes:
            raise bad_request(
                f"This request needs {need / GB:.2f} GB of KV cache ({sequences} x "
                f"({prompt_tokens} prompt + {max_tokens} max_tokens) tokens), more than the "
                f"{session.kv_bytes / GB:.2f} GB the memory budget leaves after the weights.",
                param=param,
                code="insufficient_memory",
            )

    def submit(self, jobs: list[GenerationJob]) -> None:
        """Queue one request's jobs (jobs with the same prompt share its prefill), or
        refuse them with a 503 when the server already holds `capacity` jobs. A request
        that finds the server idle is always taken, however many choices it has.
        Every accepted submit is paired with a `release` once the request is over."""
        with self._in_flight_lock:
            if self._stopping:
                raise unavailable(SHUTTING_DOWN)
            if self._in_flight and self._in_flight + len(jobs) > self._capacity:
                raise busy(
                    f"The server is busy: {self._in_flight} sequences are running or waiting "
                    f"(the limit is {self._capacity}). Retry later.",
                    RETRY_AFTER_SECONDS,
                )
            self._in_flight += len(jobs)
        self._intake.put(jobs)

    def release(self, jobs: list[GenerationJob]) -> None:
        with self._in_flight_lock:
            self._in_flight -= len(jobs)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the generation thread and return its result (or raise its error)."""
        done: queue.Queue = queue.Queue()
        self._intake.put(lambda: done.put(_capture(fn)))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def _run(self) -> None:
        while not self._stopping:
            self._serving.set()
            try:
                self._serve()
            except Exception as e:
                self._serving.clear()
                log.exception("The generation loop failed; restarting it")
                self._fail_in_flight(internal_error(f"Generation failed: {e}"))
                reseed_random()
        self._fail_in_flight(unavailable(SHUTTING_DOWN))
        self._fail_waiting(unavailable(SHUTTING_DOWN))
        if self._session is not None:
            self._session.close()
        self._cache.flush()

    def _serve(self) -> None:
        while True:
            decoding = self._session is not None and len(self._session) > 0
            if not self._take(block=not decoding and not self._pending):
                return
            self._admit()
            if self._session is not None and len(self._session) > 0:
                self._session.step()

    def _take(self, block: bool) -> bool:
        """Move submitted work to the pending queue (run calls at once); False on stop.
        Woken from idle, it keeps taking while requests keep arriving (a burst of clients
        is still rendering its prompts), so that the burst starts as one batch."""
        try:
            item = self._intake.get(block=block)
        except queue.Empty:
            return True
        gather_until = time.monotonic() + GATHER_MAX_SECONDS if block else 0.0
        while True:
            if item is None:
                self._stopping = True
                return False
            if callable(item):
                item()
            else:
                self._pending.append(item)
            wait = min(GATHER_GAP_SECONDS, gather_until - time.monotonic())
            try:
                item = self._intake.get(timeout=wait) if wait > 0 else self._intake.get_nowait()
            except queue.Empty:
                return True

    def _admit(self) -> None:
        """Start pending requests in order; one for another model waits for the batch."""
        while self._pending:
            jobs = [job for job in self._pending[0] if not job.cancelled.is_set()]
            if not jobs:
                self._pending.popleft()
                continue
            session = self._session
            if session is not None and len(session) > 0 and session.spec != jobs[0].spec:
                return
            if session is not None and session.spec == jobs[0].spec and not session.fits(jobs):
                return  # it waits for running requests to free their KV caches
            self._pending.popleft()
            self._starting = jobs
            try:
                self._start(jobs)
            except ServiceError as e:
                for job in jobs:
                    job.emit(ErrorEvent(e))
            self._starting = []

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Make `spec` the model served (generation thread only: through `call`)."""
        loaded = self._provider.activate(spec)
        if loaded is not self._current:
            self._switch(loaded)
        return loaded

    def _start(self, jobs: list[GenerationJob]) -> None:
        loaded = self.load(jobs[0].spec)
        if self._session is None:
            for job in jobs:
                self._run_single(loaded, job)
            return
        for job in jobs:
            self._session.admit(job)

    def _switch(self, loaded: LoadedModel) -> None:
        """Serve `loaded` from now on; if it cannot be served with these settings (its
        weights beyond the memory budget, a cache that cannot be quantized), the error
        goes to the request and the next request for it tries again."""
        kv_bytes = self._kv_bytes(loaded)
        if self._session is not None:
            self._session.close()
            self._session = None
        self._current = None
        self._cache.clear()
        self._cache.persist = not loaded.spec.vision
        if can_batch(loaded):
            self._session = BatchSession(loaded, self._cache, self._limits, kv_bytes)
        else:
            why = "a vision model" if loaded.spec.vision else "a draft model"
            log.info("Serving %s one request at a time (%s)", loaded.spec.path, why)
        self._current = loaded

    def _kv_bytes(self, loaded: LoadedModel) -> int | None:
        """What the memory budget leaves for KV caches beside the weights."""
        budget = self._memory_budget
        if budget is None:
            return None
        if budget <= loaded.nbytes:
            raise bad_request(
                f"The memory budget ({budget / GB:.2f} GB) does not hold the weights of "
                f"{loaded.spec.path.name} ({loaded.nbytes / GB:.2f} GB)."
            )
        return budget - loaded.nbytes

    def _run_single(self, loaded: LoadedModel, job: GenerationJob) -> None:
        generate = generate_vision if loaded.spec.vision else generate_single
        try:
            generate(loaded, self._cache, job, self._limits.prefill_chunk)
        except Exception as e:
            log.exception("generation failed")
            reseed_random()
            job.emit(ErrorEvent(internal_error(f"Generation failed: {e}")))

    def _fail_in_flight(self, error: ServiceError) -> None:
        jobs = dict.fromkeys(self._starting)
        if self._session is not None:
            jobs.update(dict.fromkeys(self._session.jobs()))
            self._session = None
            self._current = None
        for job in jobs:
            job.emit(ErrorEvent(error))
        self._starting = []

    def _fail_waiting(self, error: ServiceError) -> None:
        """Jobs never started: pending ones, and any submitted before the stop was seen."""
        while True:
            try:
                item = self._intake.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, list):
                self._pending.append(item)
        while self._pending:
            for job in self._pending.popleft():
                job.emit(ErrorEvent(error))


def _capture(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except Exception as e:
        return False, e
