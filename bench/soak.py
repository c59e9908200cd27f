"""Soak benchmark: does memory reach a plateau under steady mixed load?

One server at a time runs `--minutes` of mixed load from `--clients` threads: fresh
prompts of 100 to 2,000 tokens, conversations that grow turn by turn (prompt-cache hits),
two choices at once, and clients that hang up mid-stream. The server's RSS is sampled
every few seconds (and, for mlxserve, its /metrics: prompt cache, MLX active and cached
memory); the report gives RSS after warm-up, at the end, its peak, the slope over the
second half, and RSS after a minute idle.

    make bench-soak                                   # mlxserve, 10 minutes
    make bench-soak ARGS="--minutes 3 --servers mlxserve,mlx_lm.server"
"""

from __future__ import annotations

import argparse
import http.client
import random
import statistics
import threading
import time
from dataclasses import dataclass, field

import models
from harness import Reply, Target

from bench import Workload

SAMPLE_SECONDS = 5
IDLE_SECONDS = 60
MB = 2**20
GAUGES = (
    "mlxserve_prompt_cache_bytes",
    "mlxserve_mlx_active_memory_bytes",
    "mlxserve_mlx_cache_memory_bytes",
)


@dataclass
class Samples:
    times: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)  # MB
    gauges: list[dict[str, float]] = field(default_factory=list)
    requests: int = 0
    errors: int = 0


def mlxserve_gauges(target: Target) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in GAUGES:
            values[name] = float(value) / MB
    return values


def client(target: Target, w: Workload, until: float, seed: int, samples: Samples) -> None:
    """Loop over the kinds of request a busy server sees, until `until`."""
    rng = random.Random(seed)
    conversation: list[dict] = []
    while time.monotonic() < until:
        kind = rng.choice(["fresh", "turn", "turn", "hang_up", "two"])
        try:
            if kind == "fresh" or not conversation:
                conversation = w.user(rng.randint(100, 2000))
                reply = target.chat(conversation, rng.randint(16, 160), w.logit_bias)
            elif kind == "turn":
                reply = target.chat(conversation, rng.randint(16, 160), w.logit_bias)
                question = w.text(rng.randint(20, 200))
                conversation = [
                    *conversation,
                    {"role": "assistant", "content": reply.text},
                    {"role": "user", "content": question},
                ]
            elif kind == "hang_up":
                stop = threading.Event()
                reply = Reply(time.perf_counter())
                thread = threading.Thread(
                    target=target.chat, args=(w.user(500), 2000, w.logit_bias, reply, stop)
                )
                thread.start()
                while len(reply.stamps) < 5 and thread.is_alive():
                    time.sleep(0.01)
                stop.set()
                thread.join()
            else:
                target.chat_together([(w.user(300), 64), (w.user(300), 64)], w.logit_bias)
            samples.requests += 1
        except Exception:
            samples.errors += 1
            time.sleep(1)


def soak(kind: str, path, w: Workload, minutes: float, clients: int) -> Samples:
    target = Target(kind, path)
    samples = Samples()
    start = time.monotonic()
    until = start + minutes * 60
    threads = [
        threading.Thread(target=client, args=(target, w, until, i, samples)) for i in range(clients)
    ]
    try:
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads) or time.monotonic() < until + IDLE_SECONDS:
            samples.times.append((time.monotonic() - start) / 60)
            samples.rss.append(target._ps.memory_info().rss / MB)
            samples.gauges.append(mlxserve_gauges(target) if kind == "mlxserve" else {})
            time.sleep(SAMPLE_SECONDS)
    finally:
        target.stop()
    return samples


def report(kind: str, s: Samples, minutes: float) -> None:
    loaded = [r for t, r in zip(s.times, s.rss, strict=True) if t <= minutes]
    half = [(t, r) for t, r in zip(s.times, s.rss, strict=True) if minutes / 2 <= t <= minutes]
    slope = statistics.linear_regression([t for t, _ in half], [r for _, r in half]).slope
    warm = next(r for t, r in zip(s.times, s.rss, strict=True) if t >= 1)
    print(f"\n{kind}: {s.requests} requests ({s.errors} failed) in {minutes:g} min")
    print(f"  RSS MB: after 1 min {warm:.0f}, end of load {loaded[-1]:.0f}, peak {max(loaded):.0f}")
    print(f"  RSS slope over the second half: {slope:+.1f} MB/min")
    print(f"  RSS after {IDLE_SECONDS} s idle: {s.rss[-1]:.0f} MB")
    if s.gauges[-1]:
        print("  at the end: " + ", ".join(f"{k[9:]} {v:.0f} MB" for k, v in s.gauges[-1].items()))
    print("  minute  RSS MB  " + "  ".join(g[9:] for g in GAUGES if s.gauges[-1]))
    for t, r, g in zip(s.times, s.rss, s.gauges, strict=True):
        if abs(t - round(t)) * 60 < SAMPLE_SECONDS / 2:
            print(f"  {t:6.1f}  {r:6.0f}  " + "  ".join(f"{g.get(k, 0):.0f}" for k in GAUGES if g))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="7m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--servers", default="mlxserve")
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    w = Workload(path, 64, 2000)
    print(f"device {mx.default_device()}, model {path.name}, {args.clients} clients")
    for kind in args.servers.split(","):
        report(kind, soak(kind, path, w, args.minutes, args.clients), args.minutes)


if __name__ == "__main__":
    main()
