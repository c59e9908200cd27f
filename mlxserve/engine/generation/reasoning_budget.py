"""A cap on reasoning: once a reply has reasoned for `budget` tokens, the tokens that
close its reasoning are forced, and the model goes on to the answer."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlxserve.values import as_int


@dataclass(frozen=True)
class ReasoningBudget:
    """`opening` and `closing`: the token ids that open and close reasoning in this
    model's markup; `opened`: the prompt already opened it."""

    budget: int
    opening: tuple[int, ...]
    closing: tuple[int, ...]
    opened: bool

    def processor(self) -> ReasoningBudgetProcessor:
        return ReasoningBudgetProcessor(self)


class ReasoningBudgetProcessor:
    """An mlx-lm logits processor (one per sequence) that follows the generated tokens:
    inside reasoning it counts them, and at the budget it allows only the next closing
    token until reasoning is closed. Reasoning opened a second time is not capped again.
    A speculative pass shows it drafted tokens one position at a time; `rollback` takes
    back those the pass did not keep."""

    def __init__(self, budget: ReasoningBudget):
        self._budget = budget
        self._generated: list[int] = []
        self._inside = budget.opened
        self._spent = 0
        self._done = False
        self._calls = 0
        self._before: list[tuple[bool, int, bool]] = []  # the state before each token

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` followed (drafted tokens a pass did not keep)."""
        if tokens:
            self._inside, self._spent, self._done = self._before[-tokens]
            del self._before[-tokens:]
            del self._generated[-tokens:]

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._calls:  # the first call sees the prompt's last token, not a generated one
            self._follow(as_int(tokens[-1]))
        self._calls += 1
        if not self._inside or self._spent < self._budget.budget:
            return logits
        closing = self._budget.closing
        written = self._closing_written()
        allowed = mx.arange(logits.shape[-1]) == closing[written]
        return mx.where(allowed, logits, -mx.inf)

    def _follow(self, token: int) -> None:
        self._before.append((self._inside, self._spent, self._done))
        self._generated.append(token)
        budget = self._budget
        if self._inside:
            self._spent += 1
            if self._ends_with(budget.closing):
                self._inside, self._done = False, True
        elif not self._done and self._ends_with(budget.opening):
            self._inside = True

    def _closing_written(self) -> int:
        """How many closing tokens the reply already ends with (forced ones included)."""
        closing = self._budget.closing
        for size in range(min(len(closing) - 1, len(self._generated)), 0, -1):
            if tuple(self._generated[-size:]) == closing[:size]:
                return size
        return 0

    def _ends_with(self, ids: tuple[int, ...]) -> bool:
        return len(self._generated) >= len(ids) and tuple(self._generated[-len(ids) :]) == ids
