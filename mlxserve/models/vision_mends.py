"""Mends for mlx-vlm model code that breaks in mlxserve's engine, applied at load.

Some mlx-vlm models keep arrays outside their parameters, in plain Python helpers
(Pixtral's rotary embedding, so Mistral Small 3's tower): built lazily when the model is
constructed, on the loading thread, and never read as weights. MLX (0.31.2 on) ties an
unevaluated array to its thread's stream, so the vision encoder's thread could not
evaluate them ("There is no Stream(cpu, 0) in current thread": every image a 500). They
are evaluated at load, with the weights.

mlx-vlm 0.7.10's Qwen3-VL-MoE attention cuts an array mask to the longest row's cache
offset plus one plus the new tokens before it updates the cache. A batch's caches hold
more than that (left padding; rows rewound after rejected drafts): the mask no longer
covers the keys and the step fails ("Shapes ... cannot be broadcast"). Its dense
sibling's attention, otherwise the same code, cuts the mask to the keys it reads: the MoE
model's attention layers run that one instead."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn


def mend(model: Any) -> None:
    """Mend `model` (an mlx-vlm model, on the thread that loads it)."""
    if type(model).__module__ == "mlx_vlm.models.qwen3_vl_moe.qwen3_vl_moe":
        _qwen3_vl_moe_attention(model)
    mx.eval(_loose_arrays(model))


def _loose_arrays(model: Any) -> list[mx.array]:
    """The arrays the model's modules keep in plain Python helpers, outside their
    parameters."""
    found = []
    for _, module in model.named_modules():
        for value in vars(module).values():
            if isinstance(value, nn.Module) or not hasattr(value, "__dict__"):
                continue
            found += [v for v in vars(value).values() if isinstance(v, mx.array)]
    return found


def _qwen3_vl_moe_attention(model: Any) -> None:
    from mlx_vlm.models.qwen3_vl import language as dense
    from mlx_vlm.models.qwen3_vl_moe import language as moe

    mended = type("Qwen3VLMoEAttention", (moe.Attention,), {"__call__": dense.Attention.__call__})
    for layer in model.language_model.model.layers:
        if type(layer.self_attn) is moe.Attention:
            layer.self_attn.__class__ = mended
