"""Drafting with a draft model (--draft-model: a small language model) inside the
continuous batch, verified as prompt-lookup drafts are (`verify.SpeculativeBatch`)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.compat import install_generation_batch
from mlxserve.engine.speculation.draft_costs import DraftCosts
from mlxserve.engine.speculation.draft_guide import DraftGuide
from mlxserve.engine.speculation.draft_lengths import DraftLengths
from mlxserve.engine.speculation.rewind import rewind, roll_back, snapshot, take_again
from mlxserve.engine.speculation.verify import SpeculationCounts, SpeculativeBatch


class DraftModelBatch(SpeculativeBatch):
    """The batch of a model served with a draft model: each step the draft model writes
    as many tokens for every row as the longest row's draft length (`DraftLengths`, at
    most `max_draft`; greedily: one token with certainty, so the same acceptance rule
    holds; a constrained row's under its grammar, see `draft_guide`), and the model
    verifies each row's own length of them in one pass.

    Each row's cache list is the model's caches followed by the draft model's (as in
    mlx-lm's speculative decoding and the prompt cache). The draft's caches hold one token
    less than the model's: the batch takes a prompt's last token into the model alone, and
    each step the draft takes the model's last token with the next one (after a run of
    steps where no row drafted, first the tokens it missed: `_catch_up`). A verified pass
    adds as many positions to both, and each row drops as many of them (the drafted tokens
    it did not keep), so one roll-back serves both where the draft's caches are trimmed.

    A draft model with sliding-window or recurrent layers (Gemma 3's, Qwen3.5's small
    models) writes its chain a token at a time: into a wrapped window in place, over the
    entries a roll-back would need, and into its recurrent state. Those caches are kept as
    they were before the chain (`rewind.snapshot`), and where a row did not keep the whole
    pass the draft's caches go back there and take each row's kept tokens again in one
    pass (`rewind.rewind`; the draft's full-attention caches are trimmed to that point)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.draft_model: Any = None
        self._lengths = DraftLengths()
        self._snapshots: list[tuple | None] = []  # per draft cache, before the chain
        self._last: list[int] = []  # each row's last token before the chain
        self._behind = 0  # tokens every row's draft has still to take (`_catch_up`)

    def next(self) -> list[GenerationBatch.Response]:
        if not self.uids:
            return []
        lengths = self._lengths.of(self, self.max_draft)
        if not any(lengths):  # no draft pays, or every row at its token limit
            return GenerationBatch.next(self)
        self._catch_up()
        draft_caches = self._drafter_caches
        self._snapshots = [snapshot(c) for c in draft_caches]
        self._last = [tokens[-1] for tokens in self.tokens]
        last = mx.array(self._last, dtype=self.next_tokens.dtype)
        fed = mx.stack([last, self.next_tokens], axis=1)
        drafted = []
        guide = DraftGuide(self)
        for _ in range(max(lengths)):
            logits = self.draft_model(fed, cache=draft_caches)[:, -1, :]
            fed = guide.choose(logits).astype(self.next_tokens.dtype)[:, None]
            drafted.append(fed)
        guide.done()
        return self._verify(mx.concatenate(drafted, axis=1), lengths, [None] * len(lengths))

    def decode_step(self):
        """mlx-lm's step (no row drafts): the draft does not take its token now, but with
        the others it missed when a row drafts again (`_catch_up`): a step of the draft
        model each plain step would cost more than the tries it serves."""
        self._behind += 1
        return super().decode_step()

    def _catch_up(self) -> None:
        """Feed the draft, in one pass, the tokens it missed in plain steps, so its caches
        are again a token behind the model's. Every row missed as many (rows join a
        batch that has caught up), so the pass needs no padding."""
        if self._behind and self.uids:
            missed = [tokens[-1 - self._behind : -1] for tokens in self.tokens]
            take_again(self.draft_model, self._drafter_caches, missed)
        self._behind = 0

    def extend(self, batch: GenerationBatch) -> None:
        self._catch_up()
        super().extend(batch)

    def filter(self, keep: list[int]) -> None:
        super().filter(keep)
        if not keep:
            self._behind = 0

    def extract_cache(self, idx: int) -> list[Any]:
        """A row's caches for the prompt cache, the draft's brought level with the
        model's (both then hold the row's tokens)."""
        caches = super().extract_cache(idx)
        missed = mx.array([self.tokens[idx][-1 - self._behind :]], dtype=mx.int32)
        self.draft_model(missed, cache=caches[self.layers :])
        return caches

    def _record(self, row: int, drafted: int, accepted: int) -> None:
        self._lengths.record(self.uids[row], drafted, accepted)

    def _settle_drafter(self, inputs: mx.array, kept: list[list[int]], unkept: list[int]) -> None:
        """The draft's caches took the chain's positions, as many as the pass's: each row
        drops those it did not keep (see the class's docstring)."""
        if not any(unkept):
            return
        caches = self._drafter_caches
        if all(state is None for state in self._snapshots):
            roll_back(caches, unkept)
            return
        # the chain took the row's last token, then the pass's: the kept ones, less the last
        fed = [[last, *tokens[:-1]] for last, tokens in zip(self._last, kept, strict=True)]
        rewind(self.draft_model, caches, self._snapshots, inputs.shape[1], fed)


def draft_with_model(
    generator: BatchGenerator, max_draft: int, draft_model: Any, costs: DraftCosts | None = None
) -> SpeculationCounts:
    """Give `generator` a batch drafting up to `max_draft` tokens per sequence and step
    with `draft_model` (as long as `costs` pay for); returns its running counts."""
    batch = DraftModelBatch.empty(generator.model, generator.sampler)
    batch.draft_model = draft_model
    batch.layers = len(make_prompt_cache(generator.model))
    batch.max_draft = max_draft
    batch.costs = costs or DraftCosts()
    install_generation_batch(generator, batch)
    return batch.counts
