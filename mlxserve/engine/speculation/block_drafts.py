"""Drafting with a DFlash block drafter inside the continuous batch (`drafters/dflash.py`).

Each step the drafter takes the context it has not seen yet (the outputs of the layers
it reads, at the positions the model kept since) and guesses a block for every row in one
pass; the model verifies the guesses in the pass that decodes the step, exactly as it
verifies prompt-lookup drafts (`verify.SpeculativeBatch`), and the hidden states
that pass computes at the kept positions are the next step's new context. Guesses are
greedy, one token proposed with certainty, so the acceptance rule keeps the target
distribution.

The drafter's KV cache holds one entry per token in the model's cache, after the model's
in the row's cache list (as a draft model's are), so the batch, the prompt cache and the
disk tier carry it along. Only context enters it, so a rejected guess leaves nothing to
roll back. Each row's draft length follows its acceptance (`draft_lengths.DraftLength`): a
block pass costs about the same at any length, but a verify pass grows with its widest
row; where the device decides, no longer than its measured costs pay for, and none where
no length pays (`draft_costs`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.compat import install_generation_batch
from mlxserve.engine.speculation.draft_costs import DraftCosts
from mlxserve.engine.speculation.draft_guide import DraftGuide
from mlxserve.engine.speculation.draft_lengths import DraftLengths
from mlxserve.engine.speculation.recurrent_steps import PassSteps
from mlxserve.engine.speculation.rewind import roll_back
from mlxserve.engine.speculation.verify import SpeculationCounts, SpeculativeBatch


class BlockDraftBatch(SpeculativeBatch):
    """The batch of a model served with a DFlash drafter; `self.model` is the model
    wrapped in `drafters.hidden.HiddenCapture` (reading the drafter's layers), and
    `self.layers` counts the model's caches."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.drafter: Any = None
        self._unseen: list[mx.array] = []  # per row: 1 x n x width, context not yet taken
        self._lengths = DraftLengths()

    # The rows' state beside mlx-lm's ----------------------------------------------------------

    def extend(self, batch: GenerationBatch) -> None:
        """Rows join after their first step, mlx-lm's, which called the model last (on
        their prompt's last token)."""
        joining = self.model.hidden[:, -1:, :]
        super().extend(batch)
        self._unseen += [joining[i : i + 1] for i in range(joining.shape[0])]

    def filter(self, keep: list[int]) -> None:
        super().filter(keep)
        self._unseen = [self._unseen[i] for i in keep]

    def extract_cache(self, idx: int) -> list[Any]:
        """A row's caches for the prompt cache, the drafter's holding all its context."""
        self._take_unseen()
        return super().extract_cache(idx)

    # Steps ---------------------------------------------------------------------------------------

    def next(self) -> list[GenerationBatch.Response]:
        if not self.uids:
            return []
        self._take_unseen()
        lengths = self._lengths.of(self, self.max_draft)
        if not any(lengths):
            return GenerationBatch.next(self)
        guide = DraftGuide(self)
        choose = guide.choose if guide.guides else None  # else all positions at once
        drafted = self.drafter.draft(self.next_tokens, self._drafter_caches, max(lengths), choose)
        guide.done()
        return self._verify(drafted, lengths, [None] * len(lengths))

    def decode_step(self):
        """mlx-lm's step (no row drafts, every row at its token limit): its input is
        context the drafter has not seen."""
        result = super().decode_step()
        hidden = self.model.hidden
        self._unseen = [hidden[i : i + 1, -1:] for i in range(hidden.shape[0])]
        return result

    def _record(self, row: int, drafted: int, accepted: int) -> None:
        self._lengths.record(self.uids[row], drafted, accepted)

    # After a verified pass -------------------------------------------------------------------

    def _settle(self, inputs: mx.array, kept: list[list[int]], steps: PassSteps | None) -> None:
        verified = self.model.hidden  # the pass's (a replay calls the model again)
        super()._settle(inputs, kept, steps)
        self._unseen = [verified[i : i + 1, : len(tokens)] for i, tokens in enumerate(kept)]

    def _settle_drafter(self, inputs: mx.array, kept: list[list[int]], unkept: list[int]) -> None:
        """Nothing to take back: drafting added nothing to the drafter's cache."""

    def _take_unseen(self) -> None:
        """The drafter takes every row's unseen context, right-padded to the longest and
        the padding then rolled back (it becomes the rows' left padding)."""
        counts = [u.shape[1] for u in self._unseen]
        if not any(counts):
            return
        longest = max(counts)
        padded = [
            mx.pad(u, [(0, 0), (0, longest - n), (0, 0)])
            for u, n in zip(self._unseen, counts, strict=True)
        ]
        caches = self._drafter_caches
        self.drafter.take(mx.concatenate(padded), caches)
        roll_back(caches, [longest - n for n in counts])
        mx.async_eval([c.state for c in caches])
        width = self._unseen[0].shape[-1]
        self._unseen = [mx.zeros((1, 0, width)) for _ in counts]


def draft_in_blocks(
    generator: BatchGenerator, drafter: Any, max_draft: int, costs: DraftCosts | None = None
) -> SpeculationCounts:
    """Give `generator` (whose model is wrapped in drafters.hidden.HiddenCapture) a batch that
    drafts up to `max_draft` tokens per sequence and step with the DFlash `drafter`, as
    long as `costs` pay for; returns its counts."""
    batch = BlockDraftBatch.empty(generator.model, generator.sampler)
    batch.drafter = drafter
    batch.max_draft = max_draft
    batch.costs = costs or DraftCosts()
    batch.layers = len(make_prompt_cache(generator.model))
    install_generation_batch(generator, batch)
    return batch.counts
