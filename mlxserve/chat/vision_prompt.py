"""A chat request for a vision model -> prompt tokens and prepared media.

The conversation is rendered by the same template code as for text models (images, clips
and audio become {"type": "image"}, {"type": "video"} and {"type": "audio"} parts), then
the model's processor (through mlx-vlm's `prepare_inputs`) preprocesses the media and
expands each placeholder to the model's media tokens.
Runs on HTTP threads: the processor's numpy output becomes MLX arrays here, a copy of
data with no computation; the model itself runs only on the generation thread.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from mlxserve.chat.media import LoadedMedia, MediaLimits, load_media
from mlxserve.chat.templates import chat_text, media_parts
from mlxserve.engine.generation.jobs import PromptImages
from mlxserve.models.capabilities import media_modalities, read_config
from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import ChatRequest, MediaPart
from mlxserve.video.codec import Clip

_MEDIA_TOKEN_FIELDS = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "video_token_index",
    "audio_token_id",
    "audio_token_index",
)
# Families whose embeddings take images or a video, not both (the other is silently lost)
_IMAGES_OR_VIDEO = ("qwen2_vl", "qwen2_5_vl")
# What a processor names besides, so that each image is one run of placeholders:
# Pixtral's (Mistral Small 3's) rows of [IMG] broken by [IMG_BREAK] and closed by
# [IMG_END]; Llama 4's tiles of <|patch|> between tile separators, then <|image|> and the
# whole image's patches (those two by their text)
_PROCESSOR_MEDIA_FIELDS = ("image_token_id", "image_break_token_id", "image_end_token_id")
_PROCESSOR_MEDIA_TOKENS = ("tile_token", "tile_global_token")
_PROMPT_FIELDS = ("input_ids", "pixel_values", "attention_mask")


@dataclass(frozen=True)
class VisionChat:
    tokenizer: object
    processor: object
    model_path: Path
    limits: MediaLimits


def render_vision_chat(
    vision: VisionChat,
    request: ChatRequest,
    template_args: dict,
    chat_template: str | None,
    inject_tools: bool,
) -> tuple[list[int], PromptImages]:
    """The prompt tokens (media tokens expanded) and what the model needs of the media."""
    from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

    config = read_config(vision.model_path)
    modalities = media_modalities(vision.model_path)
    text = chat_text(
        vision.tokenizer, request, template_args, chat_template, inject_tools, modalities
    )
    parts = media_parts(request)
    _check_processor(vision.processor, parts, config)
    rate = _audio_rate(vision.processor)
    media = [load_media(part, vision.limits, rate) for part in parts]
    clips = [m.value for m in media if m.kind == "video"]
    try:
        inputs = prepare_inputs(
            vision.processor,
            images=[m.value for m in media if m.kind == "image"] or None,
            videos=[clip.frames for clip in clips] or None,
            audio=[m.value for m in media if m.kind == "audio"] or None,
            prompts=text,
            image_token_index=config.get("image_token_index"),
            add_special_tokens=should_add_special_tokens(
                str(config.get("model_type")), vision.processor
            ),
            **_clip_timing(clips),
        )
    except ValueError as e:
        raise bad_request(f"The model's processor refused the media: {e}", param="messages") from e
    tokens = inputs["input_ids"].reshape(-1).tolist()
    spans = media_spans(tokens, _media_token_ids(config, vision.processor))
    return tokens, PromptImages(
        pixel_values=inputs.get("pixel_values"),
        extra={k: v for k, v in inputs.items() if k not in _PROMPT_FIELDS and v is not None},
        attention_mask=inputs.get("attention_mask"),
        cache_tokens=cache_tokens(tokens, spans, media),
        spans=spans,
    )


def _check_processor(processor: object, parts: list[MediaPart], config: dict) -> None:
    """A 400 for media the model's processor would drop: video where it has no video
    processor (mlx-vlm's generic processors accept `videos` and ignore them), audio where
    it has no feature extractor, images and video together where the family's
    embeddings take one of the two (Qwen2-VL's and Qwen2.5-VL's: the other is lost)."""
    from mlx_vlm.generate.video import processor_handles_video

    kinds = {part.kind for part in parts}
    for part in parts:
        if part.kind == "video" and not processor_handles_video(processor):
            raise bad_request(
                "This model's processor reads no video.",
                param=part.param,
                code="video_not_supported",
            )
        if part.kind == "audio" and getattr(processor, "feature_extractor", None) is None:
            raise bad_request(
                "This model's processor reads no audio.",
                param=part.param,
                code="audio_not_supported",
            )
    if {"image", "video"} <= kinds and config.get("model_type") in _IMAGES_OR_VIDEO:
        visual = [part for part in parts if part.kind in ("image", "video")]
        second = next(part for part in visual if part.kind != visual[0].kind)
        raise bad_request(
            "This model takes images or a video in one conversation, not both: its "
            "embeddings hold one of the two.",
            param=second.param,
            code="mixed_media_not_supported",
        )


def _audio_rate(processor: object) -> int:
    """The sampling rate the processor's feature extractor reads (16 kHz where none says)."""
    return int(getattr(getattr(processor, "feature_extractor", None), "sampling_rate", 16000))


def _clip_timing(clips: list[Clip]) -> dict:
    """Each clip's sampled rate and its frames' places, for processors that label frames
    with their time (Gemma 4's "mm:ss")."""
    if not clips:
        return {}
    return {
        "fps": [clip.fps for clip in clips],
        "video_metadata": [
            {
                "total_num_frames": len(clip.frames),
                "fps": clip.fps,
                "frames_indices": list(range(len(clip.frames))),
            }
            for clip in clips
        ],
    }


def _media_token_ids(config: dict, processor: object) -> set[int]:
    ids = {config.get(name) for name in _MEDIA_TOKEN_FIELDS}
    ids |= {getattr(processor, name, None) for name in _PROCESSOR_MEDIA_FIELDS}
    texts = [getattr(processor, name, None) for name in _PROCESSOR_MEDIA_TOKENS]
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is not None:
        ids |= {tokenizer.convert_tokens_to_ids(text) for text in texts if isinstance(text, str)}
    return {int(i) for i in ids if isinstance(i, int)}


def media_spans(tokens: list[int], media_ids: set[int]) -> tuple[tuple[int, int], ...]:
    """[start, end) of each run of image placeholder tokens."""
    spans: list[tuple[int, int]] = []
    for i, token in enumerate(tokens):
        if token in media_ids:
            if spans and spans[-1][1] == i:
                spans[-1] = (spans[-1][0], i + 1)
            else:
                spans.append((i, i + 1))
    return tuple(spans)


def cache_tokens(
    tokens: list[int], spans: tuple[tuple[int, int], ...], media: list[LoadedMedia]
) -> list[int]:
    """`tokens` with the k-th medium's placeholders replaced by a negative id hashed from
    the bytes of media 1..k. Where runs and media cannot be paired one to one (a model
    whose placeholders touch, a clip in several runs), every run gets the hash of all."""
    keyed = list(tokens)
    chain = hashlib.sha256()
    ids = []
    for medium in media:
        chain.update(medium.digest)
        ids.append(-1 - int.from_bytes(chain.digest()[:7], "big"))
    if len(ids) != len(spans):
        ids = [ids[-1] if ids else -1] * len(spans)
    for (start, end), token in zip(spans, ids, strict=True):
        keyed[start:end] = [token] * (end - start)
    return keyed
