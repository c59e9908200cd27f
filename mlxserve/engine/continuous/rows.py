"""A continuous batch's rows: a running one (`Row`) and a prompt waiting to join
(`WaitingPrompt`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlxserve.engine.caches.prompt_cache import CacheHit
from mlxserve.engine.continuous.scheduler import Waiting
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.engine.generation.sequence import SequenceOutput


def reserved_tokens(job: GenerationJob) -> int:
    """The most tokens a job's KV cache can hold."""
    return len(job.prompt) + job.params.max_tokens


def key_tokens(job: GenerationJob) -> list[int]:
    """The prompt as the prompt cache knows it: a vision prompt's images stand as ids
    hashed from their bytes (see `PromptImages.cache_tokens`)."""
    return job.images.cache_tokens if job.images is not None else job.prompt


@dataclass
class Row:
    """A running row of the batch: its job, the job's output, and its prompt-cache key
    (the model's, and its adapter's)."""

    job: GenerationJob
    output: SequenceOutput
    key: str

    def key_tokens(self, tokens: list[int]) -> list[int]:
        """The row's tokens (its prompt, then what it generated) as the prompt cache keys
        them."""
        return key_tokens(self.job) + list(tokens[len(self.job.prompt) :])


@dataclass(eq=False)
class WaitingPrompt:
    """Jobs with one prompt, waiting for their turn; `hit.rest` shrinks as chunks of the
    prompt are processed into `hit.cache`."""

    jobs: list[GenerationJob]
    hit: CacheHit
    arrived: float
    key: str  # the prompt-cache key: the model's, and the jobs' adapter's
    # what a row feature keeps for the prompt meanwhile (a vision row's encoded images)
    state: dict[Any, Any] = field(default_factory=dict)

    def view(self, now: float) -> Waiting:
        return Waiting(len(self.hit.rest), len(self.jobs), now - self.arrived)

    def processed(self) -> list[int]:
        """The prompt's tokens processed so far, as the prompt cache keys them."""
        prompt = key_tokens(self.jobs[0])
        return prompt[: len(prompt) - len(self.hit.rest)]
