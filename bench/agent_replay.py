"""An agent's conversation replayed turn by turn: a long system prompt, then turns that
each add a short user message, the reply going back into the history as the client
received it; then a new conversation with the same system prompt ("new"). Per turn: the
share of the prompt continued from the prompt cache, and the time to first token; on a standard (qwen3) and a hybrid (qwen3_next: gated delta-net
layers whose state cannot be trimmed back) bench model, mlxserve against mlx_lm.server.

    .venv/bin/python bench/agent_replay.py                  # 6 turns, 1,400-token system
    .venv/bin/python bench/agent_replay.py --turns 10
"""

from __future__ import annotations

import argparse

import models
from harness import Target

from bench import Workload

MODELS = ("50m", "hybrid-50m")


def replay(target: Target, w: Workload, turns: int, system_tokens: int) -> list[tuple]:
    """(prompt tokens, cached tokens, TTFT s) per turn, then for the first turn of a new
    conversation with the same system prompt (an agent's next session)."""
    system = {"role": "system", "content": w.text(system_tokens)}
    messages = [system]
    rows = []
    for turn in range(turns + 1):
        if turn == turns:
            messages = [system]
        messages.append({"role": "user", "content": f"Step {turn}: " + w.text(40)})
        reply = target.chat(messages, 32, w.logit_bias)
        rows.append((len(w.prompt_ids(messages)), reply.cached_tokens, reply.ttft))
        messages.append({"role": "assistant", "content": reply.text})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system", type=int, default=1400, help="system prompt tokens")
    args = parser.parse_args()

    import mlx.core as mx

    print(f"device {mx.default_device()}, {args.turns} turns, {args.system}-token system prompt")
    for name in MODELS:
        path = models.build(models.MODELS[name])
        w = Workload(path, 32, 2000)
        print(f"\n{path.name}: turn, prompt tokens, cached share, TTFT s")
        results = {}
        for kind in ("mlxserve", "mlx_lm.server"):
            target = Target(kind, path)
            try:
                results[kind] = replay(target, w, args.turns, args.system)
            finally:
                target.stop()
        for turn in range(args.turns + 1):
            line = f"  {turn + 1:>2}" if turn < args.turns else "  new"
            for kind, rows in results.items():
                prompt, cached, ttft = rows[turn]
                line += f"   {kind:14}{prompt:6} {cached / prompt:6.1%} {ttft:6.2f}"
            print(line)


if __name__ == "__main__":
    main()
