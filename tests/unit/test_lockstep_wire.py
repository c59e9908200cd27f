"""A loop step as rank 0 publishes it and another rank rebuilds it: the same prompts,
parameters, checkpoints, choices and a vision prompt's prepared images, a grammar compiled again from its source, the
cancellations naming the rebuilt jobs, the token hash and the stop flag; a line that
closes without a last step stops the follower as lost; and a following rank replays the
steps rank 0 published while it started, before its model loaded."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxserve.config import ModelSettings, SamplingDefaults, ServerConfig
from mlxserve.distributed.lockstep import Follower, Leader
from mlxserve.distributed.world import World
from mlxserve.engine.generation.jobs import GenerationJob, PromptImages
from mlxserve.engine.generation.reasoning_budget import ReasoningBudget
from mlxserve.engine.generation.sampling import GenerationParams
from mlxserve.engine.loop.loop_step import LoopStep
from mlxserve.models.catalog import ModelCatalog
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.request import Sampling
from mlxserve.server import idle_worker, load_served, start_worker
from mlxserve.structured import lark
from mlxserve.structured.matcher import Grammar


class Line:
    """Both ends of the control line in one process: what the hub sends, the link reads."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.last: list[bool] = []

    def send(self, payload: bytes, last: bool = False) -> None:
        self.messages.append(payload)
        self.last.append(last)

    def receive(self) -> bytes | None:
        return self.messages.pop(0) if self.messages else None


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def test_a_step_crosses_the_line_whole(tokenizer):
    spec = ModelSpec(Path("/models/served"))
    line = Line()
    leader = Leader(world=None, hub=line, on_failure=print)  # type: ignore[arg-type]
    follower = Follower(None, line, spec, tokenizer, print)  # type: ignore[arg-type]
    grammar = Grammar(tokenizer, lark.grammar(lark.json_schema({"type": "integer"})))
    params = GenerationParams(
        max_tokens=9,
        sampling=Sampling(temperature=0.7, seed=3, logit_bias={5: -2.0}).over(SamplingDefaults()),
        stop=("\n",),
        logprobs=2,
        grammar=grammar,
        reasoning_budget=ReasoningBudget(4, (1,), (2,), False),
    )
    first = [GenerationJob(spec, [1, 2, 3], params, index=i, checkpoints=(2,)) for i in (0, 1)]
    pixels = mx.arange(12, dtype=mx.float32).reshape(1, 3, 2, 2)
    images = PromptImages(
        pixels, {"image_grid_thw": mx.array([[1, 2, 2]])}, None, [4, -9, -9], ((1, 3),)
    )
    second = [GenerationJob(spec, [4, 7, 7], replace(params, grammar=None), images=images)]

    leader.publish(LoopStep(1.5, [first, second], [], trace=77))
    step = follower.receive()
    assert (step.now, step.stop, step.trace, step.cancelled) == (1.5, False, 77, [])
    rebuilt = [job for request in step.arrived for job in request]
    assert [len(r) for r in step.arrived] == [2, 1]
    for original, copy in zip([*first, *second], rebuilt, strict=True):
        assert (copy.prompt, copy.index, copy.checkpoints) == (
            original.prompt,
            original.index,
            original.checkpoints,
        )
        assert replace(copy.params, grammar=None) == replace(original.params, grammar=None)
        assert copy.cancel_at_step and copy.spec == spec
    compiled = rebuilt[0].params.grammar
    assert compiled is not None and compiled is not grammar and compiled.lark == grammar.lark
    assert rebuilt[2].params.grammar is None
    carried = rebuilt[2].images  # every rank encodes a vision prompt's images itself
    assert carried is not None and rebuilt[0].images is None
    assert (carried.cache_tokens, carried.spans) == ([4, -9, -9], ((1, 3),))
    assert mx.array_equal(carried.pixel_values, pixels)
    assert carried.extra["image_grid_thw"].tolist() == [[1, 2, 2]]

    leader.publish(LoopStep(2.0, [], [first[1]], stop=True, trace=78))
    assert line.last == [False, True]  # the ranks leave after the last step: no fault
    step = follower.receive()
    assert step.cancelled == [rebuilt[1]] and step.stop and not follower.lost

    assert follower.receive().stop and follower.lost  # the line closed: rank 0 is gone


def test_a_follower_replays_the_steps_rank_0_published_before_its_model_loaded(
    tiny_model, tokenizer
):
    """Rank 0 publishes a step each time its loop wakes, start-up calls included; its main
    thread slow between two of them (a loaded machine), a step goes out before its model
    has loaded. The other rank, which follows once its own model is loaded, must not read
    that step's token hash as a divergence. (Both ranks in one process, a group of one.)"""
    config = ServerConfig(models=(ModelSettings(str(tiny_model)),), speculation="off")
    world, line, failures = World(mx.distributed.init(), 0, 1), Line(), []
    budget = 4 * 2**30
    catalog = ModelCatalog(config, [tiny_model])
    leader = idle_worker(config, catalog, None, budget, Leader(world, line, failures.append))
    deadline = time.monotonic() + 10
    while not line.messages and time.monotonic() < deadline:  # past the loop's gathering
        time.sleep(0.01)
    assert len(line.messages) == 1  # a step out before the model is loaded
    load_served(leader)
    leader.stop()  # its last step goes out too
    assert len(line.messages) >= 2 and line.last[-1]

    catalog = ModelCatalog(config, [tiny_model])
    follower = Follower(world, line, catalog.default, tokenizer, failures.append)
    worker = start_worker(config, catalog, None, budget, follower)
    worker.follow()
    worker.wait()
    assert failures == [] and not follower.lost
    assert line.messages == []
