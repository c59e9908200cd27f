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

mlx-vlm's Gemma 3n embeds a prompt's text tokens (`get_input_embeddings`, which its
generate_step and our prefill call) without the square root of the hidden size its
language model multiplies a token's embedding by when it embeds the token itself (every
decode step; transformers' scaled word embedding does it everywhere): a prompt's text
reached the model some sqrt(hidden) times fainter than the tokens generated after it, and
a prompt continued from the prompt cache (its text embedded by the language model) read
differently from the same prompt whole. The text rows (ids below the vision tower's
vocabulary offset) are scaled, as transformers does.

Mends of processors are applied to the processor as it is loaded (`mend_processor`).
transformers' Gemma 3n audio feature extractor pads a prompt's clips to the longest (and
to 128 samples) and then marks as valid every frame that starts before a clip's last
sample, cut to the frames it computed: alone, a clip of 8,000 samples has 48 valid frames;
beside a longer clip, 50 (two more frames over its padding), so a short clip's last audio
token differed with the clips beside it. Each clip is extracted alone, then padded.
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
    scale_gemma3n_text_embeddings(model)
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


def scale_gemma3n_text_embeddings(model: Any) -> None:
    """Give an mlx-vlm Gemma 3n model (once) the `get_input_embeddings` that scales its
    text rows (see the module's docstring); other models are left as they are."""
    cls = type(model)
    if cls.__module__ != "mlx_vlm.models.gemma3n.gemma3n" or getattr(cls, "_scales_text", False):
        return
    unscaled = cls.get_input_embeddings

    def get_input_embeddings(self: Any, input_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        features = unscaled(self, input_ids, *args, **kwargs)
        text = (input_ids < self.embed_vision.vocab_offset)[..., None]
        embeds = features.inputs_embeds
        # as the language model scales a token it embeds itself (a Python float)
        scaled = embeds * (self.language_model.model.hidden_size**0.5)
        features.inputs_embeds = mx.where(text, scaled, embeds)
        return features

    attributes = {
        "get_input_embeddings": get_input_embeddings,
        "_scales_text": True,
        "__module__": cls.__module__,  # still mlx-vlm's Gemma 3n to whoever asks
    }
    model.__class__ = type(cls.__name__, (cls,), attributes)


def _qwen3_vl_moe_attention(model: Any) -> None:
    from mlx_vlm.models.qwen3_vl import language as dense
    from mlx_vlm.models.qwen3_vl_moe import language as moe

    mended = type("Qwen3VLMoEAttention", (moe.Attention,), {"__call__": dense.Attention.__call__})
    for layer in model.language_model.model.layers:
        if type(layer.self_attn) is moe.Attention:
            layer.self_attn.__class__ = mended


def mend_processor(processor: Any) -> None:
    """Mend an mlx-vlm processor (see the module's docstring)."""
    extractor: Any = getattr(processor, "feature_extractor", None)
    if type(extractor).__name__ == "Gemma3nAudioFeatureExtractor":
        processor.feature_extractor = ClipsAlone(extractor)
    images: Any = getattr(processor, "image_processor", None)
    if type(images).__name__ == "Llama4ImageProcessor" and type(images).__module__.startswith(
        "mlx_vlm"
    ):
        images.preprocess = _with_global_tiles(images)


class ClipsAlone:
    """Gemma 3n's audio feature extractor with each clip of a batch extracted as it is
    alone, padded after (padding frames marked invalid); everything else its own."""

    def __init__(self, extractor: Any):
        self.extractor = extractor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.extractor, name)

    def __call__(self, raw_speech: Any, **kwargs: Any) -> Any:
        if not isinstance(raw_speech, list | tuple) or len(raw_speech) < 2:
            return self.extractor(raw_speech, **kwargs)
        from transformers.feature_extraction_utils import BatchFeature

        tensors = kwargs.pop("return_tensors", None)
        alone = [self.extractor([clip], **kwargs) for clip in raw_speech]
        features = [np.asarray(one["input_features"][0]) for one in alone]
        valid = [np.asarray(one["input_features_mask"][0]) for one in alone]
        longest = max(len(f) for f in features)
        shape = (len(features), longest, features[0].shape[-1])
        padded = np.full(shape, self.extractor.padding_value, dtype=np.float32)
        mask = np.zeros(shape[:2], dtype=bool)
        for i, (frames, kept) in enumerate(zip(features, valid, strict=True)):
            padded[i, : len(frames)] = frames
            mask[i, : len(kept)] = kept
        batch = {"input_features": padded, "input_features_mask": mask}
        return BatchFeature(batch, tensor_type=tensors)


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
