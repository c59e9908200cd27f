"""Generation for vision models whose caches do not batch (the rest are rows of the
continuous batch: `continuous/vision_rows.py`), with mlx-vlm's generate_step, one request
at a time (a token at a time, see `text_run.SingleRun`).

The prompt cache is shared with the text path; a vision prompt is looked up by its
`cache_tokens` (image placeholders keyed by the images' bytes), and a cached prefix is
reused only when it holds every image of the prompt or none. Qwen-style models place
tokens with multimodal RoPE positions computed from the whole prompt: they are computed
here, so that a prompt continuing from the cache gets the positions a cold one would.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
from mlx_vlm.generate import generate_step
from mlx_vlm.models.cache import make_prompt_cache

from mlxserve.compat import forget_vision_positions
from mlxserve.engine.caches.prompt_cache import CacheHit, PromptCache
from mlxserve.engine.generation.jobs import GenerationJob, PromptImages
from mlxserve.engine.generation.sampling import build_logits_processors, build_sampler
from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.engine.single.text_run import SingleRun, Step

log = logging.getLogger(__name__)


def generate_vision(
    loaded: LoadedModel, cache: PromptCache, job: GenerationJob, prefill_chunk: int
) -> SingleRun:
    images = job.images or _text_only(job.prompt)
    language_model = loaded.model.language_model
    prompt = mx.array(job.prompt)[None]
    forget_vision_positions(language_model)

    def new_cache() -> list[Any]:
        return make_prompt_cache(language_model)

    hit = cache.fetch(job.spec.key, new_cache, images.cache_tokens, images.reusable)
    positions = _positions(language_model, prompt, images) if hit.cached_tokens else {}
    if positions is None:
        hit = CacheHit(new_cache(), list(job.prompt), 0)
    cached = hit.cached_tokens
    kwargs = {key: _suffix(value, cached, prompt.shape[1]) for key, value in images.extra.items()}
    kwargs.update(positions or {})
    tokenizer = loaded.tokenizer
    params = job.params
    generation = generate_step(
        prompt[:, cached:],
        loaded.model,
        images.pixel_values if images.images_after(cached) else None,
        _suffix(images.attention_mask, cached, prompt.shape[1]),
        max_tokens=params.max_tokens,
        sampler=build_sampler(params, tokenizer.all_special_ids, len(tokenizer)),
        logits_processors=build_logits_processors(params),
        prompt_cache=hit.cache,
        prefill_step_size=prefill_chunk,
        **kwargs,
    )
    steps = _steps(generation, set(tokenizer.eos_token_ids), params.max_tokens)
    return SingleRun(loaded, cache, job, hit, images.cache_tokens, steps)


def _text_only(prompt: list[int]) -> PromptImages:
    return PromptImages(None, {}, None, list(prompt), ())


def _positions(language_model: Any, prompt: mx.array, images: PromptImages) -> dict | None:
    """For a prompt continuing from the cache: the whole prompt's position ids and RoPE
    delta where the model computes them from the prompt (Qwen-VL), {} for other models,
    None if they cannot be computed (then the prompt is processed without the cache)."""
    get_rope_index = getattr(language_model, "get_rope_index", None)
    if not callable(get_rope_index):
        return {}
    try:
        position_ids, rope_deltas = get_rope_index(
            prompt,
            images.extra.get("image_grid_thw"),
            images.extra.get("video_grid_thw"),
            images.attention_mask,
        )
    except Exception as e:
        log.warning("Cannot compute RoPE positions; processing the whole prompt: %s", e)
        return None
    return {"position_ids": position_ids, "rope_deltas": rope_deltas}


def _suffix(value: Any, cached: int, length: int) -> Any:
    """A per-token processor output (shape [1, prompt length]) cut to the uncached part."""
    if cached and isinstance(value, mx.array) and value.shape[-1:] == (length,) and value.ndim == 2:
        return value[:, cached:]
    return value


def _steps(generation: Iterator, eos_tokens: set[int], max_tokens: int) -> Iterator[Step]:
    for n, (token, logprobs) in enumerate(generation):
        if token in eos_tokens:
            yield token, logprobs, "stop"
        else:
            yield token, logprobs, "length" if n + 1 >= max_tokens else None
