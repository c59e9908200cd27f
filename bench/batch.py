"""The Batch API at idle priority: an interactive stream's first token (the median of
--samples requests a round) and longest gap beside a running 200-line batch, against the
same on an idle server; and the batch's throughput against the same requests sent at
once, in one run.

    make bench-batch                             # 50m model, 3 rounds, 200 lines
    make bench-batch ARGS="--model 7m --rounds 1 --lines 50"
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import models
import openai
from harness import Reply, Target, print_figures

from bench import Workload

LINE_PROMPT = 40  # tokens of each line's prompt


def longest_gap(reply: Reply) -> float:
    return max(b - a for a, b in zip(reply.stamps, reply.stamps[1:], strict=False))


def interactive(target: Target, w: Workload) -> dict[str, float]:
    reply = target.chat(w.user(20), w.tokens, w.logit_bias)
    return {"TTFT s": reply.ttft, "longest gap s": longest_gap(reply)}


def first_tokens(target: Target, w: Workload, count: int) -> list[float]:
    """`count` more first-token times of short requests, each a random while after the
    last (the batch step running when one comes is at a random point of its course)."""
    times = []
    for _ in range(count):
        time.sleep(random.uniform(0.05, 0.5))
        times.append(target.chat(w.user(20), 2, w.logit_bias).ttft)
    return times


def lines(w: Workload, count: int, tokens: int) -> list[dict]:
    return [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": w.user(LINE_PROMPT),
                "max_tokens": tokens,
                "temperature": 0,
                "logit_bias": w.logit_bias,
            },
        }
        for i in range(count)
    ]


def submit(sdk: openai.OpenAI, requests: list[dict]) -> tuple[str, float]:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in requests)
    uploaded = sdk.files.create(file=("bench.jsonl", data), purpose="batch")
    start = time.perf_counter()
    batch = sdk.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id, start


def wait_running(target: Target, slots: int) -> None:
    """Until the batch holds every decode slot."""
    status = f"http://127.0.0.1:{target.port}/v1/status"
    while True:
        with urllib.request.urlopen(status) as response:
            if json.load(response)["requests"]["running"] >= slots:
                return
        time.sleep(0.02)


def batch_tps(sdk: openai.OpenAI, batch_id: str, start: float) -> float:
    while (batch := sdk.batches.retrieve(batch_id)).status != "completed":
        assert batch.status in ("in_progress", "finalizing"), batch
        time.sleep(0.1)
    wall = time.perf_counter() - start
    assert batch.usage is not None and batch.request_counts is not None
    assert batch.request_counts.failed == 0, batch
    return batch.usage.output_tokens / wall


def at_once(target: Target, w: Workload, count: int, tokens: int) -> float:
    requests = [(w.user(LINE_PROMPT), tokens) for _ in range(count)]
    start = time.perf_counter()
    replies: list[Reply] = target.chat_together(requests, w.logit_bias)
    wall = max(r.finished for r in replies) - start
    return sum(r.completion_tokens for r in replies) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--line-tokens", type=int, default=64, help="decoded per batch line")
    parser.add_argument("--tokens", type=int, default=128, help="decoded by the stream")
    parser.add_argument("--slots", type=int, default=32, help="--max-concurrent")
    parser.add_argument(
        "--samples", type=int, default=15, help="first-token times a round, alone and beside"
    )
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    w = Workload(path, args.tokens, 2000)
    print(
        f"device {mx.default_device()}, {path.name}, {args.lines} lines x {args.line_tokens} "
        f"tokens, {args.slots} slots, a stream of {args.tokens} tokens"
    )
    rows: dict[str, list[float]] = {
        "stream alone: TTFT s": [],
        "stream beside the batch: TTFT s": [],
        "stream alone: longest gap s": [],
        "stream beside the batch: longest gap s": [],
        "batch: tok/s": [],
        "the same requests at once: tok/s": [],
    }
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as folder:
            db = str(Path(folder) / "batches.sqlite")
            target = Target("mlxserve", path, "--batch-db", db, "--max-concurrent", str(args.slots))
            try:
                sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{target.port}/v1", api_key="x")
                interactive(target, w)  # warm-up
                alone = interactive(target, w)
                alone["TTFT s"] = statistics.median(
                    [alone["TTFT s"], *first_tokens(target, w, args.samples - 1)]
                )
                batch_id, start = submit(sdk, lines(w, args.lines, args.line_tokens))
                wait_running(target, args.slots)
                beside = interactive(target, w)
                beside["TTFT s"] = statistics.median(
                    [beside["TTFT s"], *first_tokens(target, w, args.samples - 1)]
                )
                rows["batch: tok/s"].append(batch_tps(sdk, batch_id, start))
                rows["the same requests at once: tok/s"].append(
                    at_once(target, w, args.lines, args.line_tokens)
                )
            finally:
                target.stop()
        rows["stream alone: TTFT s"].append(alone["TTFT s"])
        rows["stream beside the batch: TTFT s"].append(beside["TTFT s"])
        rows["stream alone: longest gap s"].append(alone["longest gap s"])
        rows["stream beside the batch: longest gap s"].append(beside["longest gap s"])
    medians = print_figures(rows)
    ttft = medians["stream beside the batch: TTFT s"] / medians["stream alone: TTFT s"]
    gap = medians["stream beside the batch: longest gap s"] / medians["stream alone: longest gap s"]
    tps = medians["batch: tok/s"] / medians["the same requests at once: tok/s"]
    print(
        f"\n  TTFT beside / alone {ttft:.2f}x, longest gap {gap:.2f}x, batch / at once {tps:.2f}x"
    )


if __name__ == "__main__":
    main()
