"""KV caches quantized to 4 or 8 bits that can join mlx-lm's continuous batch.

mlx-lm has a quantized cache for one sequence (`QuantizedKVCache`) but no batched form, so
mlx_lm.server serves one request at a time when asked to quantize. `BatchQuantizedKVCache`
is that batched form, laid out as mlx-lm's `BatchKVCache` (left-padded rows, one write
index) with each of keys and values stored as mlx's (packed data, scales, biases) triple;
mlx-lm's attention sees the `bits` attribute and runs quantized attention. Layers whose
cache cannot be quantized (sliding windows, state-space layers) stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import KVCache, QuantizedKVCache, dynamic_roll

from mlxserve.values import ints

Triple = tuple[mx.array, mx.array, mx.array]  # packed data, scales, biases


class QuantizedCache(QuantizedKVCache):
    """mlx-lm's one-sequence quantized cache, able to merge into a batch."""

    keys: Any  # a Triple once written (mlx-lm starts them as None)
    values: Any

    @classmethod
    def merge(cls, caches: Sequence[QuantizedKVCache]) -> BatchQuantizedKVCache:
        return BatchQuantizedKVCache.merge(caches)

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else super().nbytes  # mlx-lm's fails while empty


@dataclass(frozen=True)
class KVQuantization:
    """--kv-bits and --kv-group-size. A prompt is processed at full precision (quantized
    attention over a long prompt is several times slower), on a cache taken back to full
    precision if it came quantized from the prompt cache, and quantized as it joins the
    batch, where decoding attends to the quantized keys and values."""

    bits: int
    group_size: int

    def quantized(self, cache: list[Any]) -> list[Any]:
        """The cache with every plain KV layer quantized (others as they are)."""
        return [self._layer(c) if type(c) is KVCache else c for c in cache]

    def plain(self, cache: list[Any]) -> list[Any]:
        """The cache with every quantized layer back at full precision, to process more
        prompt on it (quantizing again moves a value by at most one step of its group's
        grid: the grid is recomputed from the group's range)."""
        return [self._dequantized(c) if isinstance(c, QuantizedKVCache) else c for c in cache]

    def _dequantized(self, layer: QuantizedKVCache) -> KVCache:
        plain = KVCache()
        if layer.keys is not None:
            plain.keys, plain.values = (
                mx.dequantize(*triple, group_size=layer.group_size, bits=layer.bits)[
                    ..., : layer.offset, :
                ]
                for triple in (layer.keys, layer.values)
            )
            plain.offset = layer.offset
        return plain

    def _layer(self, plain: KVCache) -> QuantizedCache:
        layer = QuantizedCache(self.group_size, self.bits)
        if plain.keys is not None and plain.values is not None:
            keys, values = (x[..., : plain.offset, :] for x in (plain.keys, plain.values))
            layer.keys = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
            layer.values = mx.quantize(values, group_size=self.group_size, bits=self.bits)
            layer.offset = plain.offset
        return layer


def portable(cache: list[Any]) -> list[Any]:
    """The cache with mlx-lm's own classes, as its files name them (the disk tier)."""
    return [QuantizedKVCache.from_state(c.state) if type(c) is QuantizedCache else c for c in cache]


def batchable(cache: list[Any]) -> list[Any]:
    """A cache read from a file, its quantized layers able to join a batch again."""
    return [QuantizedCache.from_state(c.state) if type(c) is QuantizedKVCache else c for c in cache]


class BatchQuantizedKVCache:
    step = 256

    def __init__(self, left_padding: list[int], group_size: int, bits: int):
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self.group_size = group_size
        self.bits = bits
        self._idx = 0
        self._right_padding: mx.array | None = None

    # Writing ------------------------------------------------------------------------------

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        prev, steps = self._idx, keys.shape[2]
        if self.keys is None or prev + steps > self.keys[0].shape[2]:
            self._grow(keys, values, steps)
        self.offset = self.offset + steps
        self._idx += steps
        written = cast(tuple[Triple, Triple], (self.keys, self.values))  # grown above
        for stored, new in zip(written, (keys, values), strict=True):
            quantized = mx.quantize(new, group_size=self.group_size, bits=self.bits)
            for part, data in zip(stored, quantized, strict=True):
                part[..., prev : self._idx, :] = data
        return self.keys_and_values()

    def _grow(self, keys: mx.array, values: mx.array, steps: int) -> None:
        batch, heads = keys.shape[:2]
        length = (self.step + steps - 1) // self.step * self.step
        per_word = 32 // self.bits

        def empty(dim: int) -> Triple:
            shape = (batch, heads, length)
            groups = dim // self.group_size
            return (
                mx.zeros((*shape, dim // per_word), dtype=mx.uint32),
                mx.zeros((*shape, groups), dtype=keys.dtype),
                mx.zeros((*shape, groups), dtype=keys.dtype),
            )

        new_keys, new_values = empty(keys.shape[3]), empty(values.shape[3])
        if self.keys is None:
            self.keys, self.values = new_keys, new_values
            return
        kept = tree_map(lambda x: x[..., : self._idx, :], (self.keys, self.values))
        self.keys, self.values = tree_map(
            lambda old, new: mx.concatenate([old, new], axis=2), kept, (new_keys, new_values)
        )

    def keys_and_values(self) -> tuple[Triple, Triple]:
        return tree_map(lambda x: x[..., : self._idx, :], (self.keys, self.values))

    # What BatchGenerator asks of a batch cache (as mlx-lm's BatchKVCache answers it) -------

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("Left padding can only be added to an empty cache")
            self.left_padding += mx.array(left_padding)
            self.offset = self.offset - mx.array(left_padding)
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        if self._right_padding is None:
            return
        padding = self._right_padding
        self.keys, self.values = tree_map(
            lambda x: dynamic_roll(x, padding[:, None], axis=2), (self.keys, self.values)
        )
        self.offset = self.offset - padding
        self.left_padding += padding
        self._right_padding = None

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    def filter(self, batch_indices) -> None:
        """Keep the given rows, then drop the padding every row has."""
        if self.keys is not None:
            self.keys, self.values = tree_map(lambda x: x[batch_indices], (self.keys, self.values))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shared = min(ints(self.left_padding))
        if shared > 0:
            if self.keys is not None:
                self.keys, self.values = tree_map(
                    lambda x: x[..., shared:, :], (self.keys, self.values)
                )
            self._idx -= shared
            self.left_padding -= shared

    def extend(self, other: BatchQuantizedKVCache) -> None:
        """Append `other`'s rows, both right-aligned at the longer write index."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        template = self if self.keys is not None else other
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        mine, theirs = (_aligned(c, idx, size, template) for c in (self, other))
        self.keys, self.values = tree_map(lambda a, b: mx.concatenate([a, b]), mine[:2], theirs[:2])
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([mine[2], theirs[2]])
        self._idx = idx

    def extract(self, idx: int) -> QuantizedCache:
        padding = ints(self.left_padding)[idx]
        cache = QuantizedCache(self.group_size, self.bits)
        cache.keys, cache.values = tree_map(
            lambda x: mx.contiguous(x[idx : idx + 1, :, padding : self._idx]),
            (self.keys, self.values),
        )
        cache.offset = self._idx - padding
        return cache

    @classmethod
    def merge(cls, caches: Sequence[QuantizedKVCache]) -> BatchQuantizedKVCache:
        """One batch of single-sequence caches, each right-aligned (left-padded)."""
        first = caches[0]
        lengths = [c.offset for c in caches]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        batch = cls(padding, first.group_size, first.bits)
        if longest == 0:
            return batch
        filled = next(c for c in caches if c.keys is not None)

        def stacked(pick: Callable[[Any], Triple]) -> Triple:
            parts = []
            for template in pick(filled):
                shape = (len(caches), template.shape[1], longest, template.shape[3])
                parts.append(mx.zeros(shape, dtype=template.dtype))
            for row, (pad, cache) in enumerate(zip(padding, caches, strict=True)):
                if cache.keys is None:
                    continue
                for part, data in zip(parts, pick(cache), strict=True):
                    part[row : row + 1, :, pad:] = data[..., : cache.offset, :]
            return cast(Triple, tuple(parts))

        batch.keys = stacked(lambda c: c.keys)
        batch.values = stacked(lambda c: c.values)
        batch.offset += longest
        batch._idx = longest
        return batch

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))


def _aligned(cache: BatchQuantizedKVCache, idx: int, size: int, template: BatchQuantizedKVCache):
    """`cache`'s keys, values and left padding, padded to write index `idx` and length
    `size` (`template` gives the shapes of a cache that holds nothing yet)."""
    if cache.keys is None:
        rows = cache.offset.shape[0]

        def empty(x: mx.array) -> mx.array:
            return mx.zeros((rows, x.shape[1], size, x.shape[3]), dtype=x.dtype)

        keys, values = tree_map(empty, (template.keys, template.values))
        return keys, values, cache.left_padding + idx
    left = idx - cache._idx
    right = size - cache.keys[0].shape[2] - left

    def pad(x: mx.array) -> mx.array:
        if right < 0:
            x = x[..., :right, :]
        widths = [(0, 0), (0, 0), (left, max(right, 0)), (0, 0)]
        return mx.pad(x, widths) if left or right > 0 else x

    keys, values = tree_map(pad, (cache.keys, cache.values))
    return keys, values, cache.left_padding + left
