"""What constrained decoding costs per token: decode with a JSON-schema grammar's mask
(mlxserve's llguidance processor) against the same decode without one, in-process, alone
and 8 sequences batched.

    .venv/bin/python bench/structured.py --models 7m,50m --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import models

# Long enough that no reply ends before the token limit.
SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 64,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 999},
                    "label": {"type": "string", "maxLength": 16},
                    "done": {"type": "boolean"},
                },
                "required": ["id", "label", "done"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}


def end_ban(tokenizer):
    """Unconstrained replies must not end early either."""
    import mlx.core as mx

    ends = mx.array(sorted(tokenizer.eos_token_ids))

    def ban(_tokens, logits):
        return logits.at[:, ends].add(mx.array(-1e9, dtype=logits.dtype))

    return ban


def processors(tokenizer, grammar, constrained: bool) -> list:
    return [end_ban(tokenizer), *([grammar.processor()] if constrained else [])]


def single(model, tokenizer, grammar, prompt, tokens: int, constrained: bool) -> float:
    """Decode tokens/s of one stream (first token excluded)."""
    from mlx_lm import stream_generate

    stamps = [
        time.perf_counter()
        for _ in stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=tokens,
            logits_processors=processors(tokenizer, grammar, constrained),
        )
    ]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def batched(model, tokenizer, grammar, prompt, tokens: int, constrained: bool, n: int) -> float:
    """Total decode tokens/s of `n` sequences in one BatchGenerator."""
    from mlx_lm.generate import BatchGenerator

    generator = BatchGenerator(model, stop_tokens=[], completion_batch_size=n)
    generator.insert(
        [prompt] * n,
        max_tokens=[tokens] * n,
        logits_processors=[processors(tokenizer, grammar, constrained) for _ in range(n)],
    )
    produced, start = 0, None
    while produced < n * (tokens - 1):
        _, responses = generator.next()
        if responses and start is None:
            start = time.perf_counter()  # the first tokens are out: prefill is over
        elif responses:
            produced += len(responses)
    elapsed = time.perf_counter() - start
    generator.close()
    return produced / elapsed


def scenarios(model, tokenizer, grammar, prompt, tokens: int, n: int) -> dict:
    """Each takes `constrained` and returns tokens/s."""
    return {
        "single": lambda c: single(model, tokenizer, grammar, prompt, tokens, c),
        f"batch {n}": lambda c: batched(model, tokenizer, grammar, prompt, tokens, c, n),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="7m,50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--dtype", help="default: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    import mlx.core as mx
    from mlx_lm import load

    from mlxserve.structured import lark
    from mlxserve.structured.matcher import Grammar

    dtype = args.dtype or models.device_dtype()
    print(f"device: {mx.default_device()}, dtype {dtype}, {args.tokens} tokens per reply")
    print(f"{'model':>6} {'scenario':>10} {'free tok/s':>11} {'constrained':>12} {'overhead':>9}")
    for key in args.models.split(","):
        model, tokenizer = load(str(models.build(models.MODELS[key], dtype)))
        grammar = Grammar(tokenizer, lark.grammar(lark.json_schema(SCHEMA)))
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "List the items."}], add_generation_prompt=True
        )
        runs = scenarios(model, tokenizer, grammar, prompt, args.tokens, args.batch)
        for name, run in runs.items():
            run(False), run(True)  # warm-up
            free, bound = [], []
            for _ in range(args.rounds):  # interleaved, so drift hits both alike
                free.append(run(False))
                bound.append(run(True))
            ratios = [f / b - 1 for f, b in zip(free, bound, strict=True)]
            print(
                f"{key:>6} {name:>10} {statistics.median(free):11.1f} "
                f"{statistics.median(bound):12.1f} {statistics.median(ratios):9.1%}"
            )


if __name__ == "__main__":
    main()
