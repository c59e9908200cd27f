"""Pure parts of the vision path: image loading and limits, and prompt-cache keys."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from conversations import data_uri, square_png
from PIL import Image

from mlxserve.chat.images import ImageLimits, LoadedImage, downscale, load_image
from mlxserve.chat.vision_prompt import cache_tokens, media_spans
from mlxserve.config import ServerConfig
from mlxserve.engine.generation.jobs import PromptImages
from mlxserve.protocol.errors import ErrorKind, ServiceError

PARAM = "messages[0].content[0]"


DEFAULT_LIMITS = ImageLimits.from_config(ServerConfig())


def error_code(url: str, limits: ImageLimits = DEFAULT_LIMITS) -> tuple[str, str]:
    with pytest.raises(ServiceError) as caught:
        load_image(url, PARAM, limits)
    assert caught.value.kind is ErrorKind.INVALID_REQUEST and caught.value.param == PARAM
    return caught.value.code, caught.value.message


def test_downscale_keeps_the_aspect_ratio():
    image = Image.new("RGB", (400, 100))
    small = downscale(image, 10_000)
    assert small.size == (200, 50)
    assert downscale(image, 40_000) is image


def test_a_gif_gives_its_first_frame_in_rgb():
    frames = [Image.new("P", (8, 8), i) for i in (1, 2)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    loaded = load_image(data_uri(buffer.getvalue()), PARAM, DEFAULT_LIMITS)
    assert loaded.image.mode == "RGB" and loaded.image.size == (8, 8)


def test_bad_data():
    assert error_code("data:image/png;base64,aGVsbG8=")[0] == "invalid_image"
    code, message = error_code(data_uri(square_png("red")[:60]))  # a truncated PNG
    assert code == "invalid_image" and "decoded" in message
    bmp = io.BytesIO()
    Image.new("RGB", (4, 4)).save(bmp, format="BMP")
    code, message = error_code(data_uri(bmp.getvalue()))
    assert code == "invalid_image" and "BMP" in message
    assert (
        error_code(data_uri(square_png("red")), replace(DEFAULT_LIMITS, max_bytes=10))[0]
        == "image_too_large"
    )


def test_same_bytes_same_digest():
    red = load_image(data_uri(square_png("red")), PARAM, DEFAULT_LIMITS)
    assert red.digest == load_image(data_uri(square_png("red")), PARAM, DEFAULT_LIMITS).digest
    assert red.digest != load_image(data_uri(square_png("blue")), PARAM, DEFAULT_LIMITS).digest


def _image(tag: bytes) -> LoadedImage:
    return LoadedImage(Image.new("RGB", (1, 1)), tag)


def test_cache_keys_follow_the_images():
    tokens = [1, 2, 9, 9, 3, 9, 9, 4]
    spans = media_spans(tokens, {9})
    assert spans == ((2, 4), (5, 7))
    red_blue = cache_tokens(tokens, spans, [_image(b"red"), _image(b"blue")])
    red_green = cache_tokens(tokens, spans, [_image(b"red"), _image(b"green")])
    assert red_blue[:5] == red_green[:5] and red_blue[5:7] != red_green[5:7]
    assert all(t < 0 for t in red_blue[2:4] + red_blue[5:7])
    assert red_blue[7] == 4 and red_blue[:2] == [1, 2]
    # Runs that cannot be paired with the images all carry the hash of every image.
    merged = cache_tokens(tokens, spans, [_image(b"red")] * 3)
    assert merged[2] == merged[5]


def test_a_prefix_holds_every_image_or_none():
    images = PromptImages(None, {}, None, [], ((2, 4), (5, 7)))
    assert [images.reusable(n) for n in (1, 2, 3, 6, 7, 8)] == [1, 2, 2, 2, 7, 8]
    assert PromptImages(None, {}, None, [], ()).reusable(5) == 5
    assert images.images_after(6) and not images.images_after(7)
