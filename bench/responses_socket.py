"""A Codex-style session over the Responses API, on one server: over HTTP each turn sends
the whole conversation again (`store: false`, as Codex does without a socket); over a
WebSocket each turn sends only its new message with `previous_response_id`. Per turn: the
time from sending to the response's last event, and the share of the prompt continued from
the prompt cache; the median of turns 2.. as a ratio socket / HTTP.

    .venv/bin/python bench/responses_socket.py              # 8 turns, 4,000-token instructions
    .venv/bin/python bench/responses_socket.py --turns 12 --instructions 8000
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time

import models
from harness import Target
from websockets.sync.client import connect

from bench import Workload

OUTPUT_TOKENS = 32
ENDS = ("response.completed", "response.incomplete", "response.failed")
TOOL = {
    "type": "function",
    "name": "shell",
    "description": "Run a shell command in the repository and return its output.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"],
    },
}


def request(instructions: str, items: list[dict], **extra) -> dict:
    return {
        "model": "default",
        "instructions": instructions,
        "tools": [TOOL],
        "input": items,
        "store": False,
        "max_output_tokens": OUTPUT_TOKENS,
        **extra,
    }


def over_http(port: int, instructions: str, messages: list[str]) -> list[tuple[float, dict]]:
    """(seconds, usage) per turn, each turn's input the whole conversation so far."""
    rows, items = [], []
    for message in messages:
        items.append({"role": "user", "content": message})
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        started = time.perf_counter()
        conn.request("POST", "/v1/responses", json.dumps(request(instructions, items)))
        response = json.loads(conn.getresponse().read())
        rows.append((time.perf_counter() - started, response["usage"]))
        items += response["output"]
    return rows


def over_socket(port: int, instructions: str, messages: list[str]) -> list[tuple[float, dict]]:
    """(seconds, usage) per turn, each turn its new message and the last response's id."""
    rows, previous = [], None
    with connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None) as ws:
        for message in messages:
            extra = {"previous_response_id": previous} if previous else {}
            body = request(instructions, [{"role": "user", "content": message}], **extra)
            started = time.perf_counter()
            ws.send(json.dumps({"type": "response.create", **body}))
            while (event := json.loads(ws.recv()))["type"] not in ENDS:
                assert event["type"] != "error", event
            rows.append((time.perf_counter() - started, event["response"]["usage"]))
            previous = event["response"]["id"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--instructions", type=int, default=4000, help="instruction tokens")
    parser.add_argument("--model", default="50m", choices=sorted(models.MODELS))
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    w = Workload(path, OUTPUT_TOKENS, 2000)
    print(f"device {mx.default_device()}, {path.name}, {args.turns} turns, ", end="")
    print(f"{args.instructions}-token instructions")
    target = Target("mlxserve", path)
    try:
        results = {}
        for name, session in (("http", over_http), ("socket", over_socket)):
            instructions = w.text(args.instructions)  # each session its own: no shared cache
            messages = [f"Step {turn}: " + w.text(60) for turn in range(args.turns)]
            results[name] = session(target.port, instructions, messages)
            target.settle()
    finally:
        target.stop()
    print("turn   http s  cached     socket s  cached")
    for turn, (http_row, socket_row) in enumerate(zip(*results.values(), strict=True)):
        line = f"{turn + 1:>4}"
        for seconds, usage in (http_row, socket_row):
            share = usage["input_tokens_details"]["cached_tokens"] / usage["input_tokens"]
            line += f"   {seconds:7.3f}  {share:6.1%}"
        print(line)
    medians = {name: statistics.median(s for s, _ in rows[1:]) for name, rows in results.items()}
    print(f"median of turns 2..{args.turns}: http {medians['http']:.3f} s, ", end="")
    print(
        f"socket {medians['socket']:.3f} s, socket/http {medians['socket'] / medians['http']:.2f}x"
    )


if __name__ == "__main__":
    main()
