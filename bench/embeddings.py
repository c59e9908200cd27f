"""Embedding speed of one decoder network through the two libraries mlxserve can load it
with: mlx-lm (its decoder without the LM head) and mlx-embeddings (its own qwen3), on the
50M bench model's weights, batches of 32 inputs of 128 tokens; inputs per second, median
of 5 runs after a warm-up.

    .venv/bin/python bench/embeddings.py
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
import models


def rate(forward, batch: mx.array) -> float:
    mx.eval(forward(batch))  # warm-up
    times = []
    for _ in range(5):
        start = time.perf_counter()
        mx.eval(forward(batch))
        times.append(time.perf_counter() - start)
    return batch.shape[0] / statistics.median(times)


def main() -> None:
    from mlx_embeddings.utils import load_model as load_embeddings
    from mlx_lm.utils import load_model as load_lm

    path = models.build(models.MODELS["50m"])
    batch = mx.random.randint(0, 1000, (32, 128))
    decoder, _ = load_lm(path)
    encoder = load_embeddings(path)
    mask = mx.ones(batch.shape, dtype=mx.int32)
    lm = rate(lambda b: decoder.model(b), batch)
    emb = rate(lambda b: encoder(b, attention_mask=mask).last_hidden_state, batch)
    print(f"device {mx.default_device()}, {path.name}, 32 x 128 tokens")
    print(f"  mlx-lm          {lm:8.1f} inputs/s")
    print(f"  mlx-embeddings  {emb:8.1f} inputs/s   ({emb / lm:.2f}x)")


if __name__ == "__main__":
    main()
