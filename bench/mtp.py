"""Decoding with a checkpoint's MTP head: accepted tokens per step, and decode speed with
drafting off, prompt lookup only, the head, and both, at 1, 4 and 16 streams, against
mlx_lm.server (which drops the head when it loads the model); and the same for tiny-chat
with an EAGLE-3 drafter and with a DFlash block drafter (tests/fixtures/eagle3_fixture.py,
dflash_fixture.py).

The models are the test fixtures that carry a head, trained with it on tiny-chat's
conversations (tests/fixtures/mtp_fixture.py): tiny-qwen35-mtp (Qwen3.5's hybrid
architecture, `mtp.*`) and tiny-glm-mtp (GLM-4.5's, DeepSeek's layout). Each stream asks
for the "story" reply (186 tokens, greedy). They are tiny (width 64), so a step costs
mostly its fixed overhead; accepted tokens per step do not depend on the device.

A second part times what drafting costs on a model of the 50M bench model's size with
an untrained head (`verify_cost`: a pass over 4 tokens plus 3 head steps, in steps of one
token), which is what "auto" decides by; and what a rejected draft costs the hybrid bench
model, whose recurrent layers keep their state at each verified position, against the
second pass over the kept tokens those states replace.

    make bench-mtp                        # 3 rounds
    make bench-mtp ARGS="--rounds 1"
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
from pathlib import Path

from harness import Target

FIXTURES = Path(__file__).parents[1] / "tests" / "fixtures"
SERVERS = {
    "off": ("mlxserve", ("--mtp", "off", "--speculation", "off")),
    "lookup": ("mlxserve", ("--mtp", "off", "--speculation", "on")),
    "MTP": ("mlxserve", ("--mtp", "on", "--speculation", "off")),
    "MTP+lookup": ("mlxserve", ("--mtp", "on", "--speculation", "on")),
    "mlx_lm.server": ("mlx_lm.server", ()),
}
STREAMS = (1, 4, 16)


def accepted_tokens(target: Target) -> float:
    """Drafted tokens the model has accepted since it loaded (mlxserve's /metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
    conn.request("GET", "/metrics")
    lines = conn.getresponse().read().decode().splitlines()
    prefix = "mlxserve_speculative_accepted_tokens_total"
    return sum(float(line.split()[-1]) for line in lines if line.startswith(prefix))


def measure(path: Path, messages: list[dict], rounds: int, servers: dict = SERVERS) -> None:
    """`servers`: name -> (kind, flags), mlx_lm.server among them (the reference)."""
    targets = {name: Target(kind, path, *flags) for name, (kind, flags) in servers.items()}
    speeds: dict[tuple[str, int], list[float]] = {}
    per_step: dict[tuple[str, int], list[float]] = {}
    try:
        for _ in range(rounds):
            for streams in STREAMS:
                for name, target in targets.items():
                    before = accepted_tokens(target) if target.kind == "mlxserve" else 0.0
                    replies = target.chat_together([(messages, 400)] * streams, {})
                    start = min(r.stamps[0] for r in replies)
                    end = max(r.finished for r in replies)
                    tokens = sum(r.completion_tokens for r in replies)
                    speeds.setdefault((name, streams), []).append(
                        sum(r.completion_tokens - 1 for r in replies) / (end - start)
                    )
                    if target.kind == "mlxserve":
                        taken = accepted_tokens(target) - before
                        per_step.setdefault((name, streams), []).append(taken / (tokens - taken))
                    target.settle()
    finally:
        for target in targets.values():
            target.stop()
    reference = "mlx_lm.server"
    print(f"  {'':12}" + "".join(f"{f'{n} stream' + ('s' if n > 1 else ''):>30}" for n in STREAMS))
    for name in servers:
        cells = []
        for streams in STREAMS:
            speed = statistics.median(speeds[(name, streams)])
            ratio = speed / statistics.median(speeds[(reference, streams)])
            accepted = per_step.get((name, streams))
            taken = f" {statistics.median(accepted):4.2f} acc/step" if accepted else " " * 14
            cells.append(f"{speed:7.1f} tok/s {ratio:4.2f}x{taken}")
        print(f"  {name:12}" + "".join(f"{c:>30}" for c in cells))


def drafting_cost() -> None:
    """verify_cost on a 50M-size GLM-layout model with an untrained head."""
    import mlx.core as mx
    import mtp_fixture
    from mlx_lm.utils import _get_classes

    from mlxserve.engine.drafters.mtp_load import FAMILIES, new_head
    from mlxserve.engine.speculation.draft_costs import verify_cost

    config = {
        **mtp_fixture.TINY_GLM_MTP.config,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "moe_intermediate_size": 384,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 8,
        "vocab_size": 49152,
    }
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    head = new_head(model, FAMILIES["glm4_moe"])
    mx.eval(model.parameters(), head.parameters())
    plain = verify_cost(model, 4, repeats=5)
    drafted = verify_cost(model, 4, head.as_model(), repeats=5)
    print(f"  a pass over 4 tokens: {plain:.2f} steps; with the head's 3 drafts: {drafted:.2f}")


def hybrid_rollback_cost(rows: int = 4, width: int = 4, kept: int = 2, repeats: int = 5) -> None:
    """What a rejected draft costs the hybrid bench model (qwen3_next, 8 layers of width
    512): a verify pass over `width` tokens per row, each row keeping `kept`, with the
    recurrent states taken from the pass's records (`recurrent_steps`), and with the second
    pass over the kept tokens that the records replace; in single-token steps."""
    import time

    import mlx.core as mx
    import models
    from mlx_lm import load
    from mlx_lm.models.cache import ArraysCache, make_prompt_cache

    from mlxserve.engine.speculation.recurrent_steps import keep, recorded, records_steps

    model, _ = load(str(models.build(models.MODELS["hybrid-50m"])))
    records_steps(model)

    def caches() -> list:
        made = make_prompt_cache(model)
        mx.eval(model(mx.zeros((rows, 64), dtype=mx.int32), cache=made))
        return made

    def timed(run) -> float:
        best = float("inf")
        for _ in range(repeats):
            cache = caches()
            start = time.perf_counter()
            run(cache)
            mx.eval([c.state for c in cache])
            best = min(best, time.perf_counter() - start)
        return best

    def step(cache) -> None:
        mx.eval(model(mx.zeros((rows, 1), dtype=mx.int32), cache=cache))

    def unrecorded(cache) -> None:
        mx.eval(model(mx.zeros((rows, width), dtype=mx.int32), cache=cache))

    def kept_from_records(cache) -> None:
        with recorded(cache, width) as steps:
            mx.eval(model(mx.zeros((rows, width), dtype=mx.int32), cache=cache))
        assert steps is not None and keep(cache, steps, [kept] * rows)

    def replayed(cache) -> None:
        before = [list(c.cache) for c in cache if isinstance(c, ArraysCache)]
        mx.eval(model(mx.zeros((rows, width), dtype=mx.int32), cache=cache))
        for c in cache:
            if isinstance(c, ArraysCache):
                c.cache = before.pop(0)
            else:
                c.trim(width)
        mx.eval(model(mx.zeros((rows, kept), dtype=mx.int32), cache=cache))

    one = timed(step)
    print(
        f"  {rows} rows, a pass over {width} tokens ({timed(unrecorded) / one:.2f} steps "
        f"unrecorded), each row keeping {kept}: {timed(kept_from_records) / one:.2f} steps "
        f"with the recorded states, {timed(replayed) / one:.2f} with a second pass"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import mlx.core as mx

    sys.path.insert(0, str(FIXTURES))
    import conversations
    import dflash_fixture
    import eagle3_fixture
    import fixture_models
    import mtp_fixture

    from mlxserve.models.demo import cache_root

    print(f"device {mx.default_device()}, {args.rounds} rounds, median decode tok/s (all streams)")
    story = conversations.BY_NAME["story"].messages
    for spec in (mtp_fixture.TINY_QWEN35_MTP, mtp_fixture.TINY_GLM_MTP):
        path = mtp_fixture.build(spec, cache_root() / "fixtures")
        print(f"\n{spec.name}")
        measure(path, story, args.rounds)
    tiny = fixture_models.build(fixture_models.TINY_CHAT, cache_root() / "fixtures")
    eagle = eagle3_fixture.build(tiny, cache_root() / "fixtures")
    dflash = dflash_fixture.build(tiny, cache_root() / "fixtures")
    print(f"\n{tiny.name} with {eagle.name} or {dflash.name} as its --draft-model")
    drafters = {
        "off": SERVERS["off"],
        "EAGLE-3": ("mlxserve", ("--draft-model", str(eagle), "--speculation", "off")),
        "DFlash": ("mlxserve", ("--draft-model", str(dflash), "--speculation", "off")),
        "mlx_lm.server": SERVERS["mlx_lm.server"],
    }
    measure(tiny, story, args.rounds, drafters)
    print("\nWhat drafting costs here (glm4_moe, 8 layers of width 512, 49k vocabulary)")
    drafting_cost()
    print("\nWhat a rejected draft costs a hybrid model (qwen3_next, 8 layers of width 512)")
    hybrid_rollback_cost()


if __name__ == "__main__":
    main()
