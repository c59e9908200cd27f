"""Batch caches taken back after a speculative step, each row keeping its own number of
the step's positions, on random-weight models with left-padded rows of different lengths
(longer than a sliding window): after random runs of steps, each row's next logits equal
those of the row alone fed exactly the tokens it kept.

- A hybrid model's verify pass (`engine/speculation/recurrent_steps.py`, Qwen3-Next and Qwen3.5, and
  mlx-vlm's Qwen3.5 as a vision checkpoint's language model in the batch): its gated
  delta-net layers take the state recorded after each row's last kept token, with no
  second pass; or, past the records' memory bound, go back and take the kept tokens again.
- A draft model's chain (`engine/speculation/rewind.py`: Gemma 3 with a sliding window of 8, Qwen3.5,
  Qwen3): written a token at a time (a wrapped window in place, recurrent layers into their
  state), its caches go back to where the chain began and take each row's kept tokens
  again.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import mlx.core as mx
import pytest
from fixture_models import TINY_CHAT
from hybrid_fixture import TINY_HYBRID, TINY_SLIDING
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes
from mtp_fixture import TINY_QWEN35_MTP
from vision_fixture import TINY_QWEN35_VISION, new_model

from mlxserve.engine.continuous.vision_model import VisionBatchModel
from mlxserve.engine.speculation import draft_costs, recurrent_steps
from mlxserve.engine.speculation.recurrent_steps import keep, recorded, records_steps
from mlxserve.engine.speculation.rewind import is_recurrent, rewind, roll_back, snapshot

VOCAB = 97
CONFIGS = {
    "qwen3_next": TINY_HYBRID.config,
    "qwen3_5": TINY_QWEN35_MTP.config,
    "gemma3_text": {**TINY_SLIDING.config, "sliding_window": 8},
    "qwen3": TINY_CHAT.config,
}
# A step: (model, batch caches, each row's tokens, rng) -> how many each row keeps.
Step = Callable[[object, list, list[list[int]], random.Random], list[int]]


def model_of(model_type: str):
    config = {**CONFIGS[model_type], "vocab_size": VOCAB}
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model


def vision_model_of() -> VisionBatchModel:
    """mlx-vlm's Qwen3.5 vision checkpoint (random weights), as the batch calls it."""
    config = dict(TINY_QWEN35_VISION.config)
    config["text_config"] = {**config["text_config"], "vocab_size": VOCAB}
    model = new_model(config)
    mx.eval(model.parameters())
    return VisionBatchModel(model)


def drift(model, seed: int, step: Step) -> float:
    """The largest gap between a batched row's next logits and its logits alone, after six
    random steps (each row's tokens random, 2 to 6 of them)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (11, 19, 14)]
    rows = []
    for prompt in prompts:
        caches = make_prompt_cache(model)
        model(mx.array([prompt]), cache=caches)
        rows.append(caches)
    caches = [type(layer[0]).merge(list(layer)) for layer in zip(*rows, strict=True)]
    histories = [list(p) for p in prompts]
    for _ in range(6):
        width = rng.randint(2, 6)
        tokens = [[rng.randrange(VOCAB) for _ in range(width)] for _ in prompts]
        kept = step(model, caches, tokens, rng)
        for history, row, n in zip(histories, tokens, kept, strict=True):
            history.extend(row[:n])
    probe = [[rng.randrange(VOCAB)] for _ in prompts]
    batched = model(mx.array(probe), cache=caches)[:, -1]
    return max(
        mx.abs(batched[i] - model(mx.array([h + probe[i]]), cache=make_prompt_cache(model))[0, -1])
        .max()
        .item()
        for i, h in enumerate(histories)
    )


def verify_pass(model, caches, tokens, rng, record: bool = True) -> list[int]:
    """One pass over every row's tokens, then each row keeps 1 to all of them."""
    width = len(tokens[0])
    with recorded(caches, width) as steps:
        model(mx.array(tokens), cache=caches)
    assert steps is not None
    kept = [rng.randint(1, width) for _ in tokens]
    assert keep(caches, steps, kept) is record
    roll_back([c for c in caches if not is_recurrent(c)], [width - n for n in kept])
    return kept


def replayed_pass(model, caches, tokens, rng) -> list[int]:
    """A pass not recorded (see RECORDED_MAX_BYTES), then, as SpeculativeBatch._replay:
    the caches go back to where it began and each row takes its kept tokens again."""
    width = len(tokens[0])
    with recorded(caches, width) as steps:
        model(mx.array(tokens), cache=caches)
    assert steps is not None
    kept = [rng.randint(1, width) for _ in tokens]
    assert not keep(caches, steps, kept)
    rows = [row[:n] for row, n in zip(tokens, kept, strict=True)]
    rewind(model, caches, steps.snapshots, width, rows)
    return kept


def draft_chain(model, caches, tokens, rng) -> list[int]:
    """As DraftModelBatch.next: two tokens, then one a call (or one a call throughout: a
    wrapped window then writes in place from the first token); each row keeps 1 to all."""
    width = len(tokens[0])
    snapshots = [snapshot(c) for c in caches]
    first = rng.choice((1, 2))
    model(mx.array([row[:first] for row in tokens]), cache=caches)
    for t in range(first, width):
        model(mx.array([row[t : t + 1] for row in tokens]), cache=caches)
    kept = [rng.randint(1, width) for _ in tokens]
    rewind(model, caches, snapshots, width, [row[:n] for row, n in zip(tokens, kept, strict=True)])
    return kept


@pytest.mark.parametrize("model_type", ["qwen3_next", "qwen3_5"])
def test_a_verify_pass_keeps_each_rows_state_after_its_last_kept_token(model_type):
    model = model_of(model_type)
    assert records_steps(model)
    for seed in range(6):
        assert drift(model, seed, verify_pass) < 1e-4, seed


def test_a_vision_models_verify_pass_keeps_each_rows_state_after_its_last_kept_token():
    """mlx-vlm's layers record through their caches' transactions, in one batched call
    (its model would otherwise run left-padded rows one at a time, on new cache objects)."""
    model = vision_model_of()
    for seed in range(6):
        assert drift(model, seed, verify_pass) < 1e-4, seed


def test_a_vision_models_pass_past_the_memory_bound_is_taken_again(monkeypatch):
    monkeypatch.setattr(recurrent_steps, "RECORDED_MAX_BYTES", 0)
    model = vision_model_of()
    for seed in range(3):
        assert drift(model, seed, replayed_pass) < 1e-4, seed


@pytest.mark.parametrize("vision", [False, True])
def test_a_verify_pass_is_timed_as_recorded(monkeypatch, vision):
    """`draft_costs.verify_cost` times a pass over several tokens as the batch runs it:
    a hybrid model's recurrent layers recording every position (which costs otherwise:
    mlx-vlm's Qwen3.5 on this CPU, 1.5 steps recorded against 7 for its plain pass)."""
    model = vision_model_of() if vision else model_of("qwen3_5")
    if not vision:  # mlx-vlm's layers record through their caches
        records_steps(model)
    timed = []

    def spied(caches, steps, kept):
        timed.append((bool(steps.transactions or steps.layers), kept))
        return keep(caches, steps, kept)

    monkeypatch.setattr(draft_costs, "keep", spied)
    draft_costs.verify_cost(model, 4)
    assert timed == [(True, [4]), (True, [4])]  # twice: the best of two timings


def test_a_pass_whose_convolution_was_not_shown_is_left_for_a_replay():
    """Without `records_steps` the convolution's input is not recorded: `keep` declines
    (the batch then runs the kept tokens again), and the states it would have needed are
    what the pass left, far from each row's own."""
    model = model_of("qwen3_next")

    def unrecorded(model, caches, tokens, rng) -> list[int]:
        return verify_pass(model, caches, tokens, rng, record=False)

    assert drift(model, 0, unrecorded) > 0.1


def test_a_pass_whose_states_would_hold_too_much_is_left_for_a_replay(monkeypatch):
    """Past RECORDED_MAX_BYTES (the states of every position of every row) the pass is
    not recorded: `keep` declines, and the batch runs the kept tokens again."""
    model = model_of("qwen3_next")
    assert records_steps(model)
    monkeypatch.setattr(recurrent_steps, "RECORDED_MAX_BYTES", 0)

    def unrecorded(model, caches, tokens, rng) -> list[int]:
        return verify_pass(model, caches, tokens, rng, record=False)

    assert drift(model, 0, unrecorded) > 0.1


@pytest.mark.parametrize("model_type", ["gemma3_text", "qwen3_5", "qwen3"])
def test_a_draft_chain_goes_back_to_each_rows_kept_tokens(model_type):
    model = model_of(model_type)
    for seed in range(5):
        assert drift(model, seed, draft_chain) < 1e-4, seed
