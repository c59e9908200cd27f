"""The generation thread: the only thread that makes MLX calls.

HTTP threads submit a request's jobs and read events from the queue the jobs share. Each
resident model has a session (a continuous batch, or one request at a time for models
batching cannot serve); the thread admits jobs into their model's session between steps
and steps every busy session in turn, one step each, so that models share the thread
fairly. A model that is not resident is loaded when a request needs it, unloading the
least recently used idle models first if the memory budget asks for it. If the loop fails,
the requests in flight get a server error and the loop starts again with fresh sessions.

Serving a model sharded across several ranks (mlxserve.distributed), every rank runs this
loop in lockstep: rank 0 takes the submitted work and publishes each iteration's inputs
(`LoopStep`), the other ranks replay them (see `lockstep`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import numpy as np

from mlxserve.engine.batch import BatchLimits, BatchSession, can_batch
from mlxserve.engine.jobs import ErrorEvent, GenerationJob
from mlxserve.engine.loading import BackgroundLoads
from mlxserve.engine.lockstep import Lockstep, LoopStep
from mlxserve.engine.prompt_cache import PromptCache
from mlxserve.engine.sampling import reseed_random
from mlxserve.engine.speculative import SpeculationCounts
from mlxserve.engine.stream_session import StreamSession
from mlxserve.models.embedding import PartialEmbedding
from mlxserve.models.provider import LoadedModel, ModelProvider, ModelSpec, stored_bytes
from mlxserve.protocol.errors import (
    ErrorKind,
    ServiceError,
    bad_request,
    busy,
    internal_error,
    unavailable,
)
from mlxserve.units import format_bytes

log = logging.getLogger(__name__)
T = TypeVar("T")


RETRY_AFTER_SECONDS = 1
SHUTTING_DOWN = "The server is shutting down."
# Gathering a burst: wait up to GAP for the next arrival, GATHER_MAX in all.
GATHER_GAP_SECONDS = 0.004
GATHER_MAX_SECONDS = 0.03
IDLE_CHECK_SECONDS = 1.0  # how often an idle thread looks for models to unload
KV_SAMPLE_SECONDS = 0.5  # how often a running loop notes its KV bytes for the status page

Session: TypeAlias = BatchSession | StreamSession


class GenerationWorker:
    def __init__(
        self,
        provider: ModelProvider,
        cache: PromptCache,
        limits: BatchLimits,
        capacity: int,
        memory_budget: int | None = None,
        idle_unload_seconds: float | None = None,
        lockstep: Lockstep | None = None,
    ):
        self._provider = provider
        self._lockstep = lockstep
        self._now = time.perf_counter()  # the clock of this loop iteration (LoopStep.now)
        self._memory_budget = memory_budget  # bytes for weights and KV caches
        self._idle_unload_seconds = idle_unload_seconds
        self._idle_check = 0.0  # when to look for idle models next (monotonic)
        self.kv_bytes = 0  # what the batches' KV caches held when last noted
        self._kv_noted = 0.0
        self._cache = cache
        self._limits = limits
        self._capacity = capacity  # jobs running or waiting; more are refused
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._intake: queue.Queue = queue.Queue()
        self._pending: deque[list[GenerationJob]] = deque()
        self._sessions: dict[ModelSpec, Session] = {}
        self._starting: list[GenerationJob] = []
        self._serving = threading.Event()
        self._stopping = False
        self._following = False  # a following rank replays rank 0's steps (see `follow`)
        self._refusal = unavailable(SHUTTING_DOWN)  # what submits get once stopping
        self._thread = threading.Thread(target=self._run, name="generation", daemon=True)
        # Loads off the generation thread; in lockstep every rank loads at the same step.
        self._loads = BackgroundLoads(provider.read, self._wake)
        self._load_in_background = lockstep is None

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
    def memory_budget(self) -> int | None:
        """Bytes for weights and KV caches (None: unbounded)."""
        return self._memory_budget

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._serving.is_set()

    @property
    def running(self) -> int:
        """Sequences decoding now, every model's (read from any thread: a snapshot)."""
        return sum(s.decoding for s in list(self._sessions.values()))

    def speculation(self) -> list[tuple[ModelSpec, SpeculationCounts]]:
        """Each speculating session's draft counts (read from any thread: a snapshot)."""
        sessions = list(self._sessions.items())
        return [(spec, s.speculation) for spec, s in sessions if s.speculation is not None]

    @property
    def waiting(self) -> int:
        """Sequences accepted and not decoding yet."""
        return max(0, self._in_flight - self.running)

    def check_memory(
        self, spec: ModelSpec, prompt_tokens: int, max_tokens: int, sequences: int, param: str
    ) -> None:
        """A 400 for a request whose KV caches alone would exceed what the memory budget
        leaves beside its model's weights (known once its model is loaded): it could
        never run."""
        session = self._sessions.get(spec)
        budget = self._memory_budget
        if not isinstance(session, BatchSession) or budget is None:
            return
        room = budget - session.weight_bytes
        need = session.footprint.batch([prompt_tokens + max_tokens] * sequences)
        if need > room:
            raise bad_request(
                f"This request needs {format_bytes(need)} of KV cache ({sequences} x "
                f"({prompt_tokens} prompt + {max_tokens} max_tokens) tokens), more than the "
                f"{format_bytes(room)} the memory budget leaves after the weights.",
                param=param,
                code="insufficient_memory",
            )

    def needs_checkpoints(self, spec: ModelSpec) -> bool:
        """Whether the model's caches continue only from exact prefixes (known once it is
        loaded): then prompts leave checkpoints on the way (see BatchSession)."""
        session = self._sessions.get(spec)
        return isinstance(session, BatchSession) and session.checkpoints

    def submit(self, jobs: list[GenerationJob]) -> None:
        """Queue one request's jobs (jobs with the same prompt share its prefill), or
        refuse them with a 503 when the server already holds `capacity` jobs. A request
        that finds the server idle is always taken, however many choices it has.
        Every accepted submit is paired with a `release` once the request is over."""
        for job in jobs:
            self._check_served(job.spec)
            job.cancel_at_step = self._lockstep is not None
        with self._in_flight_lock:
            if self._stopping:
                raise self._refusal
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

    def abandon(self, error: ServiceError) -> None:
        """The loop cannot go on and may never return (a rank of a distributed group
        failed; this thread can be blocked in a collective for good): answer every
        request in flight or waiting with `error`, and refuse new ones. Any thread."""
        with self._in_flight_lock:
            self._stopping = True
            self._refusal = error
        self._serving.clear()
        jobs = dict.fromkeys(self._starting)
        for session in list(self._sessions.values()):
            jobs.update(dict.fromkeys(session.jobs()))
        for request in [*self._pending, *self._queued()]:
            jobs.update(dict.fromkeys(request))
        for job in jobs:
            job.emit(ErrorEvent(error))

    def _queued(self) -> list[list[GenerationJob]]:
        """Requests submitted and not taken yet (a snapshot)."""
        with self._intake.mutex:
            return [item for item in self._intake.queue if isinstance(item, list)]

    def accounting(self, spec: ModelSpec) -> tuple[int, int, int]:
        """What the loop's byte decisions count for a loaded model: its weights, and its
        KV cache per token and fixed (generation thread only: through `call`)."""
        session = self._sessions.get(spec)
        footprint = session.footprint if isinstance(session, BatchSession) else None
        per_token, fixed = (footprint.per_token, footprint.fixed) if footprint else (0, 0)
        return self._resident(spec).nbytes, per_token, fixed

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
        self._fail_in_flight(unavailable(SHUTTING_DOWN))
        self._fail_waiting(unavailable(SHUTTING_DOWN))
        self._cache.flush()

    def _serve(self) -> None:
        while True:
            step = self._next_step()
            if self._lockstep is not None and step.trace != self.trace():
                raise RuntimeError("this rank's generated tokens differ from rank 0's")
            self._now = step.now
            self._pending.extend(step.arrived)
            for job in step.cancelled:
                job.cancelled.set()
            if step.stop:
                self._stopping = True
                return
            self._admit()
            for session in [s for s in self._sessions.values() if len(s) > 0]:
                session.step()
            self._note_kv_bytes()
            if self._idle_unload_seconds is not None and time.monotonic() >= self._idle_check:
                self._idle_check = time.monotonic() + IDLE_CHECK_SECONDS
                self._unload_idle(self._idle_unload_seconds)

    def _note_kv_bytes(self) -> None:
        """Samples the KV bytes the batches hold (for the status page; read anywhere):
        every KV_SAMPLE_SECONDS while they run, and 0 once they are empty."""
        active = [s for s in self._sessions.values() if len(s) > 0]
        now = time.monotonic()
        if active and now < self._kv_noted + KV_SAMPLE_SECONDS:
            return
        self._kv_noted = now
        self.kv_bytes = sum(s.live_bytes() for s in active if isinstance(s, BatchSession))

    def _next_step(self) -> LoopStep:
        """This iteration's inputs: rank 0's on a following rank, else what was submitted
        (published first when other ranks follow)."""
        if self._lockstep is not None and self._lockstep.follows:
            return self._lockstep.receive() if self._following else self._local_call()
        decoding = any(s.ready() for s in self._sessions.values())
        # Pending requests may start now, unless they wait for a load (its end wakes us).
        startable = bool(self._pending) and self._loads.loading is None
        arrived = self._take(block=not decoding and not startable)
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

    def trace(self) -> int:
        """A hash of every token the batches generated so far (see LoopStep.trace). A batch
        that has generated nothing counts as none: rank 0 publishes a step each time its
        loop wakes, start-up calls included, and a rank that follows once its model is
        loaded must match the steps rank 0 published before it had loaded its own."""
        return hash(
            tuple(
                s.trace for s in self._sessions.values() if isinstance(s, BatchSession) and s.trace
            )
        )

    def _local_call(self) -> LoopStep:
        """A following rank before it follows: run the next local call (loading its model)."""
        item = self._intake.get()
        if item is None:
            return LoopStep(self._now, stop=True)
        item()
        return LoopStep(self._now, trace=self.trace())

    def _take(self, block: bool) -> list[list[GenerationJob]] | None:
        """Submitted requests, in order; None on stop. Calls run at once, and while
        sequences decode, one call a step (they step between a request's calls). Woken from
        idle, it keeps taking while requests keep arriving (a burst of clients is still
        rendering its prompts), so that the burst starts as one batch. Idle, it wakes up
        now and then to unload idle models."""
        timeout = IDLE_CHECK_SECONDS if self._idle_unload_seconds is not None else None
        arrived: list[list[GenerationJob]] = []
        try:
            item = self._intake.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return arrived
        gather_until = time.monotonic() + GATHER_MAX_SECONDS if block else 0.0
        while True:
            if item is None:
                return None
            if callable(item):
                item()
                if not block:  # one call a step while sequences decode (embedding batches)
                    return arrived
            else:
                arrived.append(item)
            wait = min(GATHER_GAP_SECONDS, gather_until - time.monotonic())
            try:
                item = self._intake.get(timeout=wait) if wait > 0 else self._intake.get_nowait()
            except queue.Empty:
                return arrived

    def _requested_cancellations(self, arrived: list[list[GenerationJob]]) -> list[GenerationJob]:
        """Where ranks follow this loop, the jobs whose cancellation clients asked for since
        the last step: they take effect now, on every rank."""
        if self._lockstep is None:
            return []
        live = [job for request in [*self._pending, *arrived] for job in request]
        live += [job for session in self._sessions.values() for job in session.jobs()]
        return [j for j in live if j.cancel_requested.is_set() and not j.cancelled.is_set()]

    def _admit(self) -> None:
        """Start pending requests, in order for each model: a request that does not fit
        its model's memory yet waits (and the later ones for that model with it), while
        other models' requests go ahead."""
        waiting: set[ModelSpec] = set()
        for request in list(self._pending):
            jobs = [job for job in request if not job.cancelled.is_set()]
            spec = jobs[0].spec if jobs else None
            if spec in waiting:
                continue
            try:
                if spec is not None and not self._start(spec, jobs):
                    waiting.add(spec)
                    continue
            except ServiceError as e:
                self._answer(jobs, e)
            except Exception as e:  # a bug: this request fails, the others go on
                log.exception("admitting a request failed")
                self._answer(jobs, internal_error(f"Generation failed: {e}"))
            self._pending.remove(request)

    def _start(self, spec: ModelSpec, jobs: list[GenerationJob]) -> bool:
        """Admit a request's jobs into its model's session; False if they must wait (for
        memory, or for their model's load)."""
        session = (
            self._session_loaded_in_background(spec)
            if self._load_in_background
            else self._session(spec)
        )
        if session is None:
            return False
        if not session.fits(jobs, self._kv_room(session)):
            return False
        self._starting = jobs
        try:
            for job in jobs:
                session.admit(job)
        finally:
            self._starting = []
        self._provider.touch(spec)
        return True

    @staticmethod
    def _answer(jobs: list[GenerationJob], error: ServiceError) -> None:
        for job in jobs:
            job.emit(ErrorEvent(error))

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Make `spec` resident and ready to serve (generation thread only: through
        `call`)."""
        if spec.generative:
            self._session(spec)
        return self._resident(spec)

    def run_with(self, spec: ModelSpec, fn: Callable[[Any], T]) -> T:
        """`fn` of the resident model of a kind that runs between the loop's steps
        (reranking, audio), loading it first if need be (generation thread only: through
        `call`)."""
        return fn(self._resident(spec).model)

    def embed(self, spec: ModelSpec, inputs: list[list[int]]) -> np.ndarray:
        """The embeddings of one batch of `inputs` in one forward pass, float32 (generation
        thread only: through `call`, between two steps of the batches; the service sends
        a request's inputs in batches of bounded size, see service/embeddings.py)."""
        return np.array(self._resident(spec).model.embed(inputs))

    def embeds_in_parts(self, spec: ModelSpec) -> bool:
        """Whether the embedding model takes one input a part at a time (through `call`)."""
        return bool(self._resident(spec).model.in_parts)

    def embed_part(
        self, spec: ModelSpec, part: PartialEmbedding | None, ids: list[int], last: bool
    ) -> PartialEmbedding:
        """The next part of one long input (through `call`); after the last, the part
        holds the input's vector."""
        model = self._resident(spec).model
        part = model.embed_part(part, ids)
        if last:
            part.vector = np.array(model.finish(part))[0]
        return part

    def unload(self, spec: ModelSpec) -> None:
        """Unload a model now (generation thread only); a 409 while it has requests."""
        if self._lockstep is not None:
            raise bad_request(
                "A model served across several machines (distributed) stays loaded.",
                param="model",
                code="model_pinned",
            )
        if self._busy(spec):
            raise ServiceError(
                ErrorKind.CONFLICT,
                f"{spec.path.name} has requests running or waiting; it is unloaded once idle.",
                param="model",
                code="model_busy",
            )
        self._unload(spec)

    def _check_served(self, spec: ModelSpec) -> None:
        """A model sharded across ranks is the only one its ranks serve: loading another
        (a hot swap, an embedding model) is a single-machine feature."""
        if self._lockstep is not None and spec != self._provider.default:
            raise bad_request(
                f"This server serves {self._provider.name(self._provider.default)} across "
                "several machines (distributed); it cannot load other models.",
                param="model",
                code="model_not_available",
            )

    def _resident(self, spec: ModelSpec) -> LoadedModel:
        """The model in memory, loaded first (making room for it) if need be."""
        self._check_served(spec)
        if not any(m.spec == spec for m in self._provider.resident):
            self._make_room(spec)
        return self._provider.activate(spec)

    def _session(self, spec: ModelSpec) -> Session:
        """The model's session, loading the model first if it is not resident."""
        session = self._sessions.get(spec)
        if session is not None:
            return session
        return self._opened(self._resident(spec))

    def _session_loaded_in_background(self, spec: ModelSpec) -> Session | None:
        """The model's session; None while its weights load on their own thread (the load
        begins here, after room is made for it, when no other load runs)."""
        if spec in self._sessions or any(m.spec == spec for m in self._provider.resident):
            return self._session(spec)
        loaded = self._loads.take(spec)
        if loaded is not None:
            return self._opened(self._provider.install(loaded))
        if self._loads.loading is None:
            self._check_served(spec)
            self._make_room(spec)
            self._loads.start(spec)
        return None

    def _opened(self, loaded: LoadedModel) -> Session:
        """A session for a model just made resident (unloaded again if none opens)."""
        try:
            session = self._open(loaded)
        except ServiceError:
            self._provider.unload(loaded.spec)
            raise
        self._sessions[loaded.spec] = session
        return session

    def _open(self, loaded: LoadedModel) -> Session:
        """A session for a model just loaded: a batch, or one request at a time."""
        draft_tokens = self._provider.config_for(loaded.spec).num_draft_tokens
        budget = self._memory_budget
        if budget is not None and budget <= self._weight_bytes():
            raise self._too_large(loaded.spec.path.name, loaded.nbytes)
        if not can_batch(loaded) and self._lockstep is not None:
            raise bad_request(
                f"{loaded.spec.path.name} cannot be batched, and only a batch runs in "
                "lockstep across machines: serve it on one machine."
            )
        if not can_batch(loaded) and loaded.spec.vision and loaded.draft_model is not None:
            raise bad_request(
                f"{loaded.spec.path.name}'s caches cannot drop a draft model's rejected "
                "drafts (a sliding window or recurrent layers): serve it without "
                "--draft-model."
            )
        if not can_batch(loaded):
            why = (
                "a vision model whose caches do not batch"
                if loaded.spec.vision
                else "a draft model beside caches that cannot drop its rejected drafts"
            )
            log.info("Serving %s one request at a time (%s)", loaded.spec.path, why)
            if loaded.spec.vision:  # the disk format is mlx-lm's cache classes
                self._cache.keep_off_disk(loaded.spec.key)
            return StreamSession(loaded, self._cache, self._limits.prefill_chunk, draft_tokens)
        lockstep = self._lockstep
        return BatchSession(
            loaded,
            self._cache,
            self._limits,
            self._trim_prompt_cache,
            draft_tokens,
            clock=lambda: self._now,
            worst=lockstep.worst if lockstep is not None else None,
            wake=self._wake,
        )

    def _too_large(self, name: str, weight_bytes: int) -> ServiceError:
        return bad_request(
            f"The memory budget ({format_bytes(self._memory_budget or 0)}) does not hold the "
            f"weights of {name} ({format_bytes(weight_bytes)}); raise --memory-budget-gb, or "
            "serve a smaller or quantized model (`mlxserve pull REPO --quantize 4`)."
        )

    def _make_room(self, spec: ModelSpec) -> None:
        """Unload idle models, least recently used first, until `spec`'s weights fit the
        memory budget beside the others; a 503 saying what is resident if they cannot."""
        budget = self._memory_budget
        if budget is None:
            return
        need = stored_bytes(spec)
        if need >= budget:
            raise self._too_large(spec.path.name, need)
        for loaded in self._provider.resident:
            if self._weight_bytes() + need <= budget:
                return
            if not self._busy(loaded.spec) and not self._provider.pinned(loaded.spec):
                self._unload(loaded.spec)
        if self._weight_bytes() + need > budget:
            resident = ", ".join(
                f"{self._provider.name(m.spec)} ({format_bytes(m.nbytes)}"
                f"{', busy' if self._busy(m.spec) else ''}"
                f"{', pinned' if self._provider.pinned(m.spec) else ''})"
                for m in self._provider.resident
            )
            raise ServiceError(
                ErrorKind.UNAVAILABLE,
                f"{spec.path.name} ({format_bytes(need)}) does not fit the memory budget "
                f"({format_bytes(budget)}) beside the resident models: {resident}. Retry "
                "when they are idle, or unload one.",
                param="model",
                code="insufficient_memory",
                retry_after=RETRY_AFTER_SECONDS,
            )

    def _wake(self) -> None:
        """Wake the loop if it waits for work (a load or an encoding ended); any thread."""
        self._intake.put(_wake_up)

    def _weight_bytes(self) -> int:
        """The resident models' weights and those of the model loading."""
        return self._provider.weight_bytes() + self._loads.reserved_bytes()

    def _busy(self, spec: ModelSpec) -> bool:
        session = self._sessions.get(spec)
        pending = any(job.spec == spec for request in self._pending for job in request)
        return pending or (session is not None and len(session) > 0)

    def _unload(self, spec: ModelSpec) -> None:
        session = self._sessions.pop(spec, None)
        if session is not None:
            session.close()
        self._cache.forget(spec.key)
        self._provider.unload(spec)

    def _unload_idle(self, limit: float) -> None:
        """Unload unpinned models unused for `limit` seconds; a busy model counts as used
        now."""
        for loaded in self._provider.resident:
            spec = loaded.spec
            if self._busy(spec):
                self._provider.touch(spec)
            elif self._provider.idle_for(spec) >= limit and not self._provider.pinned(spec):
                log.info("%s idle for %.0fs", spec.path.name, limit)
                self._unload(spec)

    def _kv_room(self, session: Session) -> int | None:
        """What the memory budget leaves for `session`'s KV caches: the budget less every
        resident model's weights and what the other sessions may grow to. A session alone
        in the thread may take its whole share (what `check_memory` let in fits it)."""
        budget = self._memory_budget
        if budget is None:
            return None
        others = [s for s in self._sessions.values() if s is not session]
        if len(session) == 0 and not any(len(s) for s in others):
            return None
        reserved = sum(s.reserved_bytes() for s in others)
        return budget - self._weight_bytes() - reserved

    def _trim_prompt_cache(self) -> None:
        """The prompt cache's byte budget covers the caches of running sequences too; the
        memory budget, less the weights, bounds it as well."""
        budgets = [self._cache.max_bytes]
        if self._memory_budget is not None:
            budgets.append(self._memory_budget - self._weight_bytes())
        known = [b for b in budgets if b is not None]
        if known:
            live = sum(
                s.live_bytes() for s in self._sessions.values() if isinstance(s, BatchSession)
            )
            self._cache.trim_to(min(known) - live)

    def _fail_in_flight(self, error: ServiceError) -> None:
        jobs = dict.fromkeys(self._starting)
        for session in self._sessions.values():
            jobs.update(dict.fromkeys(session.jobs()))
            session.close()
        self._sessions.clear()
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


def _wake_up() -> None:
    """Put on the intake to wake a waiting loop (a load or an encoding ended); does
    nothing itself."""


def _capture(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except Exception as e:
        return False, e
