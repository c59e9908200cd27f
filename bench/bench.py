"""Throughput benchmark: mlxserve vs mlx_lm.server vs mlx-lm itself.

Black-box: both servers run as subprocesses from this venv on the same locally built
random-weight qwen3 models (bench/models.py) and are measured over streaming HTTP in
interleaved rounds (mlxserve, mlx_lm.server, mlxserve, ...). In-process
`stream_generate` and `BatchGenerator` runs are the limit. Every reply decodes exactly
the tokens asked for (end tokens are forbidden by logit_bias). Figures are ratios, with
min / median / max over rounds.

    make bench                                   # both models, 3 rounds
    make bench ARGS="--models 7m --rounds 5"
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import models
from harness import Reply, Target

SERVERS = ("mlxserve", "mlx_lm.server")
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")
_ids = itertools.count()


class Workload:
    """Prompts of known token lengths; every call makes a prompt no cache has seen."""

    def __init__(self, path: Path, tokens: int, long_prompt: int):
        from mlx_lm import load

        self.model, self.tokenizer = load(str(path))
        self.tokens = tokens
        self.long_prompt = long_prompt
        vocab = self.tokenizer.get_vocab()
        self.logit_bias = {str(vocab[t]): -100 for t in END_TOKENS if t in vocab}

    def text(self, n_tokens: int) -> str:
        """About `n_tokens` of fresh text (a unique opening line, then numbered notes)."""
        opening = f"Session {next(_ids)}-{time.time_ns()}."
        lines = [opening]
        i = 0
        while len(self.tokenizer.encode(" ".join(lines))) < n_tokens:
            lines.append(f"Note {i}: the fisherman counted {i * 7 % 97} silver fish at dawn.")
            i += 1
        return " ".join(lines)

    def user(self, n_tokens: int) -> list[dict]:
        return [{"role": "user", "content": self.text(n_tokens)}]

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def then(messages: list[dict], reply: Reply, question: str) -> list[dict]:
    return [
        *messages,
        {"role": "assistant", "content": reply.text},
        {"role": "user", "content": question},
    ]


# Scenarios: each takes a server and the workload and returns named measurements.


def single_stream(target: Target, w: Workload) -> dict[str, float]:
    cpu = target.cpu_seconds()
    reply = target.chat(w.user(20), w.tokens, w.logit_bias)
    cpu = target.cpu_seconds() - cpu
    return {
        "decode tok/s": reply.decode_tps,
        "TTFT s (short prompt)": reply.ttft,
        "CPU ms/token": 1000 * cpu / reply.completion_tokens,
    }


def cold_prefill(target: Target, w: Workload) -> dict[str, float]:
    return {"cold prefill TTFT s": target.chat(w.user(w.long_prompt), 2, w.logit_bias).ttft}


def second_turn(target: Target, w: Workload) -> dict[str, float]:
    messages = w.user(w.long_prompt)
    first = target.chat(messages, 16, w.logit_bias)
    second = target.chat(then(messages, first, "And then?"), 2, w.logit_bias)
    return {"turn 2 / turn 1 TTFT": second.ttft / first.ttft}


def alternating(target: Target, w: Workload) -> dict[str, float]:
    a, b = w.user(w.long_prompt // 2), w.user(w.long_prompt // 2)
    a1 = target.chat(a, 16, w.logit_bias)
    b1 = target.chat(b, 16, w.logit_bias)
    a2 = target.chat(then(a, a1, "And then?"), 2, w.logit_bias)
    b2 = target.chat(then(b, b1, "And then?"), 2, w.logit_bias)
    return {"alternating: turn 2 / turn 1 TTFT": (a2.ttft + b2.ttft) / (a1.ttft + b1.ttft)}


def shared_system(target: Target, w: Workload) -> dict[str, float]:
    system = {"role": "system", "content": w.text(w.long_prompt)}
    one = target.chat([system, *w.user(20)], 2, w.logit_bias)
    other = target.chat([system, *w.user(20)], 2, w.logit_bias)
    return {"shared system: 2nd / 1st TTFT": other.ttft / one.ttft}


def concurrent(n: int, distinct: bool = False) -> Callable[[Target, Workload], dict[str, float]]:
    """`n` clients at once, all sending one prompt (a shared prompt) or each its own."""
    name = f"{n} concurrent{', distinct prompts' if distinct else ''}"

    def run(target: Target, w: Workload) -> dict[str, float]:
        prompts = [w.user(20) for _ in range(n)] if distinct else [w.user(20)] * n
        start = time.perf_counter()
        replies = target.chat_together([(p, w.tokens) for p in prompts], w.logit_bias)
        wall = max(r.finished for r in replies) - start
        ttfts = sorted(r.ttft for r in replies)
        results = {
            f"{name}: total tok/s": sum(r.completion_tokens for r in replies) / wall,
            f"{name}: TTFT p50 s": statistics.median(ttfts),
        }
        if n > 1:
            p95 = statistics.quantiles(ttfts, n=20, method="inclusive")[18]
            results[f"{name}: TTFT p95 s"] = p95
        return results

    run.__name__ = f"concurrent_{n}{'_distinct' if distinct else ''}"
    return run


def mixed(target: Target, w: Workload) -> dict[str, float]:
    """Four streams decode; then a long prompt arrives. How long do the streams pause
    while it is processed, against how long it waits for its first token?"""
    stop = threading.Event()
    streams = [Reply(time.perf_counter()) for _ in range(4)]
    threads = [
        threading.Thread(target=target.chat, args=(w.user(20), 30_000, w.logit_bias, r, stop))
        for r in streams
    ]
    for thread in threads:
        thread.start()
    while min(len(r.stamps) for r in streams) < 5:
        time.sleep(0.01)
    arriving = target.chat(w.user(w.long_prompt), 2, w.logit_bias)
    stop.set()
    for thread in threads:
        thread.join()
    start, end = arriving.sent, arriving.stamps[0]
    gaps, rates = [], []
    for r in streams:
        # The gaps that overlap the window, from the last token before it on.
        before = [t for t in r.stamps if t <= start][-1:]
        inside = [t for t in r.stamps if start < t <= end]
        after = [t for t in r.stamps if t > end][:1]
        stamps = before + inside + after
        gaps.append(max((b - a for a, b in itertools.pairwise(stamps)), default=end - start))
        rates.append(len(inside) / (end - start))
    return {
        "mixed: longest stream gap / new TTFT": max(gaps) / arriving.ttft,
        "mixed: stream tok/s during prefill": statistics.mean(rates),
        "mixed: new prompt TTFT s": arriving.ttft,
    }


SCENARIOS = [
    single_stream,
    cold_prefill,
    second_turn,
    alternating,
    shared_system,
    concurrent(1),
    concurrent(4),
    concurrent(8),
    concurrent(8, distinct=True),
    mixed,
]


# The limit: mlx-lm in this process, no HTTP.


def raw_limits(w: Workload) -> dict[str, float]:
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.generate import BatchGenerator

    banned = mx.array([int(t) for t in w.logit_bias])

    def no_end(_tokens, logits):
        return logits.at[:, banned].add(mx.array(-100.0))

    results = {}
    cpu = time.process_time()
    start = time.perf_counter()
    stamps = [time.perf_counter() for _ in stream_generate(
        w.model, w.tokenizer, w.prompt_ids(w.user(20)), max_tokens=w.tokens,
        logits_processors=[no_end],
    )]  # fmt: skip
    cpu = time.process_time() - cpu
    results["decode tok/s"] = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    results["TTFT s (short prompt)"] = stamps[0] - start
    results["CPU ms/token"] = 1000 * cpu / len(stamps)
    start = time.perf_counter()
    next(iter(stream_generate(w.model, w.tokenizer, w.prompt_ids(w.user(w.long_prompt)), 1)))
    results["cold prefill TTFT s"] = time.perf_counter() - start
    for n in (1, 4, 8):
        generator = BatchGenerator(w.model, stop_tokens=[], logits_processors=[no_end])
        prompts = [w.prompt_ids(w.user(20)) for _ in range(n)]
        start = time.perf_counter()
        generator.insert(prompts, max_tokens=[w.tokens] * n)
        done = 0
        while done < n:
            done += sum(r.finish_reason is not None for r in generator.next_generated())
        results[f"{n} concurrent: total tok/s"] = n * w.tokens / (time.perf_counter() - start)
        generator.close()
    return results


def restart_with_disk_tier(path: Path, w: Workload) -> dict[str, float]:
    """mlxserve only: a long conversation, a restart, and its next turn."""
    with tempfile.TemporaryDirectory() as folder:
        args = ("--prompt-cache-dir", folder)
        target = Target("mlxserve", path, *args)
        messages = w.user(w.long_prompt)
        first = target.chat(messages, 16, w.logit_bias)
        target.stop()
        target = Target("mlxserve", path, *args)
        try:
            second = target.chat(then(messages, first, "And then?"), 2, w.logit_bias)
        finally:
            target.stop()
    return {"after restart: turn 2 / cold TTFT": second.ttft / first.ttft}


def summary(values: list[float]) -> str:
    return f"{min(values):9.3f} {statistics.median(values):9.3f} {max(values):9.3f}"


def report(title: str, results: dict, raw: list[dict], restart: list[dict]) -> None:
    rounds = len(results["mlxserve"])
    print(f"\n## {title}  (min / median / max over {rounds} rounds)\n")
    metrics = list(dict.fromkeys(k for r in results["mlxserve"] for k in r))
    print(f"{'':38} {'mlxserve':>29} {'mlx_lm.server':>29} {'mlxserve / mlx_lm.server':>29}")
    for metric in metrics:
        ours = [r[metric] for r in results["mlxserve"]]
        theirs = [r[metric] for r in results["mlx_lm.server"]]
        ratio = [a / b for a, b in zip(ours, theirs, strict=True)]
        print(f"{metric:38} {summary(ours)} {summary(theirs)} {summary(ratio)}")
    if raw:
        print(f"\n{'vs raw mlx-lm (server / raw)':38} {'mlxserve':>29} {'mlx_lm.server':>29}")
    for metric in raw[0] if raw else []:
        line = f"{metric:38}"
        for name in SERVERS:
            ratio = [r[metric] / lim[metric] for r, lim in zip(results[name], raw, strict=True)]
            line += f" {summary(ratio)}"
        print(line)
    for metric in restart[0] if restart else []:
        print(f"\n{metric:38} {summary([r[metric] for r in restart])}  (mlxserve)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="7m,50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--dtype", help="default: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="decoded per reply")
    parser.add_argument("--long-prompt", type=int, default=2000, help="tokens")
    parser.add_argument(
        "--only",
        help=f"comma-separated scenarios, of {', '.join(s.__name__ for s in SCENARIOS)}",
    )
    args = parser.parse_args()
    scenarios = [s for s in SCENARIOS if not args.only or s.__name__ in args.only.split(",")]

    import mlx.core as mx

    dtype = args.dtype or models.device_dtype()
    print(f"device: {mx.default_device()}, dtype {dtype}, {args.tokens} tokens per reply")
    for key in args.models.split(","):
        path = models.build(models.MODELS[key], dtype)
        w = Workload(path, args.tokens, args.long_prompt)
        targets = {name: Target(name, path) for name in SERVERS}
        results: dict[str, list[dict]] = defaultdict(list)
        raw: list[dict] = []
        try:
            for target in targets.values():
                single_stream(target, w)  # warm-up
            for _ in range(args.rounds):
                if not args.only:
                    raw.append(raw_limits(w))
                rows = {name: {} for name in SERVERS}
                for scenario in scenarios:
                    for name, target in targets.items():
                        rows[name].update(scenario(target, w))
                        target.settle()
                for name in SERVERS:
                    results[name].append(rows[name])
        finally:
            for target in targets.values():
                target.stop()
        restart = [] if args.only else [restart_with_disk_tier(path, w) for _ in range(args.rounds)]
        report(f"{path.name} ({key})", results, raw, restart)


if __name__ == "__main__":
    main()
