"""Prompt lookup: a sequence's drafts from its own context (see `verify` for how the batch
verifies them)."""

from __future__ import annotations

from mlxserve.engine.speculation.draft_costs import DraftCosts, PaidLength

NGRAM_SIZES = (8, 6, 4, 3, 2)  # the context's last n tokens looked up, longest first
FIRST_DRAFT = 4  # a new sequence's draft length, before its acceptance is known
MAX_BACKOFF_STEPS = 32  # the longest pause after drafts were rejected outright


class NgramDrafter:
    """One sequence's drafts: an index of where each n-gram of its context last ended,
    and a draft length that follows how much of its drafts was accepted, within what the
    device's `costs` pay for at its acceptance."""

    def __init__(self, max_draft: int, costs: DraftCosts | None = None):
        self._max = max_draft
        self._paid = PaidLength(costs or DraftCosts())
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # positions of the context whose n-grams are in the index
        self.length = min(FIRST_DRAFT, max_draft)
        self._pause = 0  # steps left without drafting
        self._misses = 0  # drafts rejected outright in a row

    def propose(self, context: list[int], limit: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the context's last n
        tokens: a prediction of the next token (sampled, not yet known here) and up to
        `limit` drafted after it. Where the occurrence is recent, the prediction runs on
        over its own tokens, so a repeating stretch is drafted at full length."""
        if self._pause:
            self._pause -= 1
            return []
        self._catch_up(context)
        for n in NGRAM_SIZES:
            end = self._index.get(tuple(context[-n:])) if len(context) > n else None
            if end is not None:
                paid = self._paid.length(self._max)
                predicted: list[int] = []
                for position in range(end, end + 1 + min(self.length, limit, paid)):
                    known = position < len(context)
                    predicted.append(
                        context[position] if known else predicted[position - len(context)]
                    )
                return predicted
        return []

    def record(self, drafted: int, accepted: int) -> None:
        """Lengthen the drafts while they are accepted whole, shorten them to what was
        accepted, and pause drafting (longer each time) while they are rejected outright."""
        self._paid.record(drafted, accepted)
        if accepted == drafted:
            self.length = min(2 * self.length, self._max)
            self._misses = 0
        elif accepted == 0:
            self._misses += 1
            self._pause = min(2**self._misses, MAX_BACKOFF_STEPS)
            self.length = max(1, self.length // 2)
        else:
            self.length = accepted + 1
            self._misses = 0

    def _catch_up(self, context: list[int]) -> None:
        """Index the n-grams that end before the context's end (each has a token after it
        to predict from)."""
        for end in range(max(self._indexed, 1), len(context)):
            for n in NGRAM_SIZES:
                if end >= n:
                    self._index[tuple(context[end - n : end])] = end
        self._indexed = max(self._indexed, len(context))
