"""Prompt-prefix KV cache: reuse the longest cached token prefix of a new prompt.

mlx-lm's LRUPromptCache keeps a trie of token sequences and trims a longer cached
sequence back to the shared prefix where the model's cache allows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_lm.models.cache import (
    LRUPromptCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)


@dataclass
class CacheHit:
    cache: list[Any]
    rest: list[int]  # prompt tokens the model still has to process
    cached_tokens: int


class PromptCache:
    def __init__(self, max_entries: int, max_bytes: int | None = None):
        self._max_entries = max_entries
        self._max_bytes = max_bytes if max_bytes is not None else 1 << 63
        self._lru = self._new_lru()

    def _new_lru(self) -> LRUPromptCache:
        return LRUPromptCache(max_size=self._max_entries, max_bytes=self._max_bytes)

    def fetch(self, key: str, models: list[Any], prompt: list[int]) -> CacheHit:
        """The cache to continue from; `models` are the model (and draft) it must fit."""
        cache, rest = self._lru.fetch_nearest_cache(key, prompt)
        if cache is not None and not rest:
            # A full hit still needs the last prompt token run again for its logits.
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
                rest = prompt[-1:]
            else:
                cache = None
        if cache is None:
            cache = [c for model in models for c in make_prompt_cache(model)]
            rest = prompt
        return CacheHit(cache, rest, len(prompt) - len(rest))

    def store(self, key: str, tokens: list[int], cache: list[Any]) -> None:
        """Keep `cache`, which holds exactly `tokens`, for later prompts to extend."""
        self._lru.insert_cache(key, tokens, cache)

    def clear(self) -> None:
        self._lru = self._new_lru()
