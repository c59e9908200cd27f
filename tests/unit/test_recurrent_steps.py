"""A hybrid model's verify passes (`engine/recurrent_steps.py`): each row of a batch keeps
its own number of a pass's positions, and its gated delta-net layers take the state
recorded after its last kept token (no second pass). Over random runs of passes on
random-weight Qwen3-Next and Qwen3.5 models, left-padded rows of different lengths, each
row's next logits equal those of the row alone fed exactly the tokens it kept."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from hybrid_fixture import TINY_HYBRID
from mlx_lm.models.cache import ArraysCache, make_prompt_cache
from mlx_lm.utils import _get_classes
from mtp_fixture import TINY_QWEN35_MTP

from mlxserve.engine.recurrent_steps import keep, recorded, records_steps
from mlxserve.engine.speculative import roll_back

VOCAB = 97
CONFIGS = {"qwen3_next": TINY_HYBRID.config, "qwen3_5": TINY_QWEN35_MTP.config}


def model_of(model_type: str):
    config = {**CONFIGS[model_type], "vocab_size": VOCAB}
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model


def batch_caches(model, prompts: list[list[int]]) -> list:
    """The rows' caches after their prompts, merged as the batch merges them (left padding)."""
    rows = []
    for prompt in prompts:
        caches = make_prompt_cache(model)
        model(mx.array([prompt]), cache=caches)
        rows.append(caches)
    return [type(layer[0]).merge(list(layer)) for layer in zip(*rows, strict=True)]


def alone(model, tokens: list[int]) -> mx.array:
    """The last logits of a row fed `tokens` on its own."""
    return model(mx.array([tokens]), cache=make_prompt_cache(model))[0, -1]


def drift(model, seed: int, record: bool = True) -> float:
    """The largest gap between a batched row's next logits and its logits alone, after
    a random run of verify passes (each row keeping 1 to all of a pass's positions)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 9, 6)]
    caches = batch_caches(model, prompts)
    histories = [list(p) for p in prompts]
    for _ in range(4):
        width = rng.randint(2, 6)
        passed = [[rng.randrange(VOCAB) for _ in range(width)] for _ in prompts]
        with recorded(caches) as steps:
            model(mx.array(passed), cache=caches)
        assert steps is not None
        kept = [rng.randint(1, width) for _ in prompts]
        assert keep(caches, steps, kept) is record
        roll_back([c for c in caches if not isinstance(c, ArraysCache)], [width - n for n in kept])
        for history, tokens, n in zip(histories, passed, kept, strict=True):
            history.extend(tokens[:n])
    probe = [[rng.randrange(VOCAB)] for _ in prompts]
    batched = model(mx.array(probe), cache=caches)[:, -1]
    return max(
        mx.abs(batched[i] - alone(model, history + probe[i])).max().item()
        for i, history in enumerate(histories)
    )


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_each_row_keeps_the_state_after_its_last_kept_token(model_type):
    model = model_of(model_type)
    assert records_steps(model)
    for seed in range(6):
        assert drift(model, seed) < 1e-4, seed


def test_a_pass_whose_convolution_was_not_shown_is_left_for_a_replay():
    """Without `records_steps` the convolution's input is not recorded: `keep` declines
    (the batch then runs the kept tokens again), and the states it would have needed are
    what the pass left, far from each row's own."""
    model = model_of("qwen3_next")
    assert drift(model, 0, record=False) > 0.1
