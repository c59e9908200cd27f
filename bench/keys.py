"""What API keys cost a request: the same requests to a server without keys and to one
whose store holds a key with limits (each request admitted, its usage written to SQLite
with synchronous=FULL before its last event), in one run.

    make bench-keys                              # 50m model, 3 rounds
    make bench-keys ARGS="--model 7m --rounds 1"
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import models
from harness import Target, print_figures

from bench import Workload
from mlxserve.keys.records import KeyRecord
from mlxserve.keys.store import KeyStore


def one_by_one(target: Target, w: Workload, count: int) -> float:
    """Mean seconds of a short request sent alone, one after another."""
    start = time.perf_counter()
    for _ in range(count):
        target.chat(w.user(20), w.tokens, w.logit_bias)
    return (time.perf_counter() - start) / count


def together(target: Target, w: Workload, count: int) -> float:
    """Tokens per second of `count` short requests sent at once."""
    start = time.perf_counter()
    replies = target.chat_together([(w.user(20), w.tokens)] * count, w.logit_bias)
    return sum(r.completion_tokens for r in replies) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=8, help="decoded per request")
    parser.add_argument("--requests", type=int, default=40, help="one by one, per round")
    parser.add_argument("--concurrent", type=int, default=8)
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    w = Workload(path, args.tokens, 2000)
    print(f"device {mx.default_device()}, {path.name}, requests of {args.tokens} tokens")
    rows: dict[str, list[float]] = {
        "no keys: s a request": [],
        "keys: s a request": [],
        f"no keys: tok/s of {args.concurrent} at once": [],
        f"keys: tok/s of {args.concurrent} at once": [],
    }
    with tempfile.TemporaryDirectory() as folder:
        store = KeyStore(Path(folder) / "keys.sqlite")
        secret = store.create(KeyRecord("bench", "", None, rpm=10**6, tokens_per_day=10**9))
        store.close()
        for _ in range(args.rounds):
            for name, flags, key in (
                ("no keys", (), ""),
                ("keys", ("--keys-db", str(Path(folder) / "keys.sqlite")), secret),
            ):
                target = Target("mlxserve", path, *flags, key=key)
                try:
                    one_by_one(target, w, 3)  # warm-up
                    rows[f"{name}: s a request"].append(one_by_one(target, w, args.requests))
                    rows[f"{name}: tok/s of {args.concurrent} at once"].append(
                        together(target, w, args.concurrent)
                    )
                finally:
                    target.stop()
    medians = print_figures(rows, digits=4)
    latency = medians["keys: s a request"] / medians["no keys: s a request"]
    tps = (
        medians[f"keys: tok/s of {args.concurrent} at once"]
        / medians[f"no keys: tok/s of {args.concurrent} at once"]
    )
    print(f"\n  keys / no keys: a request's time {latency:.3f}x, throughput {tps:.3f}x")


if __name__ == "__main__":
    main()
