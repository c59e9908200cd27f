"""A drafter's guesses shown to each row's logits processors while it drafts.

A verify pass shows each drafted position to the row's processors (a grammar's mask,
penalties, a logit bias, a reasoning budget) before the row's sampler picks its token
there, so a guess the grammar forbids is never kept: it ends the row's draft. A drafter
that guesses greedily from its own logits does not know the grammar, so a constrained row
whose reply the drafter would not write (a schema's field names, a regex's alphabet) drafts
guesses that are all refused. `DraftGuide` processes the drafter's logits for each guess
as the verify pass will process the model's, each with the guesses before it, so the row
guesses what its grammar allows (the drafter's best allowed token); `done` takes the
guesses back from the processors, and the verify pass shows them again.

Used by the draft model's chain, the MTP heads' chains and DFlash's blocks (whose
logits cover the model's vocabulary); an EAGLE-3 drafter's logits cover its own smaller
vocabulary and are not guided.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx

from mlxserve.engine.generation.sampling import LogitsProcessor, per_position


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


class DraftGuide:
    """The guesses of one drafting step for a batch (`batch`: a speculative batch; its rows'
    processors, token contexts and next tokens); none guided unless `guided` (a drafter
    whose logits cover the model's vocabulary)."""

    def __init__(self, batch: Any, guided: bool = True):
        self._processors: list[list[Callable]] = batch.logits_processors
        self._rows = [e for e, p in enumerate(self._processors) if p and guided]
        self._vocab = batch.next_logprobs[0].shape[-1] if self._rows else 0
        self._seen: dict[int, mx.array] = {}
        if self._rows:
            nexts = batch.next_tokens
            for e in self._rows:
                self._seen[e] = mx.concatenate([batch.tokens_seen(e), nexts[e : e + 1]])
        self._shown = 0

    @property
    def guides(self) -> bool:
        """Whether any row has processors to guide its guesses."""
        return bool(self._rows)

    def choose(self, logits: mx.array, guess: Callable[[mx.array], mx.array] = greedy) -> mx.array:
        """Each row's next guess (B) from the drafter's `logits` for it (B x vocabulary):
        a guided row's after its processors, shown the guesses so far."""
        if not self._rows:
            return guess(logits)
        rows = list(self._fitted(logits))
        for e in self._rows:
            row = rows[e][None]
            seen = self._seen[e]
            for processor in self._processors[e]:
                row = processor(seen, row)
            rows[e] = row[0]
        tokens = guess(mx.stack(rows))
        for e in self._rows:
            self._seen[e] = mx.concatenate([self._seen[e], tokens[e : e + 1].astype(mx.int32)])
        self._shown += 1
        return tokens

    def done(self) -> None:
        """The processors take back every guess they were shown (and the next token the
        first guess followed): the verify pass shows them again."""
        if not self._shown:
            return
        for e in self._rows:
            if not per_position(self._processors[e]):
                for processor in self._processors[e]:  # built by sampling.build_logits_processors
                    cast(LogitsProcessor, processor).rollback(self._shown)
        self._shown = 0

    def _fitted(self, logits: mx.array) -> mx.array:
        """A drafter's logits (B x its vocabulary) over the model's vocabulary (the two
        may be padded to other sizes past the tokenizer's)."""
        rows, size = logits.shape
        if size > self._vocab:
            return logits[:, : self._vocab]
        if size < self._vocab:
            pad = mx.full((rows, self._vocab - size), -mx.inf, logits.dtype)
            return mx.concatenate([logits, pad], axis=1)
        return logits
