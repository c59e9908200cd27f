"""What one generation needs to know, and the mlx-lm sampler and logits processors for it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors, make_sampler


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.0
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # None: no logprobs; 0: the chosen token's only; k: also the k most likely.
    logprobs: int | None = None


def build_sampler(params: GenerationParams, special_tokens: list[int], vocab_size: int) -> Callable:
    # A top_k that keeps the whole vocabulary is no top_k (mlx-lm refuses it).
    top_k = params.top_k if 0 < params.top_k < vocab_size else 0
    return make_sampler(
        temp=params.temperature,
        top_p=params.top_p,
        min_p=params.min_p,
        top_k=top_k,
        xtc_probability=params.xtc_probability,
        xtc_threshold=params.xtc_threshold,
        xtc_special_tokens=special_tokens,
    )


def build_logits_processors(params: GenerationParams) -> list[Callable]:
    return make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=params.repetition_penalty,
        repetition_context_size=params.repetition_context_size,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
    )


def seed_random(seed: int) -> None:
    """Seed MLX's generator with any integer a client sends (MLX takes 64-bit unsigned)."""
    mx.random.seed(seed % 2**64)


def reseed_random() -> None:
    """A sampler that raised inside mx.compile leaves the random state unusable for every
    later request; a fresh seed restores it."""
    seed_random(int.from_bytes(os.urandom(8), "little"))
