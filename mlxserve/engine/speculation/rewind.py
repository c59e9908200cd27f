"""Batch caches taken back after a speculative step: each row drops the positions it did
not keep.

Two ways, by what the caches can do:
- `roll_back`: full attention is trimmed, and a sliding window written by one pass over
  several tokens too (`compat.roll_back_window`); a row's extra positions become its left
  padding.
- `snapshot` before, then `rewind`: caches that cannot drop positions (a recurrent
  layer's state, a window written a token at a time, as a draft model's chain writes it)
  go back to where the step began, and each row takes its kept tokens again in one pass
  (`take_again`); the full-attention caches beside them are trimmed to the same point.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchRotatingKVCache

from mlxserve.compat import copied, loaded_classes, roll_back_window, window_state

# What `snapshot` keeps of a cache: see there.
Snapshot = tuple | None


def vision_arrays() -> tuple[Any, ...]:
    """mlx-vlm's recurrent-state cache class, once a vision model has brought mlx-vlm in."""
    return loaded_classes("mlx_vlm.models.cache", "ArraysCache")


def is_recurrent(cache: Any) -> bool:
    """Whether a batch cache is a recurrent layer's state (mlx-lm's or mlx-vlm's), which
    cannot be trimmed: a pass's records or a replay take it back."""
    return isinstance(cache, (ArraysCache, *vision_arrays()))


def roll_back(caches: list[Any], unkept: list[int]) -> None:
    """Take the positions a row did not keep out of batch caches: the positions every row
    dropped are trimmed, the rest become the rows' left padding."""
    if not caches:
        return
    shared = min(unkept)
    rest = [n - shared for n in unkept]
    for cache in caches:
        if isinstance(cache, BatchRotatingKVCache):
            roll_back_window(cache, shared, rest)
            continue
        if shared:
            cache.trim(shared)
        if any(rest):
            cache.prepare(right_padding=rest)
            cache.finalize()


def snapshot(cache: Any) -> Snapshot:
    """What a batch cache needs to go back to this point: a sliding window's state (its
    arrays copied: single-token steps write them in place) or a recurrent layer's (its
    states are replaced, not written: references keep them; mlx-lm's padding counts are
    written in place; mlx-vlm's have none between steps: batches merge and finalize to
    none); None for a full-attention cache, which is trimmed instead."""
    if isinstance(cache, BatchRotatingKVCache):
        return window_state(cache)
    if isinstance(cache, ArraysCache):
        return (list(cache.cache), *copied((cache.left_padding, cache.lengths)))
    if isinstance(cache, vision_arrays()):
        return tuple(cache.cache)
    return None


def _restore(cache: Any, state: tuple) -> None:
    if isinstance(cache, vision_arrays()):
        cache.cache = list(state)
    else:
        cache.state = state


def rewind(
    model: Any, caches: list[Any], snapshots: list[Snapshot], width: int, rows: list[list[int]]
) -> None:
    """Take `caches` back to their `snapshots` (a full-attention cache, whose snapshot is
    None, loses the `width` positions written since) and feed row i `rows[i]`."""
    for cache, state in zip(caches, snapshots, strict=True):
        if state is None:
            cache.trim(width)
        else:
            _restore(cache, state)
    take_again(model, caches, rows)


def take_again(model: Any, caches: list[Any], rows: list[list[int]]) -> None:
    """Feed row i the tokens `rows[i]` in one pass, right-padded as mlx-lm pads a batch of
    prompts (the padding then becomes left padding; recurrent layers skip it)."""
    lengths = [len(row) for row in rows]
    longest = max(lengths)
    inputs = mx.array([row + [0] * (longest - len(row)) for row in rows], dtype=mx.int32)
    for cache in caches:
        cache.prepare(lengths=lengths, right_padding=[longest - n for n in lengths])
    model(inputs, cache=caches)
    for cache in caches:
        cache.finalize()
    mx.eval([c.state for c in caches])
