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
import time

import models
from harness import Reply, Target, print_medians

from bench import Workload


def run_at_once(target: Target, w: Workload, models_asked: list[str | None]) -> list[Reply]:
    """One streamed request per entry, all sent at once."""
    requests = [(w.user(20), w.tokens) for _ in models_asked]
    return target.chat_together(requests, w.logit_bias, models_asked)


def together(target: Target, w: Workload, first: list, second: list) -> dict[str, float]:
    """Both models' requests at once: aggregate tok/s, and the mean time to first token."""
    start = time.perf_counter()
    return summary(run_at_once(target, w, first + second), start)


def sequential(target: Target, w: Workload, first: list, second: list) -> dict[str, float]:
    """The same requests, model A's (at once), then B's (at once), as a server holding one
    model at a time would serve them at best: B's wait for A's to finish."""
    start = time.perf_counter()
    return summary(run_at_once(target, w, first) + run_at_once(target, w, second), start)


def summary(replies: list[Reply], start: float) -> dict[str, float]:
    """Aggregate decoded tok/s, and the mean time from `start` to each first token."""
    wall = max(r.finished for r in replies) - start
    return {
        "tok/s": sum(r.completion_tokens for r in replies) / wall,
        "TTFT s": statistics.mean(r.stamps[0] - start for r in replies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4, help="requests per model")
    parser.add_argument("--tokens", type=int, default=128, help="decoded per reply")
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    twin = path.with_name(path.name + "-twin")
    if not twin.is_dir():
        shutil.copytree(path, twin)
    w = Workload(path, args.tokens, 2000)
    a, b = [str(path)] * args.streams, [str(twin)] * args.streams
    print(f"device {mx.default_device()}, {path.name} x2, {args.streams} streams a model")
    rows: dict[str, list[dict]] = {
        "mlxserve, together": [],
        "mlxserve, A then B": [],
        "mlx_lm.server, A then B": [],
    }
    alone = [None] * args.streams
    for _ in range(args.rounds):
        target = Target("mlxserve", path, "--model", str(twin))
        try:
            run_at_once(target, w, a + b)  # warm-up
            rows["mlxserve, A then B"].append(sequential(target, w, a, b))
            rows["mlxserve, together"].append(together(target, w, a, b))
        finally:
            target.stop()
        target = Target("mlx_lm.server", path)
        try:
            run_at_once(target, w, [None])  # warm-up
            rows["mlx_lm.server, A then B"].append(sequential(target, w, alone, alone))
        finally:
            target.stop()
    print_medians(rows, "TTFT s")


if __name__ == "__main__":
    main()
