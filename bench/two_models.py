"""Two models in one server: aggregate decode speed when both are asked at once, against
the same requests one model after the other (what a server holding one model at a time
can do at best, without counting its swaps).

One mlxserve serves the bench model twice (--model A --model B, two folders of the same
weights); each round sends `streams` requests to A and as many to B, first A's then B's,
then all together. mlx_lm.server takes one model per process: its line is the same
requests, A's then B's, on one process serving A (B's weights being the same, a swap is
the only difference it would add).

    make bench-two-models                      # 50m model, 3 rounds, 4 streams a model
    make bench-two-models ARGS="--model 7m --rounds 1"
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import threading
import time

import models
from harness import Reply, Target

from bench import Workload


def streams_at_once(target: Target, w: Workload, models_asked: list[str | None]) -> float:
    """Aggregate decoded tokens per second of one request per entry, all at once."""
    tokens, wall = run_at_once(target, w, models_asked)
    return tokens / wall


def run_at_once(target: Target, w: Workload, models_asked: list[str | None]) -> tuple[int, float]:
    """(tokens decoded, seconds) for one request per entry, all sent at once."""
    replies: list[Reply] = []
    lock = threading.Lock()
    prompts = [w.user(20) for _ in models_asked]

    def run(prompt, model) -> None:
        reply = target.chat(prompt, w.tokens, w.logit_bias, model=model)
        with lock:
            replies.append(reply)

    start = time.perf_counter()
    threads = [
        threading.Thread(target=run, args=args) for args in zip(prompts, models_asked, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r.completion_tokens for r in replies), max(r.finished for r in replies) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4, help="requests per model")
    parser.add_argument("--tokens", type=int, default=128, help="decoded per reply")
    args = parser.parse_args()

    import mlx.core as mx

    dtype = "bfloat16" if mx.default_device() == mx.gpu else "float32"
    path = models.build(models.MODELS[args.model], dtype)
    twin = path.with_name(path.name + "-twin")
    if not twin.is_dir():
        shutil.copytree(path, twin)
    w = Workload(path, args.tokens, 2000)
    a, b = [str(path)] * args.streams, [str(twin)] * args.streams
    print(f"device {mx.default_device()}, {path.name} x2, {args.streams} streams a model")
    rows: dict[str, list[float]] = {"sequential": [], "together": [], "mlx_lm.server": []}
    for _ in range(args.rounds):
        target = Target("mlxserve", path, "--model", str(twin))
        try:
            streams_at_once(target, w, a + b)  # warm-up
            rows["sequential"].append(sequential(target, w, a, b))
            rows["together"].append(streams_at_once(target, w, a + b))
        finally:
            target.stop()
        target = Target("mlx_lm.server", path)
        try:
            streams_at_once(target, w, [None])  # warm-up
            alone = [None] * args.streams
            rows["mlx_lm.server"].append(sequential(target, w, alone, alone))
        finally:
            target.stop()
    together = statistics.median(rows["together"])
    print("\naggregate decode tok/s, median over rounds")
    for name, values in rows.items():
        median = statistics.median(values)
        print(f"  {name:16}{median:10.1f}   together / this {together / median:6.2f}")


def sequential(target: Target, w: Workload, first: list, second: list) -> float:
    """The same requests, first model A's (at once), then B's (at once)."""
    runs = [run_at_once(target, w, group) for group in (first, second)]
    return sum(tokens for tokens, _ in runs) / sum(wall for _, wall in runs)


if __name__ == "__main__":
    main()
