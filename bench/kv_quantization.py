"""KV-cache quantization: memory per token and speed, quantized against plain, and
mlxserve against mlx_lm.server (which serves one request at a time when it quantizes).

Each server runs the bench model with --kv-bits 4, 8 and without; per configuration:
KV bytes per prompt token (mlxserve's /metrics after one prompt of known length), one
stream's decode tok/s, a long prompt's time to first token, and 8 concurrent streams'
total tok/s. Rounds interleave the configurations.

    make bench-kv                                   # 50m model, 3 rounds
    make bench-kv ARGS="--model 7m --rounds 1"
"""

from __future__ import annotations

import argparse
import http.client
import statistics
from collections import defaultdict

import models
from harness import Target

from bench import Workload, concurrent, single_stream

CONFIGS = {"plain": (), "kv8": ("--kv-bits", "8"), "kv4": ("--kv-bits", "4")}


def prompt_cache_bytes(target: Target) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
    conn.request("GET", "/metrics")
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith("mlxserve_prompt_cache_bytes "):
            return float(line.split()[1])
    raise RuntimeError("no mlxserve_prompt_cache_bytes in /metrics")


def kv_bytes_per_token(target: Target, w: Workload) -> float:
    """What one fresh prompt adds to the prompt cache, over the tokens it holds."""
    messages = w.user(w.long_prompt)
    before = prompt_cache_bytes(target)
    target.chat(messages, 1, w.logit_bias)
    added = prompt_cache_bytes(target) - before
    return added / (len(w.prompt_ids(messages)) + 1)


def measure(kind: str, target: Target, w: Workload) -> dict[str, float]:
    row = {**single_stream(target, w), **concurrent(8, distinct=True)(target, w)}
    row["long prompt TTFT s"] = target.chat(w.user(w.long_prompt), 2, w.logit_bias).ttft
    if kind == "mlxserve":
        row["KV bytes/token"] = kv_bytes_per_token(target, w)
    return {k: v for k, v in row.items() if "p95" not in k and "CPU" not in k}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="decoded per reply")
    parser.add_argument("--long-prompt", type=int, default=2000, help="tokens")
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    w = Workload(path, args.tokens, args.long_prompt)
    print(f"device {mx.default_device()}, {path.name}, {args.tokens} tokens per reply")
    results: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for _ in range(args.rounds):
        for kind in ("mlxserve", "mlx_lm.server"):
            for config, flags in CONFIGS.items():
                target = Target(kind, path, *flags)
                try:
                    single_stream(target, w)  # warm-up
                    results[kind, config].append(measure(kind, target, w))
                finally:
                    target.stop()
    report(results)


def report(results: dict[tuple[str, str], list[dict]]) -> None:
    def median(kind: str, config: str, metric: str) -> float:
        return statistics.median(r[metric] for r in results[kind, config])

    metrics = list(results["mlxserve", "plain"][0])
    print(f"\n{'median over rounds':34}" + "".join(f"{c:>12}" for c in CONFIGS) + "   kv4/plain")
    for kind in ("mlxserve", "mlx_lm.server"):
        print(f"\n{kind}")
        for metric in metrics:
            if metric not in results[kind, "plain"][0]:
                continue
            values = [median(kind, c, metric) for c in CONFIGS]
            line = f"  {metric:32}" + "".join(f"{v:12.3f}" for v in values)
            print(line + f"{values[2] / values[0]:12.2f}")
    print("\nmlxserve / mlx_lm.server")
    for metric in metrics:
        if metric in results["mlx_lm.server", "plain"][0]:
            ratios = [
                median("mlxserve", c, metric) / median("mlx_lm.server", c, metric) for c in CONFIGS
            ]
            print(f"  {metric:32}" + "".join(f"{r:12.2f}" for r in ratios))


if __name__ == "__main__":
    main()
