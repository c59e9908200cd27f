"""One model on one process against the same model across two ranks (mlx.launch, ring
backend, on this machine), and against mlx_lm.server across the same two ranks.

On one 2-core machine two ranks share the cores and talk over loopback: the split cannot
make decoding faster here; what this measures is what lockstep serving costs (decode
tok/s, one stream and several at once) and what the ranks exchange per generated token
(bytes over the loopback interface while the replies decode, counted by the kernel, per
generated token: the prompts' prefill is left out). On two Macs the
same bytes cross Ethernet or Thunderbolt, and each Mac holds half the weights.

    make bench-distributed                      # 3 rounds, 100 tokens
    make bench-distributed ARGS="--rounds 1 --tokens 60"
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import models
from harness import Target

from bench import Workload


def loopback_bytes() -> int:
    """Bytes received on the loopback interface so far (Linux)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


class LoopbackMeter:
    """Samples the loopback byte counter every few milliseconds from a thread."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.005):
            self.samples.append((time.perf_counter(), loopback_bytes()))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def between(self, start: float, end: float) -> int:
        inside = [count for when, count in self.samples if start <= when <= end]
        return inside[-1] - inside[0] if len(inside) > 1 else 0


def run(target: Target, w: Workload, streams: int) -> tuple[float, float]:
    """(decode tok/s summed over the streams, loopback bytes per token decoded), from
    the first token of the last stream to start to the end of the first to finish: the
    stretch where every stream decodes and none prefills."""
    requests = [(w.user(200), w.tokens) for _ in range(streams)]
    meter = LoopbackMeter()
    replies = target.chat_together(requests, w.logit_bias)
    meter.stop()
    start = max(r.stamps[0] for r in replies)
    end = min(r.finished for r in replies)
    decoded = sum(sum(start <= t <= end for t in r.stamps) for r in replies)
    speed = sum(r.completion_tokens - 1 for r in replies) / (
        max(r.finished for r in replies) - min(r.stamps[0] for r in replies)
    )
    return speed, meter.between(start, end) / max(decoded, 1)


def measure(path: Path, w: Workload, targets: dict, rounds: int, streams: int) -> None:
    """Servers one at a time (two launched at once would share the cores), rounds in turn."""
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for name, (kind, flags, ranks) in targets.items():
            target = Target(kind, path, *flags, ranks=ranks)
            try:
                target.chat(w.user(50), 8, w.logit_bias)  # warm up
                for n in (1, streams):
                    results.setdefault((name, n), []).append(run(target, w, n))
            finally:
                target.stop()
    reference = next(iter(targets))
    for n in (1, streams):
        base = statistics.median(speed for speed, _ in results[(reference, n)])
        print(f"  {n} stream{'s' if n > 1 else ''} at once")
        for name in targets:
            speed = statistics.median(s for s, _ in results[(name, n)])
            per_token = statistics.median(b for _, b in results[(name, n)])
            print(
                f"    {name:34} {speed:7.1f} tok/s ({speed / base:4.2f}x)"
                f"   {per_token / 1024:8.1f} KiB over loopback per decoded token"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--streams", type=int, default=4)
    args = parser.parse_args()

    import mlx.core as mx

    print(f"device {mx.default_device()}, {args.tokens} tokens per reply, {args.rounds} rounds")
    cases = [
        ("50m", "tensor", ()),
        ("hybrid-50m", "pipeline", ("--pipeline",)),
    ]
    for model, mode, reference_flags in cases:
        path = models.build(models.MODELS[model])
        w = Workload(path, args.tokens, 0)
        print(f"\n{path.name} ({mode} parallelism across 2 ranks)")
        targets = {
            "mlxserve, 1 process": ("mlxserve", (), 1),
            "mlxserve, 2 ranks": ("mlxserve", (), 2),
            "mlx_lm.server, 2 ranks": ("mlx_lm.server", reference_flags, 2),
        }
        measure(path, w, targets, args.rounds, args.streams)


if __name__ == "__main__":
    main()
