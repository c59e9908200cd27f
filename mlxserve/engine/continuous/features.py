"""Which row features a model's continuous batch has (see `row_feature.py`): a new kind of
row variation is a module of its own and one line here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlxserve.engine.continuous.adapter_rows import AdapterFeature
from mlxserve.engine.continuous.batch_model import batch_model
from mlxserve.engine.continuous.drafting import DraftingFeature
from mlxserve.engine.continuous.in_lockstep import LockstepFeature
from mlxserve.engine.continuous.kv_quantization import KVQuantizationFeature
from mlxserve.engine.continuous.row_feature import RowFeature
from mlxserve.engine.memory.loader import LoadedModel


@dataclass(frozen=True)
class RowFeatures:
    model: Any  # what the batch calls for logits (its caches first in a row's list)
    drafting: DraftingFeature  # also what mlx-lm's generator calls (`called`)
    lockstep: LockstepFeature | None
    # in the order their hooks run (the prompt-cache key: KV layout, head, adapters)
    features: list[RowFeature]
    worst: Callable[[float], float]  # the largest of every rank's value (alone: the value)


def row_features(
    loaded: LoadedModel,
    limits: Any,
    draft_tokens: int,
    worst: Callable[[float], float] | None,
    wake: Callable[[], None],
    running: Callable[[], bool],
) -> RowFeatures:
    """`limits`: the batch's ContinuousBatchLimits; `draft_tokens`: drafted per step by the
    model's draft model, if it has one; `worst`: where ranks run the batch in lockstep, the
    largest of every rank's value of a measurement (see engine.loop.loop_step); `wake`:
    wakes the generation loop, waiting for work, when a prompt's images are through the
    vision encoder; `running`: whether rows run."""
    agreed = worst or (lambda value: value)
    # what the batch calls; a text model's rows each under their own adapter (or none)
    model = batch_model(loaded.model, loaded.spec.vision)
    adapters = loaded.adapters if worst is None else None  # not across ranks
    adapter_rows = AdapterFeature(model, adapters, loaded.spec.path.name)
    model = adapter_rows.model
    kv = KVQuantizationFeature(limits.kv_bits, limits.kv_group_size) if limits.kv_bits else None
    drafting = DraftingFeature(
        loaded, model, limits, draft_tokens, agreed, worst is not None, adapters
    )
    vision = None
    if loaded.spec.vision:
        from mlxserve.engine.continuous.vision_rows import VisionFeature  # see batch_model.py

        vision = VisionFeature(model, wake, agreed, running, hidden=drafting.head is not None)
    lockstep = LockstepFeature() if worst is not None else None
    every: list[RowFeature | None] = [vision, kv, drafting, adapter_rows, lockstep]
    features = [f for f in every if f is not None]
    return RowFeatures(model, drafting, lockstep, features, agreed)
