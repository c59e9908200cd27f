"""Decoding speed with speculation on and off, against mlx_lm.server.

Workloads, one streamed reply each (and `--streams` at once for the batch line):
- repeating: greedy decoding of the random-weight bench model, which settles into
  repeating its own output (the best case: every draft is accepted);
- sampled: temperature 1.0 on the same model, output that repeats nothing (drafts are
  rare and rejected: the cost of speculating where it cannot help);
- with a draft model: the 7M bench model drafting for the 50M one (both servers; mlxserve
  under `--speculation auto` and `on`, and without the draft model);
- copy: the tiny-echo test fixture's conversation, a trained model writing back the
  code it was given (an agent rewriting a file); tiny, so per-step overhead dominates;
- copy JSON: the same fixture writing back a JSON record, without and with its JSON
  schema as `response_format` (a grammar row drafting; mlx_lm.server has no structured
  output and writes the record unconstrained).

Servers run from this venv, interleaved round by round; figures are decode tok/s (first
token to last), median over rounds, and ratios to mlx_lm.server. Acceptance comes from
mlxserve's /metrics.

    make bench-speculation                       # 3 rounds, 200 tokens
    make bench-speculation ARGS="--rounds 1 --tokens 100"
    make bench-speculation ARGS="--only copy"    # the fixture's copies only
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
from pathlib import Path

import models
from harness import Target

from bench import Workload

TARGETS = {
    "mlxserve on": ("mlxserve", ("--speculation", "on")),
    "mlxserve off": ("mlxserve", ("--speculation", "off")),
    "mlx_lm.server": ("mlx_lm.server", ()),
}


def accepted_share(target: Target) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
    conn.request("GET", "/metrics")
    counts = {"drafted": 0.0, "accepted": 0.0}
    for line in conn.getresponse().read().decode().splitlines():
        for outcome in counts:
            if line.startswith(f"mlxserve_speculative_{outcome}_tokens_total"):
                counts[outcome] += float(line.split()[-1])
    return f"{counts['accepted']:.0f}/{counts['drafted']:.0f} drafted tokens accepted"


def measure(workloads: dict, path: Path, rounds: int, bias: dict, servers: dict = TARGETS) -> None:
    """`workloads`: label -> (messages, max tokens, temperature, streams at once[, more
    of the request body]); `servers`: name -> (kind, flags), the last one the reference."""
    targets = {name: Target(kind, path, *flags) for name, (kind, flags) in servers.items()}
    first, *_, reference_name = servers
    speeds: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(rounds):
            for label, (messages, tokens, temperature, streams, *more) in workloads.items():
                fields = more[0] if more else None
                for name, target in targets.items():
                    if streams > 1:  # aggregate tok/s
                        requests = [(messages, tokens)] * streams
                        replies = target.chat_together(
                            requests, bias, temperature=temperature, fields=[fields] * streams
                        )
                        start = min(r.stamps[0] for r in replies)
                        end = max(r.finished for r in replies)
                        speed = sum(r.completion_tokens - 1 for r in replies) / (end - start)
                    else:
                        speed = target.chat(
                            messages, tokens, bias, temperature=temperature, fields=fields
                        ).decode_tps
                    speeds.setdefault((label, name), []).append(speed)
        for label in workloads:
            reference = statistics.median(speeds[(label, reference_name)])
            cells = []
            for name in targets:
                median = statistics.median(speeds[(label, name)])
                cells.append(f"{name} {median:6.1f} tok/s ({median / reference:4.2f}x)")
            print(f"  {label:18}" + "   ".join(cells))
        print(f"  {first}: {accepted_share(targets[first])}")
    finally:
        for target in targets.values():
            target.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--model", default="50m", choices=sorted(models.MODELS))
    parser.add_argument(
        "--only", choices=("copy",), help="only the fixture's copies (no random-weight model)"
    )
    args = parser.parse_args()

    import mlx.core as mx

    print(f"device {mx.default_device()}, {args.tokens} tokens per reply, {args.rounds} rounds")
    if args.only is None:
        random_weights(args)
    copies(args.rounds)


def random_weights(args: argparse.Namespace) -> None:
    path = models.build(models.MODELS[args.model])
    w = Workload(path, args.tokens, 0)
    prompt = w.user(200)
    print(f"\n{path.name}")
    workloads = {
        "repeating": (prompt, args.tokens, 0.0, 1),
        "sampled": (prompt, args.tokens, 1.0, 1),
        f"repeating {args.streams}x": (prompt, args.tokens, 0.0, args.streams),
        f"sampled {args.streams}x": (prompt, args.tokens, 1.0, args.streams),
    }
    measure(workloads, path, args.rounds, w.logit_bias)

    draft = models.build(models.MODELS["7m"])
    flags = ("--draft-model", str(draft), "--num-draft-tokens", "3")
    print(f"\n{path.name} with {draft.name} as its draft model (their greedy outputs differ:")
    print("drafts are mostly rejected; what this measures is batching with a draft model,")
    print("and what drafts that miss cost: auto drafts what this device's costs pay for)")
    servers = {
        "mlxserve auto": ("mlxserve", (*flags, "--speculation", "auto")),
        "mlxserve on": ("mlxserve", (*flags, "--speculation", "on")),
        "no draft model": ("mlxserve", ("--speculation", "off")),
        "mlx_lm.server": ("mlx_lm.server", flags),
    }
    drafted = {k: v for k, v in workloads.items() if k.startswith("repeating")}
    measure(drafted, path, args.rounds, w.logit_bias, servers)


def copies(rounds: int) -> None:
    """The echo fixture copying code, a JSON record, and the record under its schema."""
    fixtures = Path(__file__).parents[1] / "tests" / "fixtures"
    sys.path.insert(0, str(fixtures))
    import fixture_models
    from conversations import ECHO, ECHO_JSON, ECHO_RECORD_SCHEMA

    from mlxserve.models.demo import cache_root

    tiny = fixture_models.build(fixture_models.TINY_ECHO, cache_root() / "fixtures")
    schema = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "record", "schema": ECHO_RECORD_SCHEMA},
        }
    }
    print(f"\n{tiny.name} (the reply copies the prompt's code, or its JSON record)")
    workloads = {
        "copy": (ECHO.messages, 100, 0.0, 1),
        "copy JSON": (ECHO_JSON.messages, 150, 0.0, 1),
        "copy JSON, schema": (ECHO_JSON.messages, 150, 0.0, 1, schema),
    }
    measure(workloads, tiny, rounds, {})


if __name__ == "__main__":
    main()
