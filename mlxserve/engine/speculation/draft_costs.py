"""What a verify pass costs this device, and the draft length a row's acceptance pays for.

A pass over `w` tokens costs about one single-token step where decoding is bound by memory
bandwidth (Metal, CUDA) and up to `w` steps where it is bound by arithmetic (a CPU); a
drafter adds the time it takes to guess (a draft model or an MTP head a step of its own
per guess, a DFlash drafter one block pass). A row whose drafted tokens are each accepted
with probability `p` gains `1 + p + ... + p^n` tokens from a pass over its next token and
`n` drafted ones, so the length that gains most per step of cost is short where passes
are dear and acceptance is low, the longest allowed where passes are cheap, and none
where no length gains more than a plain step. `DraftCosts` holds the costs measured when
a model's batch is built (`measured`, by `verify_cost`), where the device decides
(`--speculation auto`, `--mtp auto`); unmeasured, every pass costs a step, so every row
drafts. Each row's `PaidLength` keeps its running estimate of `p` (`Acceptance`) and
gives the length its costs pay for; a row that stops drafting tries again now and then,
so a drafter whose guesses start to hit is taken up again.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.engine.speculation.recurrent_steps import keep, recorded

ACCEPTANCE_MEMORY = 0.8  # the weight of a row's earlier passes against its last one
LONGEST_REST = 32  # the most steps a row that drafts nothing waits before trying again

# The seconds a drafter takes to guess the drafted tokens of a pass over `width` tokens.
Drafting = Callable[[int], float]


@dataclass(frozen=True)
class DraftCosts:
    """The cost of a verify pass over `widths[i]` tokens, drafting included, in
    single-token steps (`steps[i]`); between and past the widths measured, linear."""

    widths: tuple[int, ...] = ()
    steps: tuple[float, ...] = ()

    @classmethod
    def measured(
        cls,
        model: Any,
        widest: int,
        drafting: Drafting | None = None,
        agreed: Callable[[float], float] = lambda cost: cost,
    ) -> DraftCosts:
        """Timed on `model` (with a drafter's guesses, if `drafting` times them) over 2
        and `widest` tokens; `agreed` makes every rank of a lockstep group take the same
        value (their worst)."""
        widths = tuple(sorted({2, max(2, widest)}))
        return cls(widths, tuple(agreed(verify_cost(model, w, drafting)) for w in widths))

    def of(self, width: int) -> float:
        """A pass over `width` tokens, in steps (a single token: one; unmeasured: one)."""
        if width <= 1 or not self.widths:
            return 1.0
        points = [(1, 1.0), *zip(self.widths, self.steps, strict=True)]
        segments = list(itertools.pairwise(points))
        (w0, c0), (w1, c1) = next((s for s in segments if width <= s[1][0]), segments[-1])
        return c0 + (c1 - c0) * (width - w0) / (w1 - w0)

    def best_length(self, acceptance: float, longest: int) -> int:
        """The draft length (0 to `longest`) that gains a row the most tokens per step of
        cost, its drafted tokens each accepted with probability `acceptance` (0: a plain
        step gains more than any draft; the shortest of equal gains). Unmeasured, every
        pass costs a step, so the longest gains most (asked each step for every row)."""
        if not self.widths:
            return max(0, longest)

        def gain(length: int) -> float:
            return sum(acceptance**k for k in range(length + 1)) / self.of(length + 1)

        return max(range(max(0, longest) + 1), key=gain)


class Acceptance:
    """A row's running estimate of the chance that a drafted token is accepted: each pass
    accepted some tokens, then (unless all) refused one; earlier passes weigh less
    (ACCEPTANCE_MEMORY). Before any pass, even odds; a token a pass, every one kept,
    `HIGHEST` at most."""

    HIGHEST = (1 / (1 - ACCEPTANCE_MEMORY) + 1) / (1 / (1 - ACCEPTANCE_MEMORY) + 2)

    def __init__(self) -> None:
        self._accepted = 0.0
        self._tried = 0.0

    def record(self, drafted: int, accepted: int) -> None:
        refused = 1 if accepted < drafted else 0
        self._accepted = ACCEPTANCE_MEMORY * self._accepted + accepted
        self._tried = ACCEPTANCE_MEMORY * self._tried + accepted + refused

    @property
    def rate(self) -> float:
        return (self._accepted + 1) / (self._tried + 2)


class PaidLength:
    """A row's acceptance (from a `prior`, if given: the rows' before it) and the draft
    length the device's `costs` pay for at it. Where none pays, the row tries one token
    after a rest that doubles each time none pays still (2 steps, then 4, to
    LONGEST_REST), and at once after a try that was kept where guesses kept every time
    would pay: a few tokens in a long reply where guesses miss, and a drafter whose
    guesses start to hit is taken up again within a few steps."""

    def __init__(self, costs: DraftCosts, prior: Acceptance | None = None):
        self.costs = costs
        self.acceptance = copy.copy(prior) if prior is not None else Acceptance()
        self._rest = 0  # the steps of the current rest (0: not resting)
        self._resting = 0  # steps of it left

    def length(self, longest: int) -> int:
        """This step's draft length, at most `longest` (asked once a step)."""
        paid = self.costs.best_length(self.acceptance.rate, longest)
        if paid or longest <= 0:
            self._rest = self._resting = 0
            return paid
        if self._resting:
            self._resting -= 1
            return 0
        self._rest = min(max(2, 2 * self._rest), LONGEST_REST)
        self._resting = self._rest
        return 1

    def record(self, drafted: int, accepted: int) -> None:
        """A try kept whole is tried again at the next step (no rest), where guesses kept
        every time would come to pay."""
        self.acceptance.record(drafted, accepted)
        if accepted == drafted and self.costs.best_length(Acceptance.HIGHEST, drafted):
            self._resting = 0


def chained(drafter: Any) -> Drafting:
    """The time a drafter that guesses a token at a time (a model of tokens: a draft model,
    an MTP head's `as_model`) takes for a pass over `width` tokens: `width - 1` steps."""

    def seconds(width: int) -> float:
        cache = make_prompt_cache(drafter)
        mx.eval(drafter(mx.zeros((1, 1), dtype=mx.int32), cache))
        start = time.perf_counter()
        for _ in range(width - 1):
            mx.eval(drafter(mx.zeros((1, 1), dtype=mx.int32), cache))
        return time.perf_counter() - start

    return seconds


def verify_cost(
    model: Any, width: int, drafting: Drafting | None = None, repeats: int = 2
) -> float:
    """How many single-token steps one forward pass over `width` tokens costs on this
    device (1: free where memory bandwidth bounds decoding; `width`: no gain possible),
    with a drafter's guesses for it (`drafting`), if given; each timing the best of
    `repeats` (a busy machine only ever slows one down). A pass over several tokens is
    timed as a verify pass runs: a hybrid model's recurrent layers keeping their state at
    each position (`recurrent_steps`), which costs more than the plain pass."""

    def timed(tokens: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            cache = make_prompt_cache(model)
            mx.eval(model(mx.zeros((1, 1), dtype=mx.int32), cache=cache))
            start = time.perf_counter()
            as_verified = recorded(cache, tokens) if tokens > 1 else nullcontext()
            with as_verified as steps:
                logits = model(mx.zeros((1, tokens), dtype=mx.int32), cache=cache)
            if steps is not None:
                keep(cache, steps, [tokens])
            mx.eval(logits, [c.state for c in cache])
            best = min(best, time.perf_counter() - start)
        return best

    timed(1)  # warm up
    guessing = min(drafting(width) for _ in range(repeats)) if drafting is not None else 0.0
    return (timed(width) + guessing) / timed(1)
