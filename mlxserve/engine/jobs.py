"""What HTTP threads hand the generation thread, and the events they get back."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from mlxserve.api.errors import APIError
from mlxserve.engine.sampling import GenerationParams
from mlxserve.models.provider import ModelSpec


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


@dataclass
class ErrorEvent:
    error: APIError


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass(eq=False)
class GenerationJob:
    """One sequence to generate. The jobs of one request share an event queue; each event
    goes on it as (index, event)."""

    spec: ModelSpec
    prompt: list[int]
    params: GenerationParams
    index: int = 0
    num_draft_tokens: int = 3
    events: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, event: Event) -> None:
        self.events.put((self.index, event))

    def cancel(self) -> None:
        self.cancelled.set()
