"""What one kind of row variation adds to the continuous batch (vision rows, adapter rows,
drafting, KV quantization, lockstep): the hooks the batch calls at each point of a row's
life, each a no-op here. A feature overrides the few it needs; `features.py` picks a
model's features, so a new kind of row is a new module and one line there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxserve.engine.caches.prompt_cache import CacheHit
from mlxserve.engine.continuous.rows import WaitingPrompt
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.protocol.errors import ServiceError


@dataclass(frozen=True)
class Forwarded:
    """A feature's own pass over a chunk of a waiting prompt: the model's final hidden
    states at its positions, where a drafter reads them (else None)."""

    hidden: mx.array | None


class PromptFailed(Exception):
    """Raised by a hook to answer a waiting prompt's jobs with `error` (its images could
    not be encoded): the prompt leaves, the batch goes on."""

    def __init__(self, error: ServiceError):
        super().__init__(str(error))
        self.error = error


class RowFeature:
    # Added to the prompt-cache key: entries laid out with the feature never meet others
    # (the disk tier outlives a configuration).
    key: str = ""
    # A row's whole state is in its caches: idle-priority rows may leave the batch whole
    # and come back (parking.py); a feature with state beside the caches says False.
    parks: bool = True

    # Building the batch ---------------------------------------------------------------

    def caches(self) -> list[Any]:
        """A sequence's caches the feature keeps after the model's (a drafter's)."""
        return []

    def joining(self, caches: list[Any]) -> list[Any]:
        """A row's caches as they join the batch or are kept as a checkpoint (KV
        quantization: quantized)."""
        return caches

    def refused(self, error: ValueError) -> ServiceError | None:
        """The error a failed measurement of the rows' caches is, in the feature's words
        (None: not the feature's)."""
        return None

    # A prompt waiting to join -----------------------------------------------------------

    def prompt_key(self, job: GenerationJob) -> str:
        """Added to the prompt-cache key for `job`'s rows (its adapter's)."""
        return ""

    def fetched(self, job: GenerationJob, hit: CacheHit) -> None:
        """The prompt's caches as the prompt cache gave them, made fit to process more."""

    def waits(self, waiting: WaitingPrompt) -> bool:
        """Whether the prompt waits for work off the generation thread (the loop then
        need not step for it; that work's end wakes it)."""
        return False

    def ready(self, waiting: WaitingPrompt) -> bool:
        """Whether the prompt may be processed now (may raise PromptFailed)."""
        return True

    def whole_prompt(self, waiting: WaitingPrompt) -> bool:
        """Whether the prompt must be processed but for its last token before its rows
        join (the batch feeds the last token to the model's caches alone)."""
        return False

    def forward(
        self, waiting: WaitingPrompt, tokens: list[int], start: int, caches: list[Any]
    ) -> Forwarded | None:
        """Run the model over a chunk of the prompt (`tokens`, from position `start`)
        into `caches` the feature's own way (None: the model's plain pass)."""
        return None

    def forwarded(
        self, tokens: list[int], following: list[int], caches: list[Any], hidden: mx.array | None
    ) -> None:
        """After the model's pass over a chunk: the feature's caches take it too
        (`following`: each position's next token; `hidden`: see Forwarded)."""

    # Running rows -----------------------------------------------------------------------

    def stepped(self, responses: list[Any]) -> None:
        """The tokens a step generated (mlx-lm's responses, each a row's token, in
        order)."""

    def live_bytes(self) -> int:
        """Memory the feature holds beside the caches."""
        return 0

    def close(self) -> None:
        """The batch is closing."""
