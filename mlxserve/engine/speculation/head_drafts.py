"""Drafting with a head that reads the model's hidden states, inside the continuous batch:
the model's own MTP head, or an EAGLE-3 drafter (`drafters/`; both called "the head" here).

Each step the head drafts for every row, chained: from the model's hidden state at its
last position and its next token it predicts the token after, then goes on from its own
output, as many guesses as the longest row's draft length (each row's follows its
acceptance, up to `draft_tokens` and, where the device decides, what its measured costs
pay for: `draft_lengths.DraftLengths`). The model verifies them in the pass that decodes
the step, exactly as it verifies prompt-lookup drafts (`verify.SpeculativeBatch`);
a row whose context predicts a draft (prompt lookup, where enabled) verifies that one
instead, in the same pass. Drafts are greedy, one token proposed with certainty, so the
acceptance rule keeps the target distribution.

The head has a KV cache per row, after the model's in the row's cache list (as a draft
model's are), so the batch, the prompt cache and the disk tier carry it along. Its entry
at position i is the head's pass over (the model's hidden state at i, the token at i + 1),
so it holds one entry less than the model's cache: the next token is still being sampled.
After a verified pass the entries drafted on the head's own guesses are dropped and the
kept positions are fed again with the model's hidden states from that pass (right-padded
per row, as a rolled-back pass is), so every entry is the one a plain decode would make.
A cache entry stored when a sequence finished misses its last entry (the token after it
was never sampled); a prompt continuing from it leaves that one entry out, which can only
make a draft a little worse, never an output different.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.compat import install_generation_batch
from mlxserve.engine.drafters.eagle3 import Eagle3Drafter
from mlxserve.engine.speculation.draft_costs import DraftCosts
from mlxserve.engine.speculation.draft_guide import DraftGuide
from mlxserve.engine.speculation.draft_lengths import DraftLengths
from mlxserve.engine.speculation.recurrent_steps import PassSteps
from mlxserve.engine.speculation.rewind import roll_back
from mlxserve.engine.speculation.verify import SpeculationCounts, SpeculativeBatch


class HeadDraftBatch(SpeculativeBatch):
    """The batch of a model served with a head drafter; `self.model` is the model wrapped
    in `drafters.hidden.HiddenCapture`, and `self.layers` counts the model's caches."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.head: Any = None
        self.draft_tokens = 0
        self.lookup = False  # prompt-lookup drafts where the context predicts one
        self._hidden: mx.array | None = None  # B x 1 x width: the model's at its last position
        self._from_lookup: set[int] = set()  # rows whose draft this step came from the context
        self._chain = 0  # the head's guesses this step (its cache took as many entries)
        self._lengths = DraftLengths()  # the head's draft length per row
        self._verified: Any = None  # the verified pass's hidden states

    # The rows' state beside mlx-lm's ----------------------------------------------------------

    def extend(self, batch: GenerationBatch) -> None:
        """Rows join after their first step, mlx-lm's, which called the model last."""
        joining = self.model.hidden[:, -1:, :]
        super().extend(batch)
        self._hidden = joining if self._hidden is None else mx.concatenate([self._hidden, joining])

    def filter(self, keep: list[int]) -> None:
        super().filter(keep)
        self._hidden = self._hidden[mx.array(keep)] if keep and self._hidden is not None else None

    # Steps ---------------------------------------------------------------------------------------

    def next(self) -> list[GenerationBatch.Response]:
        if not self.uids:
            return []
        guessed = self._lengths.of(self, self.draft_tokens)  # the head's, per row
        lookups = self._predictions() if self.lookup else [[] for _ in self.uids]
        if not any(guessed) and not any(lookups):  # no draft pays, or every row at its limit
            return GenerationBatch.next(self)
        self._from_lookup = {i for i, p in enumerate(lookups) if p}
        lengths = [len(p) - 1 if p else n for p, n in zip(lookups, guessed, strict=True)]
        longest = max(lengths)
        table = [p[1:] + [0] * (longest - len(p) + 1) if p else [0] * longest for p in lookups]
        drafted = mx.array(table, dtype=self.next_tokens.dtype)
        chain = max((n for i, n in enumerate(guessed) if i not in self._from_lookup), default=0)
        if chain:
            guesses = self._draft(chain)
            if longest > chain:
                guesses = mx.pad(guesses, [(0, 0), (0, longest - chain)])
            from_lookup = mx.array([i in self._from_lookup for i in range(len(lookups))])
            drafted = mx.where(from_lookup[:, None], drafted, guesses[:, :longest])
        self._chain = chain
        expected = [p[0] if p else None for p in lookups]
        return self._verify(drafted, lengths, expected)

    def _draft(self, count: int) -> mx.array:
        """`count` tokens per row, each the head's greedy guess after the one before
        (B x count); the head's cache takes `count` entries."""
        tokens = self.next_tokens[:, None]
        hidden = self._hidden
        guesses = []
        guide = DraftGuide(self, guided=self._guided)
        for _ in range(count):
            logits, hidden = self.head(tokens, hidden, self._drafter_caches)
            tokens = guide.choose(logits[:, -1, :], self.head.guess)
            tokens = tokens.astype(self.next_tokens.dtype)[:, None]
            guesses.append(tokens)
        guide.done()
        return mx.concatenate(guesses, axis=1)

    @property
    def _guided(self) -> bool:
        """Whether the head's logits cover the model's vocabulary, for a constrained row's
        grammar to mask (see `draft_guide`): an EAGLE-3 drafter's cover its own, unless it
        maps none of its ids."""
        return not isinstance(self.head, Eagle3Drafter) or self.head.drafter.d2t is None

    def decode_step(self):
        """mlx-lm's step (no row drafts): the head first takes the entry for the model's
        last hidden state and the token this step feeds it."""
        self.head(self.next_tokens[:, None], self._hidden, self._drafter_caches)
        result = super().decode_step()
        self._hidden = self.model.hidden[:, -1:, :]
        mx.async_eval(self._hidden, [c.state for c in self._drafter_caches])
        return result

    def _record(self, row: int, drafted: int, accepted: int) -> None:
        """Prompt lookup's draft length and the head's each follow their own acceptance."""
        if row in self._from_lookup:
            super()._record(row, drafted, accepted)
        else:
            self._lengths.record(self.uids[row], drafted, accepted)

    # After a verified pass -------------------------------------------------------------------

    def _settle(self, inputs: mx.array, kept: list[list[int]], steps: PassSteps | None) -> None:
        self._verified = self.model.hidden  # the pass's (a replay calls the model again)
        super()._settle(inputs, kept, steps)

    def _settle_drafter(self, inputs: mx.array, kept: list[list[int]], unkept: list[int]) -> None:
        """Drop the head's entries made on its own guesses and feed it the kept positions
        with the model's hidden states from the pass. Column j of `inputs` follows the
        hidden state at column j of [the last one, the pass's]."""
        verified = self._verified
        accepted = [len(tokens) - 1 for tokens in kept]
        start = 1 if self._chain else 0  # the chain's first entry was the model's
        if self._chain > 1:
            for cache in self._drafter_caches:
                cache.trim(self._chain - 1)
        end = 1 + max(accepted)
        if end > start:
            assert self._hidden is not None  # set for every row when it joined
            hidden = mx.concatenate([self._hidden, verified], axis=1)
            self.head(inputs[:, start:end], hidden[:, start:end], self._drafter_caches)
            roll_back(self._drafter_caches, [max(accepted) - a for a in accepted])
            mx.async_eval([c.state for c in self._drafter_caches])
        rows = mx.arange(len(accepted))
        self._hidden = verified[rows, mx.array(accepted)][:, None, :]
        mx.async_eval(self._hidden)


def draft_with_head(
    generator: BatchGenerator,
    head: Any,
    head_drafts: int,
    max_draft: int,
    costs: DraftCosts | None = None,
) -> SpeculationCounts:
    """Give `generator` (whose model is wrapped in drafters.hidden.HiddenCapture) a batch that
    drafts `head_drafts` tokens per sequence and step with `head`, or up to
    `max_draft` from the context where it predicts them (0: never), as long as `costs`
    pay for; returns its counts."""
    batch = HeadDraftBatch.empty(generator.model, generator.sampler)
    batch.head = head
    batch.draft_tokens = head_drafts
    batch.max_draft = max_draft
    batch.lookup = max_draft > 0
    batch.costs = costs or DraftCosts()
    batch.layers = len(make_prompt_cache(generator.model))
    install_generation_batch(generator, batch)
    return batch.counts
