"""The generation thread: the only thread that makes MLX calls.

HTTP threads submit a request's jobs and read events from the queue the jobs share. Each
resident model has a session (model_session.py: a continuous batch, or one request at a time
for models batching cannot serve); the loop admits jobs into their model's session
between steps and steps every busy session in turn, one step each, so that models share
the thread fairly. Which models are resident is memory/residency.py's job; whether a request fits
the server's capacity and memory is admission.py's. If the loop fails, the requests in
flight get a server error and the loop starts again with fresh sessions.

Serving a model sharded across several ranks (mlxserve.distributed), every rank runs this
loop in lockstep: rank 0 takes the submitted work and publishes each iteration's inputs
(`LoopStep`), the other ranks replay them (see `loop_step`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from mlxserve.engine.caches.prompt_cache import PromptCache
from mlxserve.engine.continuous.continuous_batch import ContinuousBatchLimits
from mlxserve.engine.generation.jobs import ErrorEvent, GenerationJob
from mlxserve.engine.generation.sampling import reseed_random
from mlxserve.engine.loop.admission import SHUTTING_DOWN, Admission, Capacity, answer
from mlxserve.engine.loop.intake import Call, Intake, Stop, Submitted, Wake
from mlxserve.engine.loop.loop_step import Lockstep, LoopStep
from mlxserve.engine.loop.model_session import Session, SessionContext, open_session
from mlxserve.engine.memory.adapter_residency import AdapterResidency
from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.engine.memory.residency import Residency
from mlxserve.engine.memory.resident_set import ResidentSet
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import (
    ServiceError,
    internal_error,
    unavailable,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

IDLE_CHECK_SECONDS = 1.0  # how often an idle thread looks for models to unload


class GenerationWorker:
    def __init__(
        self,
        models: ResidentSet,
        cache: PromptCache,
        limits: ContinuousBatchLimits,
        capacity: int,
        memory_budget: int | None = None,
        lockstep: Lockstep | None = None,
    ):
        self._cache = cache
        self._lockstep = lockstep
        self._now = time.perf_counter()  # the clock of this loop iteration (LoopStep.now)
        self.models = models  # read on any thread: what is in memory, pins, keep times
        self._idle_check = 0.0  # when to look for idle models next (monotonic)
        self._intake = Intake()
        self._capacity = Capacity(capacity)
        self._serving = threading.Event()
        self._stopping = False
        self._following = False  # a following rank replays rank 0's steps (see `follow`)
        self._thread = threading.Thread(target=self._run, name="generation", daemon=True)
        context = SessionContext(
            cache,
            limits,
            lambda: self._admission.trim_prompt_cache(),
            lambda: self._now,
            self._wake,
            lockstep,
        )
        catalog = models.catalog
        self._residency = Residency(
            models,
            cache,
            memory_budget,
            lambda loaded: open_session(
                loaded, catalog.config_for(loaded.spec).num_draft_tokens, context
            ),
            lambda spec: self._admission.waits(spec),
            self._wake,
            in_background=lockstep is None,
            only=catalog.default if lockstep is not None else None,
        )
        self._adapters = AdapterResidency(
            models,
            self._residency,
            memory_budget,
            lambda name: self._admission.adapter_in_use(name),
        )
        self._admission = Admission(
            memory_budget, cache, self._residency, models.touch, self._adapters
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish at the next step: requests in flight or waiting end with a 503 (their
        streams with an error event), and the prompt cache is written to its disk tier."""
        self._intake.put(Stop())
        self._thread.join(timeout=60)

    @property
    def prompt_cache(self) -> PromptCache:
        return self._cache

    @property
    def memory_budget(self) -> int | None:
        """Bytes for weights and KV caches (None: unbounded)."""
        return self._admission.budget

    @property
    def kv_bytes(self) -> int:
        """What the sessions' KV caches held when last noted (any thread)."""
        return self._admission.kv_bytes

    @property
    def residency(self) -> Residency:
        """Which models are in memory, and their sessions (memory/residency.py)."""
        return self._residency

    @property
    def adapters(self) -> AdapterResidency:
        """Which adapters are in their models' memory (memory/adapter_residency.py)."""
        return self._adapters

    @property
    def admission(self) -> Admission:
        """The memory budget as requests are admitted (admission.py)."""
        return self._admission

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._serving.is_set()

    @property
    def running(self) -> int:
        """Sequences decoding now, every model's (read from any thread: a snapshot)."""
        return sum(s.decoding for s in self._open_sessions())

    @property
    def waiting(self) -> int:
        """Sequences accepted and not decoding yet."""
        return max(0, self._capacity.in_flight - self.running)

    def submit(self, jobs: list[GenerationJob]) -> None:
        """Queue one request's jobs (jobs with the same prompt share its prefill), or
        refuse them with a 503 (admission.Capacity). Every accepted submit is paired with
        a `release` once the request is over."""
        for job in jobs:
            self._residency.check_served(job.spec)
            job.cancel_at_step = self._lockstep is not None
            # ranks in lockstep end jobs only at a published step: no preemption there
            job.idle_priority = job.idle_priority and self._lockstep is None
        self._capacity.take(_counted(jobs))
        self._intake.put(Submitted(jobs))

    def release(self, jobs: list[GenerationJob]) -> None:
        self._capacity.release(_counted(jobs))

    def abandon(self, error: ServiceError) -> None:
        """The loop cannot go on and may never return (a rank of a distributed group
        failed; this thread can be blocked in a collective for good): answer every
        request in flight or waiting with `error`, and refuse new ones. Any thread."""
        self._stopping = True
        self._capacity.refuse(error)
        self._serving.clear()
        jobs = dict.fromkeys(self._admission.starting)
        for session in self._open_sessions():
            jobs.update(dict.fromkeys(session.jobs()))
        for request in [*self._admission.pending, *self._intake.submitted()]:
            jobs.update(dict.fromkeys(request))
        for job in jobs:
            job.emit(ErrorEvent(error))

    def follow(self) -> None:
        """On a following rank, once it is ready (its model loaded): from now on the loop
        runs rank 0's steps, and local calls are no longer taken."""

        def start() -> None:
            self._following = True

        self.call(start)

    def wait(self) -> None:
        """Until the generation thread ends (a following rank: when rank 0 stops)."""
        self._thread.join()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the generation thread and return its result (or raise its error)."""
        done: queue.Queue = queue.Queue()
        self._intake.put(Call(lambda: done.put(_capture(fn))))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    # Generation thread only (through `call`) --------------------------------------------

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Make `spec` resident and ready to serve."""
        return self._residency.load(spec)

    def run_with(self, spec: ModelSpec, fn: Callable[[Any], T]) -> T:
        """`fn` of the resident model of a kind that runs between the loop's steps
        (embeddings, reranking, audio), loading it first if need be."""
        return fn(self._residency.resident(spec).model)

    def unload(self, spec: ModelSpec) -> None:
        """Unload a model now, as an operator asks (residency.unload_on_request)."""
        self._residency.unload_on_request(spec)

    def expire(self, spec: ModelSpec) -> bool:
        """Unload a model now if nothing uses or pins it (a keep_alive of 0)."""
        return bool(self.call(lambda: self._residency.expire(spec)))

    def trace(self) -> int:
        """A hash of every token the batches generated so far (see LoopStep.trace). A batch
        that has generated nothing counts as none: rank 0 publishes a step each time its
        loop wakes, start-up calls included, and a rank that follows once its model is
        loaded must match the steps rank 0 published before it had loaded its own."""
        return hash(tuple(s.trace for s in self._open_sessions() if s.trace))

    # The loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            self._serving.set()
            try:
                self._serve()
            except Exception as e:
                if self._lockstep is not None:
                    self._serving.clear()
                    log.error("The generation loop failed: %s", e)
                    self._stopping = True
                    self._fail_in_flight(unavailable(f"The distributed group failed: {e}"))
                    self._lockstep.failed(e)
                    break
                # Alone, the loop restarts at once and stays serving: ready again before the
                # clients hear of the failure, a retry (or /health) right after finds it so.
                log.exception("The generation loop failed; restarting it")
                reseed_random()
                self._fail_in_flight(internal_error(f"Generation failed: {e}"))
        self._capacity.refuse()
        self._fail_in_flight(unavailable(SHUTTING_DOWN))
        self._fail_waiting(unavailable(SHUTTING_DOWN))
        self._cache.flush()

    def _serve(self) -> None:
        while True:
            step = self._next_step()
            if self._lockstep is not None and step.trace != self.trace():
                raise RuntimeError("this rank's generated tokens differ from rank 0's")
            self._now = step.now
            self._admission.pending.extend(step.arrived)
            for job in step.cancelled:
                job.cancelled.set()
            if step.stop:
                self._stopping = True
                return
            self._admission.admit()
            for session in [s for s in self._open_sessions() if len(s) > 0]:
                session.step()
            self._admission.note_kv_bytes()
            if self.models.keeps_any and time.monotonic() >= self._idle_check:
                self._idle_check = time.monotonic() + IDLE_CHECK_SECONDS
                self._residency.unload_idle()

    def _next_step(self) -> LoopStep:
        """This iteration's inputs: rank 0's on a following rank, else what was submitted
        (published first when other ranks follow)."""
        if self._lockstep is not None and self._lockstep.follows:
            return self._lockstep.receive() if self._following else self._local_call()
        decoding = any(s.ready() for s in self._open_sessions())
        # Pending requests may start now, unless they wait for a load (its end wakes us).
        startable = bool(self._admission.pending) and self._residency.loading is None
        idle_wait = IDLE_CHECK_SECONDS if self.models.keeps_any else None
        arrived = self._intake.take(not decoding and not startable, idle_wait)
        step = LoopStep(
            time.perf_counter(),
            arrived or [],
            self._requested_cancellations(arrived or []),
            stop=arrived is None,
            trace=self.trace() if self._lockstep is not None else 0,
        )
        if self._lockstep is not None:
            self._lockstep.publish(step)
        return step

    def _local_call(self) -> LoopStep:
        """A following rank before it follows: run the next local call (loading its model)."""
        message = self._intake.next()
        if isinstance(message, Stop):
            return LoopStep(self._now, stop=True)
        if isinstance(message, Call):
            message.fn()
        return LoopStep(self._now, trace=self.trace())

    def _requested_cancellations(self, arrived: list[list[GenerationJob]]) -> list[GenerationJob]:
        """Where ranks follow this loop, the jobs whose cancellation clients asked for since
        the last step: they take effect now, on every rank."""
        if self._lockstep is None:
            return []
        live = [job for request in [*self._admission.pending, *arrived] for job in request]
        live += [job for session in self._open_sessions() for job in session.jobs()]
        return [j for j in live if j.cancel_requested.is_set() and not j.cancelled.is_set()]

    def _open_sessions(self) -> list[Session]:
        return self._residency.open_sessions()

    def _wake(self) -> None:
        """Wake the loop if it waits for work (a load or an encoding ended); any thread."""
        self._intake.put(Wake())

    def _fail_in_flight(self, error: ServiceError) -> None:
        jobs = dict.fromkeys(self._admission.starting)
        for session in self._open_sessions():
            jobs.update(dict.fromkeys(session.jobs()))
            session.close()
        self._residency.sessions.clear()
        answer(list(jobs), error)
        self._admission.starting = []

    def _fail_waiting(self, error: ServiceError) -> None:
        """Jobs never started: pending ones, and any submitted before the stop was seen."""
        pending = self._admission.pending
        pending.extend(self._intake.drain())
        while pending:
            answer(pending.popleft(), error)


def _counted(jobs: list[GenerationJob]) -> int:
    """Jobs that count against the server's capacity: idle-priority ones never make an
    interactive request a 503 (their runner bounds how many it sends)."""
    return sum(not job.idle_priority for job in jobs)


def _capture(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except Exception as e:
        return False, e
