"""How the prompt-chunk size (`--prefill-chunk`) trades prefill speed against the pause
that running streams see: a long prompt processed in chunks of each size, in-process.

    .venv/bin/python bench/prefill_chunks.py --models 7m,50m --prompt 2000
"""

from __future__ import annotations

import argparse
import time

import models

CHUNKS = (64, 128, 256, 512, 1024, 2048)


def prefill(model, prompt: list[int], chunk: int) -> tuple[float, float]:
    """Seconds for the whole prompt, and for its slowest chunk (the last, the longest
    attention)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    start = time.perf_counter()
    slowest = 0.0
    for offset in range(0, len(prompt), chunk):
        tic = time.perf_counter()
        model(mx.array(prompt[offset : offset + chunk])[None], cache=cache)
        mx.eval([c.state for c in cache])
        slowest = max(slowest, time.perf_counter() - tic)
    return time.perf_counter() - start, slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="7m,50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--dtype", help="default: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--prompt", type=int, default=2000, help="tokens")
    parser.add_argument("--rounds", type=int, default=3, help="the best of these is shown")
    args = parser.parse_args()

    import mlx.core as mx
    from mlx_lm import load

    dtype = args.dtype or models.device_dtype()
    print(f"device: {mx.default_device()}, dtype {dtype}, a {args.prompt}-token prompt")
    for key in args.models.split(","):
        model, _ = load(str(models.build(models.MODELS[key], dtype)))
        prompt = [100 + i % 1000 for i in range(args.prompt)]
        prefill(model, prompt, 512)  # warm-up
        print(f"\n{key:>6} {'chunk':>6} {'prefill s':>10} {'slowest chunk s':>16}")
        for chunk in CHUNKS:
            total, slowest = min(prefill(model, prompt, chunk) for _ in range(args.rounds))
            print(f"{'':>6} {chunk:6d} {total:10.3f} {slowest:16.3f}")


if __name__ == "__main__":
    main()
