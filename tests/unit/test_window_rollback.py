"""Sliding windows in a speculative batch (mlx-lm's BatchRotatingKVCache): verify passes
over several tokens mixed with single-token steps, each row keeping its own number of
the pass's tokens (`compat.roll_back_window`), leave every query seeing exactly the last
`window` tokens of its own row: checked against each row's true history over random
sequences of passes, with values that name their tokens."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchRotatingKVCache

from mlxserve.compat import mend_window_masks
from mlxserve.engine.speculation.rewind import roll_back

WINDOW = 8


def seen(cache: BatchRotatingKVCache, tokens: list[list[int]]) -> list[list[list[int]]]:
    """Feed each row its tokens (one pass); per row and query, the tokens it attends to."""
    values = mx.array(tokens, dtype=mx.float32)[:, None, :, None]
    width = values.shape[2]
    mask = cache.make_mask(width, return_array=True)
    _, stored = cache.update_and_fetch(values, values)
    mask = mx.broadcast_to(mask, (len(tokens), 1, width, stored.shape[2]))
    rows = stored[:, 0, :, 0].tolist()
    return [
        [
            sorted(int(v) for v, m in zip(rows[b], mask[b, 0, j].tolist(), strict=True) if m)
            for j in range(width)
        ]
        for b in range(len(tokens))
    ]


def replay(seed: int, mended: bool = True) -> str | None:
    """A random run of passes; what went wrong first, or None."""
    if mended:
        mend_window_masks()
    rnd = random.Random(seed)
    prompts = [[1, 2, 3, 4, 5], [101, 102, 103], [201, 202, 203, 204, 205, 206, 207, 208, 209]]
    longest = max(len(p) for p in prompts)
    cache = BatchRotatingKVCache(WINDOW, [longest - len(p) for p in prompts])
    seen(cache, [[0] * (longest - len(p)) + p for p in prompts])
    history = [list(p) for p in prompts]
    for step in range(14):
        width = rnd.choice([1, 2, 3, 4])
        tokens = [[1000 * (r + 1) + 10 * step + j for j in range(width)] for r in range(3)]
        views = seen(cache, tokens)
        kept = [rnd.randint(1, width) for _ in range(3)] if width > 1 else [1, 1, 1]
        for r in range(3):
            for j in range(kept[r]):
                truth = sorted((history[r] + tokens[r][: j + 1])[-WINDOW:])
                if views[r][j] != truth:
                    return f"step {step}, row {r}, position {j}: {views[r][j]} != {truth}"
            history[r] += tokens[r][: kept[r]]
        if width > 1:
            roll_back([cache], [width - k for k in kept])
    return None


@pytest.mark.parametrize("seed", range(40))
def test_every_query_sees_its_rows_last_window_of_tokens(seed):
    assert replay(seed) is None


def test_unmended_windows_lose_a_padded_rows_oldest_entry():
    """Why mend_window_masks exists (mlx-lm as installed): some runs go wrong without it.
    When this fails, mlx-lm has fixed its mask and the mending can go."""
    from mlx_lm.models.cache import BatchRotatingKVCache as Window

    mended = Window.make_mask
    original = getattr(mended, "__wrapped__", None)
    assert original is not None
    Window.make_mask = original
    try:
        assert any(replay(seed, mended=False) for seed in range(40))
    finally:
        Window.make_mask = mended
