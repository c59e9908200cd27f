"""Mends for mlx-vlm model code that breaks in mlxserve's engine, applied at load.

Some mlx-vlm models keep arrays outside their parameters, in plain Python helpers
(Pixtral's rotary embedding, so Mistral Small 3's tower) or under private names (Gemma
4's audio tower's timescales): built lazily when the model is
constructed, on the loading thread, and never read as weights. MLX (0.31.2 on) ties an
unevaluated array to its thread's stream, so the vision encoder's thread could not
evaluate them ("There is no Stream(cpu, 0) in current thread": every image a 500). They
are evaluated at load, with the weights.

mlx-vlm 0.7.10's Qwen3-VL-MoE attention cuts an array mask to the longest row's cache
offset plus one plus the new tokens before it updates the cache. A batch's caches hold
more than that (left padding; rows rewound after rejected drafts): the mask no longer
covers the keys and the step fails ("Shapes ... cannot be broadcast"). Its dense
sibling's attention, otherwise the same code, cuts the mask to the keys it reads: the MoE
model's attention layers run that one instead.

Llama 4's chunked attention is made to batch (`chunked_attention`, mlx-lm's text model's
too). mlx-vlm's Llama 4 image processor (its own, without torch) cuts an image of more
than one tile into its tiles but leaves out the whole image, which transformers' adds
after them, resized to one tile: the prompt has a run of patch tokens for it, the model
got no features for them and read past the end of the ones it had (every image that is
not square, or near it, answered from garbage). The processor adds it.

mlx-vlm's Gemma 4 encodes a prompt's audio clips as one padded batch and hands the
placeholders its frames in order, padding included: with a shorter clip before a longer
one, the longer clip's placeholders took the shorter one's padding. The tower's output
is packed (each clip's own frames, one clip after another).

Mends of processors are applied to the processor as it is loaded (`mend_processor`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxserve.models.chunked_attention import batch_chunked_attention
from mlxserve.wrapped_layer import WrappedLayer


def mend(model: Any) -> None:
    """Mend `model` (an mlx-vlm model, on the thread that loads it)."""
    if type(model).__module__ == "mlx_vlm.models.qwen3_vl_moe.qwen3_vl_moe":
        _qwen3_vl_moe_attention(model)
    batch_chunked_attention(model)
    if type(model).__module__ == "mlx_vlm.models.gemma4.gemma4":
        _pack_audio_clips(model)
    mx.eval(_loose_arrays(model))


def _loose_arrays(model: Any) -> list[mx.array]:
    """The arrays the model's modules keep in plain Python helpers, outside their
    parameters."""
    found = []
    for _, module in model.named_modules():
        # private arrays (Gemma 4's audio tower's `_inv_timescales`): not parameters
        found += [v for k, v in module.items() if k.startswith("_") and isinstance(v, mx.array)]
        for value in vars(module).values():
            if isinstance(value, nn.Module) or not hasattr(value, "__dict__"):
                continue
            found += [v for v in vars(value).values() if isinstance(v, mx.array)]
    return found


class PackedAudioTower(WrappedLayer):
    """Gemma 4's audio tower, its clips' frames packed: each clip's frames, then the
    next's, padding left out, as the placeholders of the prompt take them in order."""

    def __call__(self, mel: mx.array, mel_mask: mx.array) -> tuple[mx.array, mx.array]:
        encodings, padded = self.layer(mel, mel_mask)
        if encodings.shape[0] == 1:
            return encodings, padded
        kept = [np.flatnonzero(~row) for row in np.array(padded)]
        frames = [encodings[i][mx.array(rows)] for i, rows in enumerate(kept) if len(rows)]
        packed = mx.concatenate(frames)[None]
        return packed, mx.zeros(packed.shape[:2], dtype=mx.bool_)


def _pack_audio_clips(model: Any) -> None:
    tower = getattr(model, "audio_tower", None)
    if isinstance(tower, nn.Module) and not isinstance(tower, PackedAudioTower):
        model.audio_tower = PackedAudioTower(tower)


def _qwen3_vl_moe_attention(model: Any) -> None:
    from mlx_vlm.models.qwen3_vl import language as dense
    from mlx_vlm.models.qwen3_vl_moe import language as moe

    mended = type("Qwen3VLMoEAttention", (moe.Attention,), {"__call__": dense.Attention.__call__})
    for layer in model.language_model.model.layers:
        if type(layer.self_attn) is moe.Attention:
            layer.self_attn.__class__ = mended


def mend_processor(processor: Any) -> None:
    """Mend an mlx-vlm processor (see the module's docstring)."""
    images: Any = getattr(processor, "image_processor", None)
    if type(images).__name__ == "Llama4ImageProcessor" and type(images).__module__.startswith(
        "mlx_vlm"
    ):
        images.preprocess = _with_global_tiles(images)


def _with_global_tiles(images: Any) -> Any:
    """Llama 4's `preprocess` with each image of several tiles followed by the whole image
    as one more tile (transformers' Llama4ImageProcessorFast's order)."""
    from PIL import Image

    tiles_of = images.preprocess

    def preprocess(pictures: Any, **kwargs: Any) -> dict[str, Any]:
        pixels, ratios = [], []
        for picture in pictures if isinstance(pictures, list) else [pictures]:
            found = tiles_of([picture], **kwargs)
            pixels.append(found["pixel_values"])
            ratios += found["aspect_ratios"]
            rows, columns = found["aspect_ratios"][0]
            if rows * columns > 1:
                if not isinstance(picture, Image.Image):
                    picture = Image.fromarray(np.uint8(picture))
                side = (images.size, images.size)
                whole = picture.convert("RGB").resize(side, Image.Resampling.BICUBIC)
                pixels.append(images._preprocess_single(whole)[None])
        return {"pixel_values": np.concatenate(pixels), "aspect_ratios": ratios}

    return preprocess
