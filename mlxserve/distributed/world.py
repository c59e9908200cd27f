"""The group of ranks mlx.launch started, values every rank must share, and how a model
is split across the ranks."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from mlxserve.distributed.tensor_split import (
    NotSplittable,
    is_vision_language,
    library_shard,
    split_vision_language_model,
)
from mlxserve.values import as_float, as_int

MODES = ("tensor", "pipeline")


@dataclass(frozen=True)
class World:
    group: Any  # mx.distributed.Group
    rank: int
    size: int

    @property
    def leader(self) -> bool:
        return self.rank == 0


def join_world() -> World | None:
    """The group this process was launched into; None when it runs alone."""
    group = mx.distributed.init()
    if group.size() == 1:
        return None
    return World(group, group.rank(), group.size())


def share(world: World, value: object = None) -> Any:
    """Rank 0's `value` on every rank (the others pass nothing). Two collectives: every
    rank calls it at the same point; start-up and session opening only."""
    data = np.frombuffer(pickle.dumps(value), dtype=np.uint8) if world.leader else None
    size = _sum(world, mx.array(len(data) if data is not None else 0, dtype=mx.int32))
    buffer = mx.array(data) if data is not None else mx.zeros(as_int(size), dtype=mx.uint8)
    return pickle.loads(bytes(np.array(_sum(world, buffer))))


def largest(world: World, value: float) -> float:
    """The largest of every rank's `value` (one collective: every rank calls it)."""
    total = mx.distributed.all_max(
        mx.array(value, dtype=mx.float32), group=world.group, stream=mx.cpu
    )
    return as_float(total)


def _sum(world: World, array: mx.array) -> mx.array:
    total = mx.distributed.all_sum(array, group=world.group, stream=mx.cpu)
    mx.eval(total)
    return total


def split_model(model: Any, world: World, mode: str | None) -> str:
    """Split `model` across the ranks, before its weights are read, so that each rank
    reads only its own share: `tensor` (every layer's heads and MLP split: mlx-lm's
    `shard`, mlx-vlm's where it has one, our own for the other vision-language models)
    or `pipeline` (each rank a run of whole layers: mlx-lm's `pipeline`, text models
    only); None: tensor where the architecture supports it. Returns the mode used."""
    splits = {m: split for m, split in _splits(model).items() if split is not None}
    supported = [m for m in MODES if m in splits]
    kind = getattr(model, "model_type", type(model).__module__.rsplit(".", 1)[-1])
    library = "mlx-vlm" if is_vision_language(model) else "mlx-lm"
    if mode is None and supported:
        mode = supported[0]
    if mode is None or mode not in supported:
        wanted = f"{mode} parallelism" if mode else "splitting"
        can = " or ".join(supported) or "neither"
        raise ValueError(
            f"{library}'s {kind} architecture does not support {wanted} across machines "
            f"(it supports {can})."
        )
    try:
        splits[mode](world.group)
    except NotSplittable as e:
        raise ValueError(
            f"{library}'s {kind} architecture cannot be split across machines: {e}."
        ) from e
    return mode


def _splits(model: Any) -> dict[str, Callable[[Any], None] | None]:
    own = getattr(model, "shard", None)
    library = functools.partial(library_shard, model, own) if own is not None else None
    if is_vision_language(model):  # the vision tower stays whole on every rank
        return {"tensor": library or functools.partial(split_vision_language_model, model)}
    return {
        "tensor": library,
        "pipeline": getattr(getattr(model, "model", None), "pipeline", None),
    }
