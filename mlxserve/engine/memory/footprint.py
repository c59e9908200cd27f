"""How much memory the KV caches of the running batch take, and whether one more request
fits the server's memory budget.

A model's KV footprint is measured once (one token through a fresh cache): each layer's
bytes per token, and the fixed bytes of layers that do not grow (state-space layers,
sliding windows). mlx-lm's batch caches are rectangular: every sequence of a batch is
padded to the longest, so a batch of n sequences takes n times the longest one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

# MLX's buffer cache (freed buffers kept for reuse) is bounded by default to this share of
# the memory budget: enough for a decode step's buffers, not a second copy of the batch.
CACHE_LIMIT_SHARE = 0.1


@dataclass(frozen=True)
class KVFootprint:
    """KV bytes of one sequence: `fixed + per_token * tokens`."""

    per_token: int
    fixed: int

    def sequence(self, tokens: int) -> int:
        return self.fixed + self.per_token * tokens

    def __add__(self, other: KVFootprint) -> KVFootprint:
        """Two models' caches held together (a model and its draft model)."""
        return KVFootprint(self.per_token + other.per_token, self.fixed + other.fixed)

    def batch(self, lengths: Iterable[int]) -> int:
        """A batch's bytes: each sequence padded to the longest."""
        lengths = list(lengths)
        return len(lengths) * self.sequence(max(lengths)) if lengths else 0


def measure_footprint(model: Any, cache: list[Any] | None = None) -> KVFootprint:
    """Run one token through a fresh cache (generation thread only) and read its layers."""
    cache = cache if cache is not None else make_prompt_cache(model)
    # The output too: a pipeline rank's send to the next rank hangs on it when its last
    # cache is not one it fills (mlx-lm ties the send to `cache[-1]`), and the other
    # ranks would wait for it.
    mx.eval(model(mx.array([[0]]), cache=cache), [c.state for c in cache])
    per_token = fixed = 0
    for layer in _layers(cache):
        allocated = _allocated_tokens(layer)
        if allocated is None:  # a state that does not grow with the sequence
            fixed += layer.nbytes
            continue
        bytes_per_token = layer.nbytes // allocated
        window = getattr(layer, "max_size", None)
        if window is not None:  # a sliding window: full after `window` tokens
            fixed += bytes_per_token * window
        else:
            per_token += bytes_per_token
    return KVFootprint(per_token, fixed)


def _layers(cache: list[Any]) -> Iterable[Any]:
    for layer in cache:
        inner = getattr(layer, "caches", None)
        if inner is not None:
            yield from _layers(list(inner))
        else:
            yield layer


def _allocated_tokens(layer: Any) -> int | None:
    """How many token positions the layer's buffers hold (mlx-lm allocates in steps)."""
    keys = getattr(layer, "keys", None)
    if keys is None:
        return None
    if isinstance(keys, (tuple, list)):  # a quantized cache: (data, scales, biases)
        keys = keys[0]
    return keys.shape[2]


def device_memory() -> int:
    """The memory a model server may use on this device: Metal's recommended working set,
    else MLX's memory limit (a share of RAM on the CPU backend)."""
    info = mx.device_info()
    return int(info.get("max_recommended_working_set_size") or mx.get_memory_limit())
