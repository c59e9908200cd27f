"""What a verify pass costs this device, and the draft length a row's acceptance pays for.

A pass over `w` tokens costs about one single-token step where decoding is bound by memory
bandwidth (Metal, CUDA) and up to `w` steps where it is bound by arithmetic (a CPU); a
drafter that guesses a token at a time (a draft model, an MTP head) adds a step of its
own per guess. A row whose drafted tokens are each accepted with probability `p` gains
`1 + p + ... + p^n` tokens from a pass over its next token and `n` drafted ones, so the
length that gains most per step of cost is short where passes are dear and acceptance is
low, and the longest allowed where passes are cheap. Whether to draft at all is decided
once, when the model loads (`--speculation auto`, `--mtp auto`: where a pass of the widest
draft costs at most half the steps it can save); a row that drafts drafts at least one
token. `DraftCosts` holds the costs measured
when a model's batch is built (`measured`, by `verify_cost`); each row's `Acceptance` is
its running estimate of `p`; the draft lengths of speculative.py take the shorter of what
their acceptance rule gives and `DraftCosts.best_length`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

ACCEPTANCE_MEMORY = 0.8  # the weight of a row's earlier passes against its last one


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
        drafter: Any = None,
        agreed: Callable[[float], float] = lambda cost: cost,
    ) -> DraftCosts:
        """Timed on `model` (with `drafter`'s guesses, a model of tokens, if given) over 2
        and `widest` tokens; `agreed` makes every rank of a lockstep group take the same
        value (their worst)."""
        widths = tuple(sorted({2, max(2, widest)}))
        return cls(widths, tuple(agreed(verify_cost(model, w, drafter)) for w in widths))

    def of(self, width: int) -> float:
        """A pass over `width` tokens, in steps (a single token: one; unmeasured: one)."""
        if width <= 1 or not self.widths:
            return 1.0
        points = [(1, 1.0), *zip(self.widths, self.steps, strict=True)]
        segments = list(itertools.pairwise(points))
        (w0, c0), (w1, c1) = next((s for s in segments if width <= s[1][0]), segments[-1])
        return c0 + (c1 - c0) * (width - w0) / (w1 - w0)

    def best_length(self, acceptance: float, longest: int) -> int:
        """The draft length (1 to `longest`) that gains a row the most tokens per step of
        cost, its drafted tokens each accepted with probability `acceptance`."""

        def gain(length: int) -> float:
            return sum(acceptance**k for k in range(length + 1)) / self.of(length + 1)

        return max(range(1, max(1, longest) + 1), key=gain)


class Acceptance:
    """A row's running estimate of the chance that a drafted token is accepted: each pass
    accepted some tokens, then (unless all) refused one; earlier passes weigh less
    (ACCEPTANCE_MEMORY). Before any pass, even odds."""

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


def verify_cost(model: Any, width: int, drafter: Any = None, repeats: int = 2) -> float:
    """How many single-token steps one forward pass over `width` tokens costs on this
    device (1: free where memory bandwidth bounds decoding; `width`: no gain possible),
    with the `width - 1` steps of a `drafter` that guesses them one at a time (a model of
    tokens: a draft model, an MTP head's `as_model`), if given."""

    def timed(tokens: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            cache = make_prompt_cache(model)
            mx.eval(model(mx.zeros((1, 1), dtype=mx.int32), cache=cache))
            start = time.perf_counter()
            mx.eval(model(mx.zeros((1, tokens), dtype=mx.int32), cache=cache))
            best = min(best, time.perf_counter() - start)
        return best

    def drafting() -> float:
        if drafter is None:
            return 0.0
        cache = make_prompt_cache(drafter)
        mx.eval(drafter(mx.zeros((1, 1), dtype=mx.int32), cache))
        start = time.perf_counter()
        for _ in range(width - 1):
            mx.eval(drafter(mx.zeros((1, 1), dtype=mx.int32), cache))
        return time.perf_counter() - start

    timed(1)  # warm up
    return (timed(width) + drafting()) / timed(1)
