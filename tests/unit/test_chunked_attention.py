"""Llama 4's chunk mask over a batch (`models/chunked_attention`): each row's part of the
mask is the one its own positions give alone, whatever its left padding, as the
libraries' one-row mask has it (a key is seen where it is in its query's chunk and not
after it)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from mlxserve.models.chunked_attention import chunk_attention_mask

CHUNK = 4


def alone(done: int, length: int) -> list[list[bool]]:
    """A row's mask for `length` new tokens after `done`, from its positions."""
    return [
        [key <= query and key // CHUNK == query // CHUNK for key in range(done + length)]
        for query in range(done, done + length)
    ]


def filled(cache, done: list[int]) -> None:
    """`cache` holding `done` tokens a row, left-padded to the longest."""
    width = max(done)
    keys = mx.zeros((len(done), 1, width, 8))
    cache.update_and_fetch(keys, keys)


def test_a_row_alone_sees_its_chunk_only():
    cache = KVCache()
    cache.update_and_fetch(mx.zeros((1, 1, 6, 8)), mx.zeros((1, 1, 6, 8)))
    assert chunk_attention_mask(3, CHUNK, cache).tolist() == alone(6, 3)
    assert chunk_attention_mask(5, CHUNK, None).tolist() == alone(0, 5)


def test_each_padded_row_of_a_batch_sees_what_it_sees_alone():
    done = [7, 3, 5]
    width = max(done)
    cache = BatchKVCache([width - d for d in done])
    filled(cache, done)
    for length in (1, 3, 6):  # a decode step, and passes across chunk boundaries
        mask = chunk_attention_mask(length, CHUNK, cache)
        assert mask.shape == (len(done), 1, length, width + length)
        for row, before in enumerate(done):
            padding = width - before
            assert mask[row, 0, :, :padding].tolist() == [[False] * padding] * length
            assert mask[row, 0, :, padding:].tolist() == alone(before, length)
