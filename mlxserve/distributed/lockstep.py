"""The engine's Lockstep for a distributed server: rank 0 (Leader) publishes each step of
its generation loop; the other ranks (Follower) rebuild the step's jobs and replay it.

A step travels as plain data (`WireStep`): jobs by number, prompts as token ids (and a
vision prompt's prepared images), sampling parameters as they are but for a grammar,
which goes as its source and is compiled again on each rank (a compiled grammar is tied
to its process).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import pickle
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlxserve.distributed.control import Hub, Link
from mlxserve.distributed.world import World, largest
from mlxserve.engine.generation.jobs import GenerationJob, PromptImages
from mlxserve.engine.generation.sampling import GenerationParams
from mlxserve.engine.loop.loop_step import LoopStep
from mlxserve.models.spec import ModelSpec
from mlxserve.structured.matcher import Grammar

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WireJob:
    id: int
    prompt: list[int]
    params: GenerationParams  # without its grammar
    grammar: tuple[str, str | None] | None  # the grammar's Lark source and trigger
    index: int
    checkpoints: tuple[int, ...]
    images: PromptImages | None  # a vision prompt's prepared pixels: every rank encodes them


@dataclass(frozen=True)
class WireStep:
    now: float
    arrived: list[list[WireJob]]
    cancelled: list[int]
    stop: bool
    trace: int


class Leader:
    """Rank 0's Lockstep: numbers the jobs it publishes and sends each step to the others."""

    follows = False

    def __init__(self, world: World, hub: Hub, on_failure: Callable[[str], None]):
        self._world = world
        self._hub = hub
        self._on_failure = on_failure
        self._ids: weakref.WeakKeyDictionary[GenerationJob, int] = weakref.WeakKeyDictionary()
        self._numbers = itertools.count()

    def receive(self) -> LoopStep:
        raise RuntimeError("rank 0 takes its steps from its clients")

    def publish(self, step: LoopStep) -> None:
        wire = WireStep(
            step.now,
            [[self._wire(job) for job in request] for request in step.arrived],
            [self._ids[job] for job in step.cancelled if job in self._ids],
            step.stop,
            step.trace,
        )
        self._hub.send(pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL), last=step.stop)

    def _wire(self, job: GenerationJob) -> WireJob:
        number = self._ids[job] = next(self._numbers)
        grammar = job.params.grammar
        return WireJob(
            number,
            job.prompt,
            dataclasses.replace(job.params, grammar=None),
            (grammar.lark, grammar.trigger) if grammar is not None else None,
            job.index,
            job.checkpoints,
            job.images,
        )

    def worst(self, value: float) -> float:
        return largest(self._world, value)

    def failed(self, error: BaseException) -> None:
        self._on_failure(f"the generation loop failed: {error}")


class Follower:
    """Another rank's Lockstep: turns rank 0's steps into jobs of its own and hands them
    to its worker. Its jobs' events go nowhere: rank 0 answers the clients."""

    follows = True

    def __init__(
        self,
        world: World,
        link: Link,
        spec: ModelSpec,
        tokenizer: Any,
        on_failure: Callable[[str], None],
    ):
        """`on_failure`: leaves the group (rank 0 notices and answers its clients)."""
        self._world = world
        self._on_failure = on_failure
        self._link = link
        self._spec = spec
        self._tokenizer = tokenizer
        self._jobs: weakref.WeakValueDictionary[int, GenerationJob] = weakref.WeakValueDictionary()

        self.lost = False  # rank 0's line closed without a last step

    def publish(self, step: LoopStep) -> None:
        raise RuntimeError("only rank 0 publishes steps")

    def worst(self, value: float) -> float:
        return largest(self._world, value)

    def failed(self, error: BaseException) -> None:
        self._on_failure(f"The generation loop failed: {error}")

    def receive(self) -> LoopStep:
        payload = self._link.receive()
        if payload is None:
            self.lost = True
            return LoopStep(time.perf_counter(), stop=True)
        return self._step(pickle.loads(payload))

    def _step(self, wire: WireStep) -> LoopStep:
        arrived = [[self._job(job) for job in request] for request in wire.arrived]
        cancelled = [job for n in wire.cancelled if (job := self._jobs.get(n)) is not None]
        return LoopStep(wire.now, arrived, cancelled, wire.stop, wire.trace)

    def _job(self, wire: WireJob) -> GenerationJob:
        params = wire.params
        if wire.grammar is not None:
            params = dataclasses.replace(params, grammar=self._grammar(*wire.grammar))
        job = GenerationJob(
            self._spec,
            wire.prompt,
            params,
            wire.index,
            images=wire.images,
            checkpoints=wire.checkpoints,
        )
        job.cancel_at_step = True
        self._jobs[wire.id] = job
        return job

    @functools.lru_cache(maxsize=16)  # noqa: B019 (one Follower per process)
    def _grammar(self, lark: str, trigger: str | None) -> Grammar:
        return Grammar(self._tokenizer, lark, trigger=trigger)
