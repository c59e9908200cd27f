"""Image content parts -> decoded images (their bytes read by `sources.py`).

Runs on HTTP threads (no MLX). Every failure is a 400 that names the content part, so a
client learns which image was wrong instead of getting an answer that ignored it.
"""

from __future__ import annotations

import hashlib
import io
import threading
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from mlxserve.chat.sources import SourceRules, read_source
from mlxserve.config import ServerConfig
from mlxserve.protocol.errors import bad_request

# Decoding is refused beyond this many pixels (a decompression bomb: a few hundred KB of
# PNG can hold 100 MP, 300 MB decoded), before downscaling. 50 MP keeps phone photos.
MAX_DECODED_PIXELS = 50_000_000
# Images decoded at once, whatever the number of requests: bounds the peak memory.
_DECODING = threading.BoundedSemaphore(2)
ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


@dataclass(frozen=True)
class ImageLimits:
    """What a request's images may be (their defaults: `config.ServerConfig`)."""

    max_bytes: int
    max_pixels: int  # larger images are downscaled, aspect kept
    fetch_timeout: float
    allowed_dirs: tuple[Path, ...]  # local files must lie inside one of these
    allow_local_urls: bool  # image URLs may name loopback and private addresses

    @property
    def sources(self) -> SourceRules:
        return SourceRules(
            "image",
            self.max_bytes,
            "--max-image-bytes",
            self.fetch_timeout,
            self.allowed_dirs,
            self.allow_local_urls,
        )

    @classmethod
    def from_config(cls, config: ServerConfig) -> ImageLimits:
        return cls(
            max_bytes=config.max_image_bytes,
            max_pixels=config.max_image_pixels,
            fetch_timeout=config.image_fetch_timeout,
            allowed_dirs=(*config.image_dirs, *config.model_dirs),
            allow_local_urls=config.allow_local_image_urls,
        )


@dataclass(frozen=True)
class LoadedImage:
    image: Image.Image  # RGB, at most max_pixels
    digest: bytes  # sha256 of the original bytes: the prompt cache keys on it


def load_image(url: str, param: str, limits: ImageLimits) -> LoadedImage:
    """The image a content part points to, or a 400 naming `param`."""
    data = read_source(url, param, limits.sources)
    return LoadedImage(_decode(data, param, limits.max_pixels), hashlib.sha256(data).digest())


def _decode(data: bytes, param: str, max_pixels: int) -> Image.Image:
    with _DECODING:
        return downscale(_decode_rgb(data, param, max_pixels), max_pixels)


def _decode_rgb(data: bytes, param: str, max_pixels: int) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as opened:
            if opened.format not in ACCEPTED_FORMATS:
                raise bad_request(
                    f"Unsupported image format {opened.format}; send PNG, JPEG, WebP or GIF.",
                    param=param,
                    code="invalid_image",
                )
            if opened.width * opened.height > MAX_DECODED_PIXELS:
                raise bad_request(
                    f"The image is {opened.width}x{opened.height} pixels, more than the "
                    f"{MAX_DECODED_PIXELS} pixels this server decodes.",
                    param=param,
                    code="image_too_large",
                )
            opened.seek(0)  # an animated GIF: its first frame
            # A JPEG decodes at 1/2, 1/4 or 1/8 scale when that still has max_pixels.
            scale = (max_pixels / (opened.width * opened.height)) ** 0.5
            if scale < 1:
                opened.draft("RGB", (int(opened.width * scale), int(opened.height * scale)))
            image = opened.convert("RGB")
    except UnidentifiedImageError as e:
        raise bad_request(
            "The data is not an image (PNG, JPEG, WebP or GIF).", param=param, code="invalid_image"
        ) from e
    except (Image.DecompressionBombError, OSError, SyntaxError, ValueError) as e:
        raise bad_request(
            f"The image could not be decoded: {e}", param=param, code="invalid_image"
        ) from e
    return image


def downscale(image: Image.Image, max_pixels: int) -> Image.Image:
    """The image shrunk to at most `max_pixels`, aspect ratio kept."""
    pixels = image.width * image.height
    if pixels <= max_pixels:
        return image
    scale = (max_pixels / pixels) ** 0.5
    size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)
