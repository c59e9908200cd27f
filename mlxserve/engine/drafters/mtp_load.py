"""Finding and loading a checkpoint's MTP head (mlx-lm loads the model without it).

The head's decoder layer is built with the model's own layer class, at the index of a
layer of the same kind in the model (its "slot"), and its tensors go through the model's
own `sanitize` in that slot, so that whatever the family does to a checkpoint (stacking
experts, shifting zero-centred norms, dequantizing fp8) is done to the head alike."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxserve.engine.drafters.hidden import readout
from mlxserve.engine.drafters.mtp_head import DEEPSEEK, QWEN, Layout, MTPHead

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Family:
    layout: Layout
    prefix: Callable[[Any], str]  # the model's args -> the head's checkpoint prefix
    slot: Callable[[Any], int]  # the model's args -> a layer index of the head's kind
    layer: Callable[[Any, int], nn.Module]  # (args, index) -> a decoder layer
    array_mask: bool = False  # its attention takes the causal mask as an array (MLA)


def _qwen3_5_layer(args: Any, index: int) -> nn.Module:
    """mlx-lm's layer, with mlx-lm's arguments made from the model's (a vision
    checkpoint's language model, loaded by mlx-vlm, has mlx-vlm's: the same fields, less
    what mlx-lm derives from them)."""
    from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

    return DecoderLayer(TextModelArgs.from_dict(vars(args)), index)


def _qwen3_next_layer(args: Any, index: int) -> nn.Module:
    from mlx_lm.models.qwen3_next import Qwen3NextDecoderLayer

    return Qwen3NextDecoderLayer(args, index)


def _glm4_moe_layer(args: Any, index: int) -> nn.Module:
    from mlx_lm.models.glm4_moe import DecoderLayer

    return DecoderLayer(args, index)


def _deepseek_v3_layer(args: Any, index: int) -> nn.Module:
    from mlx_lm.models.deepseek_v3 import DeepseekV3DecoderLayer

    return DeepseekV3DecoderLayer(args, index)


def _full_attention_slot(args: Any) -> int:
    return args.full_attention_interval - 1


def _after_last_layer(args: Any) -> str:
    return f"model.layers.{args.num_hidden_layers}."


def _last_layer(args: Any) -> int:
    return args.num_hidden_layers - 1


FAMILIES: dict[str, Family] = {
    "qwen3_5": Family(QWEN, lambda _: "mtp.", _full_attention_slot, _qwen3_5_layer),
    "qwen3_next": Family(QWEN, lambda _: "mtp.", _full_attention_slot, _qwen3_next_layer),
    "glm4_moe": Family(DEEPSEEK, _after_last_layer, _last_layer, _glm4_moe_layer),
    "deepseek_v3": Family(
        DEEPSEEK, _after_last_layer, _last_layer, _deepseek_v3_layer, array_mask=True
    ),
}
SHARED = ("embed_tokens.", "shared_head.head.")  # copies of the model's own: not loaded


def model_args(model: Any) -> Any:
    return getattr(model, "language_model", model).args


def load_head(model: Any, folder: Path) -> MTPHead | None:
    """The MTP head in the checkpoint at `folder`, for `model` loaded from it; None when
    the family has none we know or the checkpoint carries none (mlx-lm's conversions drop
    it). Raises ValueError when the tensors do not fit the family's layer."""
    config = json.loads((folder / "config.json").read_text())
    family = FAMILIES.get(config.get("model_type"))
    if family is None:
        return None
    args = model_args(model)
    tensors = _tensors(folder)
    prefix = family.prefix(args)
    own = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    own = {k: v for k, v in own.items() if not k.startswith(SHARED)}
    if not own:
        return None
    slot = family.slot(args)
    layout = family.layout
    names = dict(layout.parts)
    head = new_head(model, family)
    parts = {k: v for k, v in own.items() if any(k.startswith(n + ".") for n in names.values())}
    layer = {k[len(layout.layer) :]: v for k, v in own.items() if k not in parts}
    layer, shift = _sanitized_in_slot(model, tensors, layer, slot, prefix)
    weights = {f"layer.{k}": v for k, v in layer.items()}
    for ours, theirs in layout.parts:
        for k, v in parts.items():
            if k.startswith(theirs + "."):
                norm = ours.endswith("norm") and k.endswith(".weight")
                weights[ours + k[len(theirs) :]] = v + shift if norm else v
    _quantize_like(head, weights, config)
    head.load_weights(list(weights.items()), strict=True)
    head.eval()
    mx.eval(head.parameters())
    return head


def new_head(model: Any, family: Family) -> MTPHead:
    """An untrained head of `family`'s layout for `model` (its weights to be loaded)."""
    args = model_args(model)
    language = getattr(model, "language_model", model)  # a vision checkpoint's: its text
    return MTPHead(
        family.layout,
        family.layer(args, family.slot(args)),
        args.hidden_size,
        args.rms_norm_eps,
        language.model.embed_tokens,
        readout(model),
        family.array_mask,
    )


def _tensors(folder: Path) -> dict[str, mx.array]:
    """Every tensor of the checkpoint, read lazily (only the head's are evaluated)."""
    tensors: dict[str, mx.array] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(mx.load(str(file)))  # type: ignore[arg-type]
    return tensors


def _sanitized_in_slot(
    model: Any, tensors: dict[str, mx.array], layer: dict[str, mx.array], slot: int, own: str
) -> tuple[dict[str, mx.array], float]:
    """The head's layer tensors as the model's `sanitize` leaves them when they stand in
    for layer `slot` (the head's own, under `own`, set aside), and how much it added to
    that layer's norms (1.0 for a family that stores zero-centred norms and shifts them,
    which the head's other norms need too)."""
    marker = f"layers.{slot}."
    name = next(k for k in tensors if marker in k and not k.startswith(own) and _text(k))
    slot_prefix = name[: name.index(marker) + len(marker)]
    swapped = {k: v for k, v in tensors.items() if not k.startswith((slot_prefix, own))}
    swapped.update({slot_prefix + k: v for k, v in layer.items()})
    sanitized = model.sanitize(swapped) if hasattr(model, "sanitize") else swapped
    out = {}
    for k, v in sanitized.items():
        before, found, rest = k.partition(marker)
        if found and _text(before):
            out[rest] = v
    raw, done = layer.get("input_layernorm.weight"), out.get("input_layernorm.weight")
    if raw is None or done is None:
        return out, 0.0
    added = mx.mean(done.astype(mx.float32) - raw.astype(mx.float32))
    return out, mx.round(added).astype(mx.float32).item()  # type: ignore[return-value]


def _text(name: str) -> bool:
    """Not a vision tower's tensor (some number their blocks `layers` too)."""
    return "vision" not in name and "visual" not in name


def _quantize_like(head: MTPHead, weights: dict[str, mx.array], config: dict) -> None:
    """Quantize the head's layers whose tensors were stored quantized (as mlx-lm does
    with a model's)."""
    quantization = config.get("quantization")
    if not quantization or not any(k.endswith(".scales") for k in weights):
        return
    nn.quantize(
        head,
        group_size=quantization["group_size"],
        bits=quantization["bits"],
        class_predicate=lambda path, _: f"{path}.scales" in weights,
    )
