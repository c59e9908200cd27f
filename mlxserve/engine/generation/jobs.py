"""What HTTP threads hand the generation thread, and the events they get back."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from mlxserve.engine.generation.sampling import GenerationParams
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import ServiceError, preempted


@dataclass
class TokenEvent:
    """A generated token and the text that became safe to emit with it (may be empty)."""

    text: str
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class FinishEvent:
    finish_reason: str  # stop or length
    text: str  # text held back until the end (a partial stop string that never completed)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_sequence: str | None = None  # the stop string that ended the sequence, if one did
    diverged_at: int | None = None  # see CacheHit


@dataclass
class ErrorEvent:
    error: ServiceError


JobEvent = TokenEvent | FinishEvent | ErrorEvent  # what a job emits (not postprocess.events)


@dataclass(frozen=True, eq=False)
class PromptImages:
    """A vision prompt's images as the model's processor prepared them.

    `cache_tokens` is the prompt with each image's placeholder tokens replaced by an id
    derived from the bytes of the images so far: the prompt cache then matches a prefix
    only where the same images stand. `spans` are the placeholders' [start, end) ranges."""

    pixel_values: Any
    extra: dict[str, Any]  # other processor outputs the model takes (image_grid_thw, ...)
    attention_mask: Any
    cache_tokens: list[int]
    spans: tuple[tuple[int, int], ...]

    def reusable(self, cached: int) -> int:
        """How much of a cached prefix may be reused: the model embeds images from the
        whole prompt's pixels, so the prefix must hold every image or none."""
        if not self.spans or cached >= self.spans[-1][1]:
            return cached
        return min(cached, self.spans[0][0])

    def images_after(self, cached: int) -> bool:
        return bool(self.spans) and cached < self.spans[-1][1]


@dataclass(eq=False)
class GenerationJob:
    """One sequence to generate. The jobs of one request share an event queue; each event
    goes on it as (index, event)."""

    spec: ModelSpec
    prompt: list[int]
    params: GenerationParams
    index: int = 0
    images: PromptImages | None = None
    # prompt lengths where a cache that cannot be trimmed back is kept on the way (the end
    # of the system prompt and tools, which new conversations share)
    checkpoints: tuple[int, ...] = ()
    adapter: str | None = None  # the adapter its rows run under (a served name), if any
    # Batch work: it takes only slots no other request wants, and steps aside while one
    # runs (paused, or ended with `preempted` for its caller to run it again later)
    idle_priority: bool = False
    events: queue.Queue = field(default_factory=queue.Queue)
    # What the generation loop reads. Where several ranks run the loop in lockstep, a
    # cancellation is only requested here and takes effect at the loop step the worker
    # picks, the same step on every rank (see GenerationWorker).
    cancelled: threading.Event = field(default_factory=threading.Event)
    # The client has what it wants (an editor's time or indentation limit): the sequence
    # ends at the next step as if it had stopped, its cache kept
    finish_requested: threading.Event = field(default_factory=threading.Event)
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    cancel_at_step: bool = False

    def emit(self, event: JobEvent) -> None:
        self.events.put((self.index, event))

    def preempt(self) -> None:
        """End an idle-priority job now for interactive work that wants its place."""
        self.cancelled.set()
        self.emit(ErrorEvent(preempted()))

    def cancel(self) -> None:
        self.cancel_requested.set()
        if not self.cancel_at_step:
            self.cancelled.set()
