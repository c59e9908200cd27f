"""What one generation needs to know, and the mlx-lm sampler and logits processors for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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


def build_sampler(params: GenerationParams, special_tokens: list[int]) -> Callable:
    return make_sampler(
        temp=params.temperature,
        top_p=params.top_p,
        min_p=params.min_p,
        top_k=max(params.top_k, 0),
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
