"""Tensor parallelism where mlxserve does it or checks it.

- The language model of a vision-language checkpoint whose mlx-vlm class has no `shard`
  of its own (Qwen2/2.5-VL, Qwen3-VL, Qwen3.5/3.6, Gemma 3, Mistral Small 3.x and the
  like): each decoder layer's attention heads (or Qwen3.5's linear-attention heads) and
  MLP are split across the ranks the way mlx-lm splits its text models. The vision tower,
  the embeddings, the output layer and an MTP head stay whole on every rank: they see the
  same input everywhere and give the same output. The split reads the modules' shapes,
  not their classes (mlx-vlm's classes are its own, so mlx-lm's `shard` cannot be
  reused): an attention or MLP that projects with anything else (experts) is refused
  before any weight is read; what else a layer holds (norms, Gemma 4's per-layer input
  gates) runs whole on every rank, on the whole hidden state each rank has.
- A library's own `shard` (mlx-lm's, mlx-vlm's) divides each layer's head counts by the
  number of ranks whether they divide or not: heads that do not (3 over 2 ranks, or
  1 key-value head over 2, where the architecture does not repeat it) are refused rather
  than served as garbage or as an empty KV cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import shard_inplace, shard_linear

log = logging.getLogger(__name__)

# The attributes mlx-vlm's attention classes keep their head counts in, and what they count
_HEAD_COUNTS = {
    "n_heads": "attention heads",
    "n_kv_heads": "key-value heads",
    "num_attention_heads": "attention heads",
    "num_key_value_heads": "key-value heads",
}
_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
_MLP = {"gate_proj", "up_proj", "down_proj"}
# Qwen3.5's gated delta net (mlx-vlm keeps mlx-lm's names)
_LINEAR_ATTENTION = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"}


class NotSplittable(ValueError):
    """The language model has a layer this split does not know how to divide."""


@dataclass(frozen=True)
class _Layer:
    attention: Any  # softmax attention, or None
    linear_attention: Any  # Qwen3.5's gated delta net, or None
    mlp: Any


def is_vision_language(model: Any) -> bool:
    """Whether `model` is mlx-vlm's (vision checkpoints load with mlx-vlm; mlx-lm's text
    models may have a `language_model` too, and the towers go by several names)."""
    return type(model).__module__.startswith("mlx_vlm.")


def split_vision_language_model(model: Any, group: Any) -> None:
    """Split `model.language_model`'s layers across `group`'s ranks, before its weights
    are read (the arrays are lazy: each rank reads its own share)."""
    size = group.size()
    layers = [_plan(layer, size) for layer in _decoder_layers(model)]
    for layer in layers:
        if layer.attention is not None:
            _split_attention(layer.attention, group)
        else:
            _split_linear_attention(layer.linear_attention, group)
        _split_mlp(layer.mlp, group)
    log.info(
        "Split the language model's %d layers across %d ranks; the vision tower is whole on each",
        len(layers),
        size,
    )


def _decoder_layers(model: Any) -> list[Any]:
    layers = _layers_of(model)
    if not layers:
        raise NotSplittable("its language model has no decoder layers mlxserve can find")
    return layers


def _layers_of(model: Any) -> list[Any]:
    """The decoder layers: a text model's `layers`, a vision model's language model's."""
    language = getattr(model, "language_model", model)
    inner = getattr(language, "model", None)
    return list(getattr(language, "layers", None) or getattr(inner, "layers", None) or [])


def _attention_counts(attention: Any) -> dict[str, int]:
    """An attention module's head counts, by the attribute that keeps each."""
    return {
        n: getattr(attention, n)
        for n in _HEAD_COUNTS
        if isinstance(getattr(attention, n, None), int)
    }


def _plan(layer: Any, size: int) -> _Layer:
    """What to split in one decoder layer; refuses a layer with anything else that
    projects, or heads that do not divide among the ranks."""
    attention = getattr(layer, "self_attn", None)
    linear = getattr(layer, "linear_attn", None)
    mlp = getattr(layer, "mlp", None)
    if attention is not None and linear is None:
        _expect(attention, _ATTENTION, "attention")
        counts = {_HEAD_COUNTS[name]: count for name, count in _attention_counts(attention).items()}
        if not counts:
            raise NotSplittable(
                "its attention layers keep their head counts where mlxserve does not look"
            )
        _divides(counts, size)
    elif linear is not None and attention is None:
        _expect(linear, _LINEAR_ATTENTION, "linear attention")
        _divides(
            {"linear key heads": linear.num_k_heads, "linear value heads": linear.num_v_heads}, size
        )
    else:
        raise NotSplittable("a decoder layer has no attention mlxserve knows how to split")
    if mlp is None:
        raise NotSplittable("a decoder layer has no MLP")
    _expect(mlp, _MLP, "MLP (a mixture of experts is not split)")
    return _Layer(attention if linear is None else None, linear, mlp)


def library_shard(model: Any, shard: Callable[[Any], None], group: Any) -> None:
    """Run a library's own `shard` of `model`, refusing head counts it cannot divide:
    every count must divide among the ranks, but for key-value heads fewer than the ranks
    where the architecture repeats them (then none may end at zero)."""
    size = group.size()
    before = _head_counts(model)
    for counts in before:
        for name, count in counts.items():
            repeatable = _HEAD_COUNTS[name] == "key-value heads" and count and size % count == 0
            if count % size and not repeatable:
                raise _indivisible(_HEAD_COUNTS[name], count, size)
    shard(group)
    for counts, now in zip(before, _head_counts(model), strict=True):
        for name, count in now.items():
            if count < 1:
                raise _indivisible(_HEAD_COUNTS[name], counts[name], size)


def _head_counts(model: Any) -> list[dict[str, int]]:
    """Each decoder layer's attention head counts, by attribute."""
    return [_attention_counts(getattr(layer, "self_attn", None)) for layer in _layers_of(model)]


def _indivisible(what: str, count: int, size: int) -> NotSplittable:
    return NotSplittable(f"its {what} ({count}) do not divide among {size} ranks")


def _expect(module: Any, names: set[str], what: str) -> None:
    """`module` projects with exactly the linear layers `names`."""
    projections = {
        name
        for name, child in module.children().items()
        if isinstance(child, (nn.Linear, nn.QuantizedLinear))
    }
    if projections != names:
        raise NotSplittable(
            f"its {what} projects with {', '.join(sorted(projections)) or 'nothing'}, "
            f"not {', '.join(sorted(names))}"
        )


def _divides(counts: dict[str, int], size: int) -> None:
    for name, count in counts.items():
        if count % size:
            raise _indivisible(name, count, size)


def _split_attention(attention: Any, group: Any) -> None:
    size = group.size()
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(
            attention, name, shard_linear(getattr(attention, name), "all-to-sharded", group=group)
        )
    attention.o_proj = shard_linear(attention.o_proj, "sharded-to-all", group=group)
    for name in _HEAD_COUNTS:
        if hasattr(attention, name):
            setattr(attention, name, getattr(attention, name) // size)


def _split_linear_attention(net: Any, group: Any) -> None:
    """Qwen3.5's gated delta net: its query, key and value channels are one projection
    (and one depthwise convolution), split segment by segment."""
    size, rank = group.size(), group.rank()
    key_dim = net.key_dim
    segments = [key_dim, 2 * key_dim]
    shard_inplace(net.conv1d, lambda path, weight: (0, segments), group=group)
    net.conv1d.groups //= size
    shard_inplace(net.in_proj_qkv, "all-to-sharded", segments=segments, group=group)
    for name in ("in_proj_z", "in_proj_b", "in_proj_a"):
        shard_inplace(getattr(net, name), "all-to-sharded", group=group)
    net.dt_bias = mx.contiguous(mx.split(net.dt_bias, size)[rank])
    net.A_log = mx.contiguous(mx.split(net.A_log, size)[rank])
    net.out_proj = shard_linear(net.out_proj, "sharded-to-all", group=group)
    for name in ("num_k_heads", "num_v_heads", "key_dim", "value_dim", "conv_dim"):
        setattr(net, name, getattr(net, name) // size)


def _split_mlp(mlp: Any, group: Any) -> None:
    mlp.gate_proj = shard_linear(mlp.gate_proj, "all-to-sharded", group=group)
    mlp.up_proj = shard_linear(mlp.up_proj, "all-to-sharded", group=group)
    mlp.down_proj = shard_linear(mlp.down_proj, "sharded-to-all", group=group)
