"""What one generation needs to know, and the mlx-lm sampler and logits processors for it."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    apply_xtc,
    make_logits_processors,
    make_sampler,
)

from mlxserve.config import SamplingDefaults
from mlxserve.engine.generation.reasoning_budget import ReasoningBudget
from mlxserve.protocol.request import Sampling
from mlxserve.structured.matcher import Grammar


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int
    # every gap filled (`Sampling.over`)
    sampling: Sampling = field(default_factory=lambda: Sampling().over(SamplingDefaults()))
    stop: tuple[str, ...] = ()
    stop_tokens: frozenset[int] = frozenset()  # tokens that end it besides EOS (FIM's ends)
    # the text continues the prompt (an unconstrained completion): its leading space is text
    continuation: bool = False
    # None: no logprobs; 0: the chosen token's only; k: also the k most likely.
    logprobs: int | None = None
    grammar: Grammar | None = None  # constrained decoding: what the reply must match
    reasoning_budget: ReasoningBudget | None = None


def build_sampler(params: GenerationParams, special_tokens: list[int], vocab_size: int) -> Callable:
    """The request's sampler. Unseeded requests with equal settings share one of mlx-lm's
    samplers, so a batch of them samples in one call; a seeded request draws from its own
    random key, so its output does not depend on what else is in the batch."""
    s = params.sampling
    # A top_k that keeps the whole vocabulary is no top_k (mlx-lm refuses it).
    top_k = int(_filled(s.top_k))
    settings = SamplerSettings(
        _filled(s.temperature),
        _filled(s.top_p),
        _filled(s.min_p),
        top_k if 0 < top_k < vocab_size else 0,
        _filled(s.xtc_probability),
        _filled(s.xtc_threshold),
        tuple(special_tokens),
    )
    if s.seed is None or settings.temperature == 0:
        return _shared_sampler(settings)
    return _keyed_sampler(settings, s.seed)


def _filled(value: float | None) -> float:
    """A setting `Sampling.over` has filled in."""
    assert value is not None, "GenerationParams.sampling has gaps: fill them with over()"
    return value


@dataclass(frozen=True)
class SamplerSettings:
    temperature: float
    top_p: float
    min_p: float
    top_k: int
    xtc_probability: float
    xtc_threshold: float
    special_tokens: tuple[int, ...]


@functools.lru_cache(maxsize=64)
def _shared_sampler(s: SamplerSettings) -> Callable:
    return make_sampler(
        temp=s.temperature,
        top_p=s.top_p,
        min_p=s.min_p,
        top_k=s.top_k,
        xtc_probability=s.xtc_probability,
        xtc_threshold=s.xtc_threshold,
        xtc_special_tokens=list(s.special_tokens),
    )


def _keyed_sampler(s: SamplerSettings, seed: int) -> Callable:
    """mlx-lm's filters in mlx-lm's order, with every random draw taken from this
    request's own key (any integer seed; MLX keys are 64-bit)."""
    key = [mx.random.key(seed % 2**64)]

    def sample(logprobs: mx.array) -> mx.array:
        keys = mx.random.split(key[0], 3)
        key[0] = keys[0]
        if 0 < s.top_p < 1.0:
            logprobs = apply_top_p(logprobs, s.top_p)
        if s.min_p != 0.0:
            logprobs = apply_min_p(logprobs, s.min_p)
        if s.xtc_probability > 0.0:
            # XTC applies with probability xtc_probability: draw that coin from our key.
            cut = apply_xtc(logprobs, 1.0, s.xtc_threshold, list(s.special_tokens))
            coin = mx.random.uniform(key=keys[2])
            logprobs = mx.where(coin > s.xtc_probability, logprobs, cut)
        if s.top_k > 0:
            logprobs = apply_top_k(logprobs, s.top_k)
        return mx.random.categorical(logprobs * (1.0 / s.temperature), key=keys[1])

    return sample


class LogitsProcessor(Protocol):
    """What a sequence's logits processors are: mlx-lm's call, and `rollback`, which takes
    back the last drafted tokens they were shown and a verify pass did not keep (see
    `speculation.verify`)."""

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array: ...

    def rollback(self, tokens: int) -> None: ...


def per_position(processors: list[Callable]) -> bool:
    """Whether a row's processors (if any) apply to each position alike (they do not read
    the tokens before it)."""
    return all(getattr(p, "per_position", False) for p in processors)


class LogitBias:
    """`logit_bias` as a logits processor (mlx-lm's operation). It keeps no state, so it
    applies to every position of a pass at once: sequences with only such processors can
    still speculate (see `speculation.verify`)."""

    per_position = True

    def __init__(self, bias: dict[int, float]):
        self._indices = mx.array(list(bias.keys()))
        self._values = mx.array(list(bias.values()))

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        return logits.at[:, self._indices].add(self._values)

    def rollback(self, tokens: int) -> None:
        """Nothing to take back: no state."""


class Penalty:
    """One of mlx-lm's penalties (repetition, presence, frequency). It reads only the tokens
    it is shown, so a speculative pass shows it each drafted position's own context and
    it has nothing to take back (see `speculation.verify`)."""

    def __init__(self, apply: Callable):
        self._apply = apply

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        return self._apply(tokens, logits)

    def rollback(self, tokens: int) -> None:
        """Nothing to take back: no state."""


def build_logits_processors(params: GenerationParams) -> list[Callable]:
    """One sequence's processors (each a `LogitsProcessor`, in the list type mlx-lm takes);
    the reasoning budget and the grammar mask come last, so that no bias or penalty can
    bring back a token they forbid."""
    s = params.sampling
    processors: list[Callable] = [LogitBias(s.logit_bias)] if s.logit_bias else []
    processors += map(
        Penalty,
        make_logits_processors(
            repetition_penalty=s.repetition_penalty,
            repetition_context_size=s.repetition_context_size,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
        ),
    )
    if params.reasoning_budget is not None:
        processors.append(params.reasoning_budget.processor())
    if params.grammar is not None:
        processors.append(params.grammar.processor())
    return processors


def reseed_random() -> None:
    """A sampler that raised inside mx.compile leaves the random state unusable for every
    later request; a fresh seed restores it."""
    mx.random.seed(int.from_bytes(os.urandom(8), "little"))
