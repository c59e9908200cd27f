"""What keeps the generation loops of several ranks identical (mlxserve.distributed
implements it; a single process has none).

Each rank of a sharded model holds part of every layer or a share of the layers, so each
model call is a collective: every rank must make the same calls, in the same order, with
the same shapes. The loops are deterministic given their inputs, so rank 0 decides each
step's inputs (what arrived, what was cancelled, the scheduler's clock, whether to stop)
and the other ranks replay them: a `LoopStep` per iteration of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from mlxserve.engine.generation.jobs import GenerationJob


@dataclass
class LoopStep:
    """One iteration's inputs of the generation loop."""

    now: float  # the clock the scheduler reads in this iteration (rank 0's)
    arrived: list[list[GenerationJob]] = field(default_factory=list)  # requests, in order
    cancelled: list[GenerationJob] = field(default_factory=list)  # cancelled from now on
    stop: bool = False
    # What rank 0 generated so far (GenerationWorker.trace): a rank whose own differs has
    # diverged, and says so instead of mixing its shares of other sequences into rank 0's
    trace: int = 0


class Lockstep(Protocol):
    @property
    def follows(self) -> bool:
        """True on the ranks that replay rank 0's steps."""
        ...

    def publish(self, step: LoopStep) -> None:
        """Rank 0: hand the step to the other ranks before running it."""
        ...

    def receive(self) -> LoopStep:
        """The other ranks: rank 0's next step, read on the generation thread itself (no
        hand-over between threads on the way); a stopping step once rank 0 is gone."""
        ...

    def worst(self, value: float) -> float:
        """The largest of every rank's `value`, for a decision each rank measures on its
        own share (what its caches need, what verifying a draft costs it), which every
        rank must take alike (a collective: every rank calls it at the same point)."""
        ...

    def failed(self, error: BaseException) -> None:
        """The loop failed mid-step: the ranks may have diverged, the group cannot go on."""
        ...
