"""Ollama's API costs nothing over OpenAI's: the same concurrent streams through /api/chat
and through /v1/chat/completions of one server, in one run (aggregate tok/s and the
slowest first token), and the same requests one at a time, as Ollama's MLX engine serves
them.

Greedy, no end-of-text bias (Ollama has no logit_bias): both dialects generate the same
tokens, each counted from its own reply (eval_count; usage).

    make bench-ollama                          # 50m model, 3 rounds, 8 streams
    make bench-ollama ARGS="--model 7m --rounds 1"
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time

import models
from harness import Reply, Target, print_medians

from bench import Workload


def ollama_chat(target: Target, messages: list[dict], tokens: int) -> Reply:
    """One /api/chat stream, its NDJSON lines read as they come."""
    body = {
        "model": target.model,
        "messages": messages,
        "options": {"num_predict": tokens, "temperature": 0},
    }
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=900)
    reply = Reply(time.perf_counter())
    conn.request("POST", "/api/chat", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"/api/chat: HTTP {response.status} {response.read()[:300]}")
    for raw in response:
        line = json.loads(raw)
        if line["message"]["content"]:
            reply.stamps.append(time.perf_counter())
            reply.text += line["message"]["content"]
        if line["done"]:
            reply.completion_tokens = line["eval_count"]
    conn.close()
    return reply


def openai_chat(target: Target, messages: list[dict], tokens: int) -> Reply:
    return target.chat(messages, tokens, {})


def together(target: Target, send, prompts: list[list[dict]], tokens: int) -> dict:
    """Every prompt at once, each on its own connection."""
    replies: list[Reply] = [Reply(0.0)] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        barrier.wait()
        replies[i] = send(target, prompts[i], tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _figures(replies, start)


def one_at_a_time(target: Target, send, prompts: list[list[dict]], tokens: int) -> dict:
    start = time.perf_counter()
    return _figures([send(target, prompt, tokens) for prompt in prompts], start)


def _figures(replies: list[Reply], start: float) -> dict:
    wall = max(r.finished for r in replies) - start
    return {
        "tok/s": sum(r.completion_tokens for r in replies) / wall,
        "slowest TTFT s": max(r.stamps[0] for r in replies) - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128, help="decoded per reply")
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    w = Workload(path, args.tokens, 2000)
    print(f"device {mx.default_device()}, {path.name}, {args.streams} streams")
    dialects = {"/api/chat": ollama_chat, "/v1/chat/completions": openai_chat}
    rows: dict[str, list[dict]] = {f"{name}, {args.streams} at once": [] for name in dialects}
    rows |= {f"{name}, one at a time": [] for name in dialects}
    target = Target("mlxserve", path)
    try:
        together(target, ollama_chat, [w.user(20) for _ in range(2)], 8)  # warm-up
        for round_ in range(args.rounds):
            order = list(dialects.items())
            for name, send in order if round_ % 2 == 0 else order[::-1]:
                prompts = [w.user(20) for _ in range(args.streams)]
                rows[f"{name}, {args.streams} at once"].append(
                    together(target, send, prompts, args.tokens)
                )
                target.settle()
                prompts = [w.user(20) for _ in range(args.streams)]
                rows[f"{name}, one at a time"].append(
                    one_at_a_time(target, send, prompts, args.tokens)
                )
                target.settle()
    finally:
        target.stop()
    print_medians(rows, "slowest TTFT s")
    at_once = [rows[f"{name}, {args.streams} at once"] for name in dialects]
    ratios = [o["tok/s"] / v["tok/s"] for o, v in zip(*at_once, strict=True)]
    print(f"\n/api/chat against /v1/chat/completions, {args.streams} at once: "
          f"{', '.join(f'{r:.3f}x' for r in ratios)} (each round)")  # fmt: skip


if __name__ == "__main__":
    main()
