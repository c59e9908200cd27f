"""A chat request for a vision model -> prompt tokens and prepared images.

The conversation is rendered by the same template code as for text models (images become
{"type": "image"} parts), then the model's processor (through mlx-vlm's `prepare_inputs`)
preprocesses the images and expands each image placeholder to the model's image tokens.
Runs on HTTP threads: the processor's numpy output becomes MLX arrays here, a copy of
data with no computation; the model itself runs only on the generation thread.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from mlxserve.chat.images import ImageLimits, LoadedImage, load_image
from mlxserve.chat.templates import chat_text, image_parts
from mlxserve.engine.generation.jobs import PromptImages
from mlxserve.models.capabilities import read_config
from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import ChatRequest

_MEDIA_TOKEN_FIELDS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")
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
    limits: ImageLimits


def render_vision_chat(
    vision: VisionChat,
    request: ChatRequest,
    template_args: dict,
    chat_template: str | None,
    inject_tools: bool,
) -> tuple[list[int], PromptImages]:
    """The prompt tokens (image tokens expanded) and what the model needs of the images."""
    from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

    images = [load_image(part.url, part.param, vision.limits) for part in image_parts(request)]
    text = chat_text(
        vision.tokenizer, request, template_args, chat_template, inject_tools, takes_images=True
    )
    config = read_config(vision.model_path)
    try:
        inputs = prepare_inputs(
            vision.processor,
            images=[image.image for image in images] or None,
            prompts=text,
            image_token_index=config.get("image_token_index"),
            add_special_tokens=should_add_special_tokens(
                str(config.get("model_type")), vision.processor
            ),
        )
    except ValueError as e:
        raise bad_request(f"The model's processor refused the images: {e}", param="messages") from e
    tokens = inputs["input_ids"].reshape(-1).tolist()
    spans = media_spans(tokens, _media_token_ids(config, vision.processor))
    return tokens, PromptImages(
        pixel_values=inputs.get("pixel_values"),
        extra={k: v for k, v in inputs.items() if k not in _PROMPT_FIELDS and v is not None},
        attention_mask=inputs.get("attention_mask"),
        cache_tokens=cache_tokens(tokens, spans, images),
        spans=spans,
    )


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
    tokens: list[int], spans: tuple[tuple[int, int], ...], images: list[LoadedImage]
) -> list[int]:
    """`tokens` with the k-th image's placeholders replaced by a negative id hashed from
    the bytes of images 1..k. Where runs and images cannot be paired one to one (a model
    whose placeholders touch), every run gets the hash of all images."""
    keyed = list(tokens)
    chain = hashlib.sha256()
    ids = []
    for image in images:
        chain.update(image.digest)
        ids.append(-1 - int.from_bytes(chain.digest()[:7], "big"))
    if len(ids) != len(spans):
        ids = [ids[-1] if ids else -1] * len(spans)
    for (start, end), token in zip(spans, ids, strict=True):
        keyed[start:end] = [token] * (end - start)
    return keyed
