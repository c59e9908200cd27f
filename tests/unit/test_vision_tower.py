"""A vision tower as the batch's encoder thread runs it (`engine/continuous/vision_model.py`):
a block at a time, each block's output evaluated before the next is built (evaluated
whole, a large image's tower held up the generation thread's steps: bench/vlm.py's
fairness), with the same output as mlx-vlm's own tower."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from vision_fixture import TINY_GEMMA3_VISION, TINY_QWEN35_VISION, TINY_VISION, new_model

from mlxserve.engine.continuous.vision_model import EvaluatedBlock, VisionBatchModel

PATCHES = 8  # patches a side: a grid of 8 x 8, merged 2 x 2 into 16 image tokens


def tower_input(config: dict) -> tuple[mx.array, ...]:
    """Random pixels as the family's processor lays them out."""
    mx.random.seed(1)
    if config["model_type"] == "gemma3":
        size = config["vision_config"]["image_size"]
        return (mx.random.uniform(shape=(1, size, size, 3)),)
    patch = 3 * 2 * 14 * 14  # channels x temporal x patch x patch
    return mx.random.uniform(shape=(PATCHES * PATCHES, patch)), mx.array([[1, PATCHES, PATCHES]])


@pytest.mark.parametrize("spec", [TINY_VISION, TINY_QWEN35_VISION, TINY_GEMMA3_VISION])
def test_the_tower_runs_a_block_at_a_time_with_its_own_output(spec):
    config = {**spec.config, "vocab_size": 97}
    if "text_config" in config:
        config["text_config"] = {**config["text_config"], "vocab_size": 97}
    model = new_model(config)
    mx.eval(model.parameters())
    inputs = tower_input(config)
    alone = model.vision_tower(*inputs)
    mx.eval(alone)
    VisionBatchModel(model)
    blocks = [m for m in model.vision_tower.modules() if isinstance(m, EvaluatedBlock)]
    assert blocks
    evaluated = model.vision_tower(*inputs)
    pairs = zip(tree_flatten(evaluated), tree_flatten(alone), strict=True)
    for (_, ours), (_, theirs) in pairs:
        assert (ours is None and theirs is None) or mx.array_equal(ours, theirs).item()
