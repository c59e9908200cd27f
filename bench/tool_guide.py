"""What guiding tool calls under `tool_choice: "auto"` costs a reply that never calls:
the same tools request answered in text, with the guiding on (the default) and off
(`tool_call_grammar: "off"`), on one server in one run, alternating; one stream alone and
8 at once (decode tok/s and first token). Issue #62's target: >= 0.97x tok/s, the first
token no later. Greedy, end-of-text banned: both write the same tokens.

    make bench-tool-guide                           # 50m model, 5 rounds
    make bench-tool-guide ARGS="--model 7m --rounds 3"
"""

from __future__ import annotations

import argparse
import statistics

import models
from harness import Target

from bench import Workload

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]


def round_(target: Target, w: Workload, guided: bool, streams: int, tokens: int) -> dict:
    fields = {"tools": TOOLS, **({} if guided else {"tool_call_grammar": "off"})}
    requests = [(w.user(40), tokens) for _ in range(streams)]
    replies = target.chat_together(requests, w.logit_bias, fields=[fields] * streams)
    return {
        "tok/s": statistics.median(r.decode_tps for r in replies),
        "TTFT s": max(r.ttft for r in replies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="decoded per reply")
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    w = Workload(path, args.tokens, 2000)
    print(f"device {mx.default_device()}, {path.name}, {args.tokens} tokens a reply")
    target = Target("mlxserve", path, "--tool-parser", "json_tools")
    rows: dict[tuple[int, bool], list[dict]] = {}
    try:
        round_(target, w, True, 2, 16)  # warm-up: both code paths, the grammar compiled
        round_(target, w, False, 2, 16)
        for n in range(args.rounds):
            for streams in (1, 8):
                for guided in (True, False) if n % 2 == 0 else (False, True):
                    rows.setdefault((streams, guided), []).append(
                        round_(target, w, guided, streams, args.tokens)
                    )
                    target.settle()
    finally:
        target.stop()
    print(f"\n{'median over rounds':28}{'tok/s':>10}{'first token s':>16}")
    for (streams, guided), values in sorted(rows.items()):
        tps = statistics.median(v["tok/s"] for v in values)
        first = statistics.median(v["TTFT s"] for v in values)
        name = f"{streams} stream{'s' if streams > 1 else ''}, guiding {'on' if guided else 'off'}"
        print(f"  {name:26}{tps:10.1f}{first:16.3f}")
    for streams in (1, 8):
        on, off = rows[(streams, True)], rows[(streams, False)]
        ratios = [a["tok/s"] / b["tok/s"] for a, b in zip(on, off, strict=True)]
        print(
            f"{streams} at once, on/off tok/s: median {statistics.median(ratios):.3f}x "
            f"({', '.join(f'{r:.3f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
