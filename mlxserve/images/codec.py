"""Images in and out: a rendered array as png, jpeg or webp bytes, and an uploaded image
or mask read into the arrays a render takes (bad bytes are a 400 that names the field)."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from mlxserve.protocol.errors import bad_request


@dataclass(frozen=True)
class OutputFormat:
    pil_name: str
    content_type: str
    extension: str


OUTPUT_FORMATS = {
    "png": OutputFormat("PNG", "image/png", "png"),
    "jpeg": OutputFormat("JPEG", "image/jpeg", "jpg"),
    "webp": OutputFormat("WEBP", "image/webp", "webp"),
}
LOSSLESS = ("png",)  # output_compression does not apply


def encode(image: np.ndarray, output_format: str, compression: int | None) -> bytes:
    """The image's file. `compression` (0-100, OpenAI's output_compression) is jpeg's and
    webp's quality: 100 (the default) is the best."""
    fmt = OUTPUT_FORMATS[output_format]
    options = (
        {}
        if output_format in LOSSLESS
        else {"quality": 100 if compression is None else compression}
    )
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=fmt.pil_name, **options)
    return buffer.getvalue()


def open_image(data: bytes, field: str) -> Image.Image:
    """An uploaded image, read whole (a truncated or corrupt file is a 400 now, not
    halfway through a render)."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise bad_request(
            f"The file in '{field}' is not an image this server reads (png, jpeg, webp): {e}",
            field,
            "invalid_image",
        ) from e
    return image


def source_pixels(image: Image.Image, width: int, height: int) -> np.ndarray:
    """An edit's source as the render takes it: RGB, resized as mlx-vlm resizes it."""
    rgb = image.convert("RGB")
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.LANCZOS)
    return np.asarray(rgb)


def mask_keep(
    mask: Image.Image, source_size: tuple[int, int], width: int, height: int
) -> np.ndarray:
    """OpenAI's mask: fully transparent pixels (alpha 0) are redrawn, the others kept. It
    has an alpha channel and the source image's size."""
    if "A" not in mask.getbands() and mask.info.get("transparency") is None:
        raise bad_request(
            "The mask has no alpha channel: send a PNG whose fully transparent pixels mark "
            "what to redraw.",
            "mask",
            "invalid_mask",
        )
    if mask.size != source_size:
        raise bad_request(
            f"The mask is {mask.size[0]}x{mask.size[1]}, the image "
            f"{source_size[0]}x{source_size[1]}: they must be the same size.",
            "mask",
            "invalid_mask",
        )
    alpha = mask.convert("RGBA").getchannel("A")
    if alpha.size != (width, height):
        alpha = alpha.resize((width, height), Image.Resampling.NEAREST)
    return np.asarray(alpha) > 0
