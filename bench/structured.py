"""What constrained decoding costs per token: decode with a JSON-schema grammar's mask
(mlxserve's llguidance processor) against the same decode without one, in-process, alone
and 8 sequences batched; what the mask itself costs a token with numbers bounded and
without; and what a random model (which loops on a digit) writes to the schemas of
issue #29 before (open objects, unbounded numbers) and after (strict closing, bounds).

    make bench-structured ARGS="--models 7m,50m --rounds 5"
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import models

from mlxserve.structured.numbers import NumberBounds

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


# Numbers on every item: the bounds' work happens inside numbers.
NUMBERS = {
    "type": "object",
    "properties": {"values": {"type": "array", "minItems": 64, "items": {"type": "number"}}},
    "required": ["values"],
    "additionalProperties": False,
}
# The schemas the issue saw never end, as clients send them (strict, objects left open).
LOOPING = {
    "open object": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
        "required": ["ok", "color"],
    },
    "number": {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "number"}}}},
        "required": ["a"],
    },
    "bounded number": {
        "type": "object",
        "properties": {"b": {"type": "number", "minimum": -50, "maximum": 50}},
        "required": ["b"],
    },
    "integer": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    "numbers": {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "number"}, "maxItems": 3}},
        "required": ["xs"],
    },
}
ANSWER_TOKENS = 256


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


def answers(model, tokenizer, prompt) -> None:
    """Tokens each LOOPING schema's answer takes (of ANSWER_TOKENS), and whether it parses."""
    import json

    from mlx_lm import stream_generate

    from mlxserve.structured import lark, strict
    from mlxserve.structured.matcher import Grammar

    print(f"{'schema':>15} {'before: tokens':>15} {'valid':>6} {'after: tokens':>14} {'valid':>6}")
    for name, schema in LOOPING.items():
        row = []
        for after in (False, True):
            body = lark.json_schema(strict.closed(schema) if after else schema)
            grammar = Grammar(tokenizer, lark.grammar(body), bounded_numbers=after)
            replies = list(
                stream_generate(
                    model,
                    tokenizer,
                    prompt,
                    max_tokens=ANSWER_TOKENS,
                    logits_processors=[grammar.processor()],
                )
            )
            text = "".join(reply.text for reply in replies)
            try:
                json.loads(text)
                valid = "yes"
            except json.JSONDecodeError:
                valid = "no"
            row.append(f"{len(replies):>{15 if not after else 14}} {valid:>6}")
        print(f"{name:>15} {' '.join(row)}")


def greedy_answer(model, tokenizer, prompt, schema: dict, tokens: int) -> list[int]:
    """The tokens of one greedy answer under the bounded grammar (valid under both)."""
    from mlx_lm import stream_generate

    from mlxserve.structured import lark
    from mlxserve.structured.matcher import Grammar

    grammar = Grammar(tokenizer, lark.grammar(lark.json_schema(schema)))
    replies = stream_generate(
        model,
        tokenizer,
        prompt,
        max_tokens=tokens,
        logits_processors=[end_ban(tokenizer), grammar.processor()],
    )
    return [reply.token for reply in replies]


class TimedBounds(NumberBounds):
    """Number bounds that keep the time their restricting takes."""

    def __init__(self, table):
        super().__init__(table)
        self.seconds = 0.0

    def restrict(self, allowed) -> None:
        start = time.perf_counter()
        super().restrict(allowed)
        self.seconds += time.perf_counter() - start


def mask_cost(tokenizer, schema: dict, answer: list[int], vocab: int, bounded: bool):
    """Microseconds a token spends in the grammar's processor (mask and its application),
    and of those, in the number bounds; `answer` is replayed through a fresh processor, so
    both variants see the same tokens and none of the model's time is counted."""
    import mlx.core as mx

    from mlxserve.structured import lark, matcher

    grammar = matcher.Grammar(
        tokenizer, lark.grammar(lark.json_schema(schema)), bounded_numbers=bounded
    )
    made: list[TimedBounds] = []

    def timed(table) -> TimedBounds:
        made.append(TimedBounds(table))
        return made[-1]

    with mock.patch.object(matcher, "NumberBounds", timed):  # the processor's bounds, timed
        processor = grammar.processor()
    logits = mx.zeros((1, vocab))
    steps = [mx.array([token]) for token in [0, *answer[:-1]]]  # what each call sees last
    mx.eval(logits, *steps)
    start = time.perf_counter()
    for tokens in steps:
        mx.eval(processor(tokens, logits))
    total = time.perf_counter() - start
    bounds = sum(made_bounds.seconds for made_bounds in made)
    return total / len(steps) * 1e6, bounds / len(steps) * 1e6


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
    for key in args.models.split(","):
        model, tokenizer = load(str(models.build(models.MODELS[key], dtype)))
        grammar = Grammar(tokenizer, lark.grammar(lark.json_schema(SCHEMA)))
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "List the items."}], add_generation_prompt=True
        )
        print(f"\n{key}: decode speed")
        print(f"{'scenario':>10} {'free tok/s':>11} {'constrained':>12} {'overhead':>9}")
        runs = scenarios(model, tokenizer, grammar, prompt, args.tokens, args.batch)
        for name, run in runs.items():
            run(False), run(True)  # warm-up
            free, bound = [], []
            for _ in range(args.rounds):  # interleaved, so drift hits both alike
                free.append(run(False))
                bound.append(run(True))
            ratios = [f / b - 1 for f, b in zip(free, bound, strict=True)]
            print(
                f"{name:>10} {statistics.median(free):11.1f} "
                f"{statistics.median(bound):12.1f} {statistics.median(ratios):9.1%}"
            )
        print(f"\n{key}: the grammar processor's cost per token, numbers bounded and not")
        print(f"{'schema':>10} {'unbounded µs':>13} {'bounded µs':>11} {'the bounds µs':>14}")
        for name, schema in (("items", SCHEMA), ("numbers", NUMBERS)):
            answer = greedy_answer(model, tokenizer, prompt, schema, args.tokens)
            vocab = model.args.vocab_size
            cost: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for _ in range(args.rounds * 10):  # interleaved, so drift hits both alike
                for bounded in (False, True):
                    cost[bounded].append(mask_cost(tokenizer, schema, answer, vocab, bounded))
            unbounded = statistics.median(total for total, _ in cost[False])
            bounded_cost = statistics.median(total for total, _ in cost[True])
            bounds = statistics.median(part for _, part in cost[True])
            print(f"{name:>10} {unbounded:13.1f} {bounded_cost:11.1f} {bounds:14.1f}")
        print(
            f"\n{key}: answers to the schemas of issue #29, greedy, {ANSWER_TOKENS} tokens at most"
        )
        answers(model, tokenizer, prompt)


if __name__ == "__main__":
    main()
