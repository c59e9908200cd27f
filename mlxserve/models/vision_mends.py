"""Mends for mlx-vlm model code that breaks in a continuous batch, applied at load.

mlx-vlm 0.7.10's Qwen3-VL-MoE attention cuts an array mask to the longest row's cache
offset plus one plus the new tokens before it updates the cache. A batch's caches hold
more than that (left padding; rows rewound after rejected drafts): the mask no longer
covers the keys and the step fails ("Shapes ... cannot be broadcast"). Its dense
sibling's attention, otherwise the same code, cuts the mask to the keys it reads: the MoE
model's attention layers run that one instead."""

from __future__ import annotations

from typing import Any


def mend(model: Any) -> None:
    """Mend `model` (an mlx-vlm model) where its family needs it."""
    if type(model).__module__ == "mlx_vlm.models.qwen3_vl_moe.qwen3_vl_moe":
        _qwen3_vl_moe_attention(model)


def _qwen3_vl_moe_attention(model: Any) -> None:
    from mlx_vlm.models.qwen3_vl import language as dense
    from mlx_vlm.models.qwen3_vl_moe import language as moe

    mended = type("Qwen3VLMoEAttention", (moe.Attention,), {"__call__": dense.Attention.__call__})
    for layer in model.language_model.model.layers:
        if type(layer.self_attn) is moe.Attention:
            layer.self_attn.__class__ = mended
