"""Speculative decoding from the context (prompt lookup), inside the continuous batch.

Much of what an agent writes repeats what it has read. Each step, a sequence looks up the
last few tokens of its own context (prompt and output so far); where they occurred before,
the tokens that followed predict its next token and draft those after it. One forward pass
then processes every sequence's next token and its draft together (B x (1 + longest draft)); each sequence keeps
the drafted tokens its own sampler agrees with, plus the sampler's token at the first
disagreement, and the positions it did not keep are rolled out of its row of the batch KV
cache (`prepare(right_padding=...)` + `finalize()`, the batch caches' own way of turning
right padding into left padding).

Comparing the sampled token with a single drafted token is the standard acceptance rule for
a draft that proposes one token with certainty: the kept token has the target
distribution, so greedy output is the plain output and sampled output is drawn from the
same distribution. Logits processors marked `per_position` (a logit bias) apply to every
position of a row at once. Those that follow the tokens are shown the row's positions one
at a time, each with its own context (the tokens before it, drafted ones included), and
the drafted tokens the row did not keep are then taken back (`rollback`): a penalty reads
only its context; a grammar's llguidance matcher and a reasoning budget roll back. So a
constrained row drafts, its drafts are verified under its grammar's mask at each position,
and a drafted token the grammar does not allow is never kept. A hybrid model's recurrent states
cannot drop positions: the pass keeps each gated delta-net layer's state at every position
(`recurrent_steps`), and a row takes the one after its last kept token; other recurrent
layers go back to where the pass began and take the kept tokens again (`_replay`).

Verifying k drafts costs about one step where decoding is bound by memory bandwidth (Metal,
CUDA, MLX's CPU backend with OpenBLAS), and k + 1 steps where it is bound by arithmetic
(MLX's CPU backend with its bundled BLAS); `draft_costs` measures which, so that "auto"
speculates only where it pays, and each row drafts no more than its acceptance pays for
at those costs. A model served with a draft model drafts with it instead
(`draft_model.DraftModelBatch`), through the same verification; a head or a DFlash
block drafter likewise (`head_drafts`, `block_drafts`). The drafts from the context come
from `prompt_lookup.NgramDrafter`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch

from mlxserve.compat import (
    GenerationBatchAdapter,
    empty_like,
    install_generation_batch,
    mend_window_masks,
)
from mlxserve.engine.generation.sampling import LogitsProcessor, per_position
from mlxserve.engine.speculation.draft_costs import DraftCosts
from mlxserve.engine.speculation.prompt_lookup import NgramDrafter
from mlxserve.engine.speculation.recurrent_steps import PassSteps, keep, recorded
from mlxserve.engine.speculation.rewind import is_recurrent, rewind, roll_back
from mlxserve.values import int_rows

# Verify passes beside single-token steps need mlx-lm's sliding-window masks mended.
mend_window_masks()


@dataclass
class SpeculationCounts:
    """Drafted and accepted tokens since the session opened, the drafts verified (a row's
    draft in one pass: accepted / verified is what a pass gains) and the passes a hybrid
    model ran a second time for its recurrent layers (`_replay`); for /metrics."""

    drafted: int = 0
    accepted: int = 0
    verified: int = 0
    replayed: int = 0


class SpeculativeBatch(GenerationBatchAdapter):
    """mlx-lm's generation batch with prompt-lookup drafts verified in its decode step.

    A step with no draft anywhere is mlx-lm's own step, unchanged."""

    # As mlx-lm's batch holds them once built (its annotations allow None).
    logits_processors: list[list[Callable]]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_draft = 0  # the most tokens drafted per sequence and step (set when installed)
        self.costs = DraftCosts()  # what a verify pass costs this device (set when installed)
        self.counts = SpeculationCounts()
        self.layers: int | None = None  # the model's caches: the first `layers` (None: all)
        self._drafters: dict[int, NgramDrafter] = {}

    def empty_sibling(self) -> SpeculativeBatch:
        """An empty batch that drafts from the context as this one does, its counts shared
        (what interactive work runs in while idle-priority rows are set aside; the drafter
        subclasses' rows are never set aside: `RowFeature.parks`)."""
        sibling = cast(SpeculativeBatch, empty_like(self))
        sibling.max_draft, sibling.costs, sibling.layers = self.max_draft, self.costs, self.layers
        sibling.counts = self.counts
        return sibling

    def next(self) -> list[GenerationBatch.Response]:
        if not self.uids:
            return []
        predictions = self._predictions()
        if not any(predictions):
            return super().next()
        drafts = [p[1:] for p in predictions]
        width = 1 + max(len(d) for d in drafts)
        padded = [d + [0] * (width - 1 - len(d)) for d in drafts]
        drafted = mx.array(padded, dtype=self.next_tokens.dtype)
        expected = [p[0] if p else None for p in predictions]
        return self._verify(drafted, [len(d) for d in drafts], expected)

    # Drafting -----------------------------------------------------------------------------

    def _predictions(self) -> list[list[int]]:
        """Each row's prediction of its next token and its draft after it (none for rows
        at their token limit). Predicting
        the next token too keeps drafting from waiting for it: it is still being computed
        (mlx-lm's step starts the next token before it returns this one)."""
        drafters = self._drafters
        self._drafters = {}
        predictions: list[list[int]] = []
        for i, uid in enumerate(self.uids):
            drafter = drafters.get(uid) or NgramDrafter(self.max_draft, self.costs)
            self._drafters[uid] = drafter
            room = self.room(i)
            if room <= 0:
                predictions.append([])
            else:
                predicted = drafter.propose(self.tokens[i], room)
                predictions.append(predicted if len(predicted) > 1 else [])
        return predictions

    def _record(self, row: int, drafted: int, accepted: int) -> None:
        self._drafters[self.uids[row]].record(drafted, accepted)

    def room(self, row: int) -> int:
        """How many tokens a row may draft after its next one (its token limit counts that
        one); 0 or less at the limit."""
        return self.max_tokens[row] - self.generated[row] - 1

    # Verifying ----------------------------------------------------------------------------

    def _verify(
        self, drafted: mx.array, lengths: list[int], expected: list[int | None]
    ) -> list[GenerationBatch.Response]:
        """One pass over each row's next token and its draft (`drafted`: B x longest draft,
        row i's first `lengths[i]` count); each row keeps what its sampler agrees with, and
        nothing drafted where `expected[i]` (if given) is not its next token."""
        inputs = mx.concatenate([self.next_tokens[:, None], drafted], axis=1)
        with recorded(self._model_caches, inputs.shape[1]) as steps:
            logits = self.model(inputs, cache=self._model_caches)
        logits = self._processed(inputs, logits, lengths)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled = self._sample(logprobs, [n + 1 for n in lengths])
        mx.eval(sampled, inputs, self.next_logprobs)
        chosen, rows = int_rows(sampled), int_rows(inputs)
        nexts = [row[0] for row in rows]
        drafts = [row[1 : 1 + n] for row, n in zip(rows, lengths, strict=True)]
        kept: list[list[int]] = []  # per row: the tokens this step puts in the cache
        reasons: list[str | None] = []
        after: list[tuple[int, int]] = []  # per row: the next token and its position
        for i, draft in enumerate(drafts):
            usable = draft if expected[i] in (None, nexts[i]) else []
            accepted = 0
            while accepted < len(usable) and chosen[i][accepted] == usable[accepted]:
                accepted += 1
            if draft:
                self._record(i, len(draft), accepted)
                self._take_back(i, draft, accepted)
                self.counts.drafted += len(draft)
                self.counts.accepted += accepted
                self.counts.verified += 1
            tokens, reason = self._until_finish(i, [nexts[i], *usable[:accepted]])
            kept.append(tokens)
            reasons.append(reason)
            after.append((chosen[i][accepted], accepted))

        self._settle(inputs, kept, steps)
        return self._respond(kept, reasons, after, logprobs)

    def _processed(self, inputs: mx.array, logits: mx.array, lengths: list[int]) -> mx.array:
        """Each row's logits processors (row i's next token and its `lengths[i]` drafted
        ones). Per-position ones apply to all its positions at once (they do not read the
        tokens); others are shown one position at a time with the tokens before it, as
        mlx-lm's own step feeds them (its token context takes the next token now, and the
        drafted ones it keeps in `_take_back`)."""
        if not any(self.logits_processors):
            return logits
        rows = []
        for e, processors in enumerate(self.logits_processors):
            row = logits[e]
            if per_position(processors):
                for processor in processors:
                    row = processor(inputs[e], row)
            else:
                context = self.token_context(e).update_and_fetch(inputs[e, :1])
                positions = []
                for j in range(1 + lengths[e]):
                    seen = mx.concatenate([context, inputs[e, 1 : 1 + j]]) if j else context
                    position = row[j : j + 1]
                    for processor in processors:
                        position = processor(seen, position)
                    positions.append(position)
                row = mx.concatenate([*positions, row[1 + lengths[e] :]], axis=0)
            rows.append(row)
        return mx.stack(rows)

    def _take_back(self, row: int, draft: list[int], accepted: int) -> None:
        """A row whose processors follow the tokens was shown its whole draft: its token
        context takes the accepted tokens, and its processors take back the others."""
        processors = self.logits_processors[row]
        if per_position(processors):
            return
        if accepted:
            self.token_context(row).update_and_fetch(mx.array(draft[:accepted], dtype=mx.int32))
        for processor in processors:  # built by sampling.build_logits_processors
            cast(LogitsProcessor, processor).rollback(len(draft) - accepted)

    def _sample(self, logprobs: mx.array, lengths: list[int]) -> mx.array:
        """Each row's sampler over its next token and drafted positions. A batch sharing
        one sampler samples in one call; otherwise each row samples only its own positions,
        so that a seeded sampler's draws do not depend on the other rows."""
        samplers = [self.fallback_sampler if s is None else s for s in self.samplers or ()]
        batch, width, vocab = logprobs.shape
        if all(s is samplers[0] for s in samplers):
            return samplers[0](logprobs.reshape(batch * width, vocab)).reshape(batch, width)
        rows = []
        for e, sampler in enumerate(samplers):
            row = sampler(logprobs[e, : lengths[e]])
            rows.append(mx.pad(row, (0, width - lengths[e])))
        return mx.stack(rows)

    def _until_finish(self, i: int, tokens: list[int]) -> tuple[list[int], str | None]:
        """The tokens a row keeps, cut after the one that finishes it (its token limit or
        an end-of-sequence token), and why it finished."""
        for n, token in enumerate(tokens):
            self.generated[i] += 1
            reason = "length" if self.generated[i] >= self.max_tokens[i] else None
            if self.stops_at(i, token):
                reason = "stop"
            if reason is not None:
                return tokens[: n + 1], reason
        return tokens, None

    def _settle(self, inputs: mx.array, kept: list[list[int]], steps: PassSteps | None) -> None:
        """Leave each row's caches holding the tokens it kept of the pass over `inputs`
        (`steps`: what the pass recorded of a model's recurrent layers), the model's and
        then the drafter's."""
        unkept = [inputs.shape[1] - len(tokens) for tokens in kept]
        caches = self._model_caches
        if steps is not None and not keep(caches, steps, [len(tokens) for tokens in kept]):
            self._replay(inputs, unkept, steps.snapshots)
        else:
            roll_back([c for c in caches if not is_recurrent(c)], unkept)
        self._settle_drafter(inputs, kept, unkept)

    def _settle_drafter(self, inputs: mx.array, kept: list[list[int]], unkept: list[int]) -> None:
        """A draft model's caches took the pass's positions too (see DraftModelBatch)."""
        roll_back(self._drafter_caches, unkept)

    @property
    def _model_caches(self) -> list[Any]:
        """The model's caches in the batch's cache list (the first `layers`)."""
        return self.prompt_cache[: self.layers]

    @property
    def _drafter_caches(self) -> list[Any]:
        """A draft model's or head's caches, after the model's (none without one)."""
        return self.prompt_cache[self.layers :] if self.layers is not None else []

    def _replay(self, inputs: mx.array, unkept: list[int], snapshots: list) -> None:
        """Roll back a model whose recurrent layers keep no state per position (see
        `recurrent_steps`): unless every row kept the whole pass, its caches go back to
        where the pass began (`snapshots`) and take each row's kept tokens again."""
        if not any(unkept):
            return
        self.counts.replayed += 1
        width = inputs.shape[1]
        kept = [row[: width - n] for row, n in zip(int_rows(inputs), unkept, strict=True)]
        rewind(self.model, self._model_caches, snapshots, width, kept)

    def _respond(
        self,
        kept: list[list[int]],
        reasons: list[str | None],
        after: list[tuple[int, int]],
        logprobs: mx.array,
    ) -> list[GenerationBatch.Response]:
        responses = []
        keep = []
        for i, tokens in enumerate(kept):
            self.tokens[i].extend(tokens)
            # The first token's distribution came from the previous step; each kept draft
            # token's from the position before it.
            row_logprobs = [
                self.next_logprobs[i],
                *(logprobs[i, j] for j in range(len(tokens) - 1)),
            ]
            finished = reasons[i] is not None
            for n, (token, lp) in enumerate(zip(tokens, row_logprobs, strict=True)):
                last = finished and n == len(tokens) - 1
                responses.append(
                    self.Response(
                        uid=self.uids[i],
                        token=token,
                        logprobs=lp,
                        finish_reason=reasons[i] if last else None,
                        prompt_cache=self.extract_cache(i) if last else None,
                        all_tokens=self.tokens[i] if last else None,
                    )
                )
            if not finished:
                keep.append(i)
        self.advance(
            mx.array([token for token, _ in after], dtype=self.next_tokens.dtype),
            [logprobs[i, position] for i, (_, position) in enumerate(after)],
        )
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses


def empty_sibling(batch: GenerationBatch) -> GenerationBatch:
    """An empty batch that decodes as `batch` does (a speculative one drafting alike, its
    counts shared): what other rows run in while `batch`'s rows are set aside."""
    return batch.empty_sibling() if isinstance(batch, SpeculativeBatch) else empty_like(batch)


def speculate_in(
    generator: BatchGenerator, max_draft: int, costs: DraftCosts | None = None
) -> SpeculationCounts:
    """Give `generator` a speculative generation batch drafting up to `max_draft` tokens
    per sequence and step from the context (as long as `costs` pay for); returns its
    running counts."""
    batch = SpeculativeBatch.empty(generator.model, generator.sampler)
    batch.max_draft = max_draft
    batch.costs = costs or DraftCosts()
    install_generation_batch(generator, batch)
    return batch.counts
