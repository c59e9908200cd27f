"""A session: how one resident generative model runs its requests. Two kinds implement it:
the continuous batch (continuous/continuous_batch.py), and one request at a time
(single/stream_session.py) for models batching cannot serve. The generation loop steps
every busy session in turn and knows them only through this protocol."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mlxserve.engine.caches.prompt_cache import PromptCache
from mlxserve.engine.continuous.continuous_batch import (
    ContinuousBatch,
    ContinuousBatchLimits,
    can_batch,
)
from mlxserve.engine.continuous.drafting import drops_drafts
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.engine.loop.loop_step import Lockstep
from mlxserve.engine.memory.footprint import KVFootprint
from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.engine.single.stream_session import StreamSession
from mlxserve.engine.speculation.verify import SpeculationCounts
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import bad_request

log = logging.getLogger(__name__)


class Session(Protocol):
    @property
    def spec(self) -> ModelSpec: ...

    @property
    def weight_bytes(self) -> int:
        """The model's weights (its draft model's and head's included)."""
        ...

    @property
    def footprint(self) -> KVFootprint | None:
        """KV bytes per sequence (None: not measured, one sequence at a time)."""
        ...

    @property
    def checkpoints(self) -> bool:
        """Prompts leave checkpoints on the way: the caches continue only from exact
        prefixes."""
        ...

    @property
    def speculation(self) -> SpeculationCounts | None:
        """Its drafts' counts, where it drafts."""
        ...

    @property
    def trace(self) -> int:
        """A hash of every token generated (where ranks run in lockstep), else 0."""
        ...

    def __len__(self) -> int:
        """Jobs running or waiting to run."""
        ...

    @property
    def decoding(self) -> int:
        """Jobs past their prompt, generating."""
        ...

    @property
    def idle_slots(self) -> int:
        """Sequences of idle-priority work it could take now: none while interactive
        work runs or waits in it."""
        ...

    def preempt_idle(self) -> None:
        """End every idle-priority job (they run again later) for interactive work that
        wants their memory."""
        ...

    def ready(self) -> bool:
        """Whether a step would do anything now."""
        ...

    def jobs(self) -> list[GenerationJob]: ...

    def fits(self, jobs: list[GenerationJob], room: int | None) -> bool:
        """Whether `jobs` may join now within `room` bytes of KV cache (None: unbounded)."""
        ...

    def reserved_bytes(self) -> int:
        """The KV bytes it may grow to with the jobs it holds."""
        ...

    def live_bytes(self) -> int:
        """The KV bytes it holds now."""
        ...

    def admit(self, job: GenerationJob) -> None: ...

    def step(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SessionContext:
    """What every session of one generation loop shares."""

    cache: PromptCache
    limits: ContinuousBatchLimits
    # Called when KV caches grew or were set free, for the prompt cache to give way
    # within the budget (the loop knows every model's).
    trim_prompt_cache: Callable[[], None]
    clock: Callable[[], float]  # the loop iteration's now
    wake: Callable[[], None]  # wakes the loop waiting for work
    lockstep: Lockstep | None  # ranks following this loop, if any


def open_session(loaded: LoadedModel, draft_tokens: int, context: SessionContext) -> Session:
    """A session for a model just loaded: a batch where its caches batch, else one
    request at a time; a 400 for what neither can serve."""
    spec = loaded.spec
    if loaded.draft_model is not None and not drops_drafts(loaded):
        log.warning(
            "%s does not draft with --draft-model: its caches cannot drop the drafts it "
            "rejects (chunked attention); served without it",
            spec.path.name,
        )
        loaded.drop_draft_model()
    batches = can_batch(loaded)
    if not batches and context.lockstep is not None:
        raise bad_request(
            f"{spec.path.name} cannot be batched, and only a batch runs in "
            "lockstep across machines: serve it on one machine."
        )
    if not batches:
        log.info("Serving %s one request at a time (its caches do not batch)", spec.path)
        if spec.vision:  # the disk format is mlx-lm's cache classes
            context.cache.keep_off_disk(spec.key)
        return StreamSession(loaded, context.cache, context.limits.prefill_chunk)
    lockstep = context.lockstep
    return ContinuousBatch(
        loaded,
        context.cache,
        context.limits,
        context.trim_prompt_cache,
        draft_tokens,
        clock=context.clock,
        worst=lockstep.worst if lockstep is not None else None,
        wake=context.wake,
    )
