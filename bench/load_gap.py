"""A stream's longest gap between two tokens while the server loads another model, against
its longest gap while a ~2,000-token prompt for its own model is processed beside it.

One mlxserve serves the 7m bench model; a --model-dir holds a copy of the 50m one, not
resident. Each round streams from the 7m model, then (once it streams) asks either for the
50m copy (a load, then its reply) or for a 2,000-token prompt on the 7m model, and records
the stream's longest gap while that request was in flight. The copy is unloaded after each
load so that the next round loads it again (from the page cache, as a second pick of a
model does).

    make bench-load-gap
    make bench-load-gap ARGS="--rounds 5"
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import models
from harness import Reply, Target

from bench import Workload


def longest_gap_during(
    target: Target, messages: list[dict], logit_bias: dict, other: dict
) -> tuple[float, float]:
    """The longest gap between two tokens of a stream of `messages` while the request
    `other` (Target.chat's arguments) is served, and how long `other` took to its first
    token."""
    stop = threading.Event()
    stream = Reply(time.perf_counter())
    thread = threading.Thread(target=target.chat, args=(messages, 4000, logit_bias, stream, stop))
    thread.start()
    while len(stream.stamps) < 10:
        time.sleep(0.01)
    sent = time.perf_counter()
    asked = target.chat(**other)
    done = time.perf_counter()
    stop.set()
    thread.join()
    stamps = [t for t in stream.stamps if sent <= t <= done]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return max(gaps, default=done - sent), asked.ttft


def unload(target: Target, model: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
    body = json.dumps({"model": model})
    conn.request("POST", "/v1/models/unload", body, {"Content-Type": "application/json"})
    conn.getresponse().read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    small = models.build(models.MODELS["7m"])
    large = models.build(models.MODELS["50m"])
    w = Workload(small, tokens=32, long_prompt=2000)
    with tempfile.TemporaryDirectory() as folder:
        shutil.copytree(large, Path(folder) / "other")
        target = Target("mlxserve", small, "--model-dir", folder)
        results: dict[str, list[float]] = {"load": [], "prefill": [], "load ttft": []}
        try:
            for _ in range(args.rounds):
                load = {"messages": w.user(20), "max_tokens": 8, "logit_bias": {}}
                asked = {**load, "model": "other"}
                gap, ttft = longest_gap_during(target, w.user(20), w.logit_bias, asked)
                results["load"].append(gap)
                results["load ttft"].append(ttft)
                unload(target, "other")
                target.settle()
                prefill = {"messages": w.user(2000), "max_tokens": 8, "logit_bias": w.logit_bias}
                gap, _ = longest_gap_during(target, w.user(20), w.logit_bias, prefill)
                results["prefill"].append(gap)
                target.settle()
        finally:
            target.stop()
    print(f"\n{args.rounds} rounds, median (min-max), seconds")
    print("| while | stream's longest gap |")
    print("|---|---|")
    for name, label in (("load", "the 50m model loads"), ("prefill", "a 2,000-token prefill")):
        values = results[name]
        print(
            f"| {label} | {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f}) |"
        )
    ttft = results["load ttft"]
    print(f"\nthe 50m model's first token, load included: {statistics.median(ttft):.2f} s")


if __name__ == "__main__":
    main()
