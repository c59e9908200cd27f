"""Image content parts -> decoded images: data URIs, http(s) URLs and allowed local files.

Runs on HTTP threads (no MLX). Every failure is a 400 that names the content part, so a
client learns which image was wrong instead of getting an answer that ignored it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from mlxserve.chat.fetch import FetchError, FetchRules, TooLarge, fetch
from mlxserve.config import ServerConfig
from mlxserve.protocol.errors import ServiceError, bad_request

# Decoding is refused beyond this many pixels (a decompression bomb: a few hundred KB of
# PNG can hold 100 MP, 300 MB decoded), before downscaling. 50 MP keeps phone photos.
MAX_DECODED_PIXELS = 50_000_000
# Images decoded at once, whatever the number of requests: bounds the peak memory.
_DECODING = threading.BoundedSemaphore(2)
READ_BLOCK = 64 * 1024
ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


@dataclass(frozen=True)
class ImageLimits:
    """What a request's images may be (their defaults: `config.ServerConfig`)."""

    max_bytes: int
    max_pixels: int  # larger images are downscaled, aspect kept
    fetch_timeout: float
    allowed_dirs: tuple[Path, ...]  # local files must lie inside one of these
    allow_local_urls: bool  # image URLs may name loopback and private addresses

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
    if not isinstance(url, str) or not url:
        raise bad_request("An image part needs a URL string.", param=param, code="invalid_image")
    data = _read(url, param, limits)
    if len(data) > limits.max_bytes:
        raise _too_large(len(data), limits, param)
    return LoadedImage(_decode(data, param, limits.max_pixels), hashlib.sha256(data).digest())


def _read(url: str, param: str, limits: ImageLimits) -> bytes:
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if url.startswith("data:"):
        return _data_uri(url, param)
    if scheme in ("http", "https"):
        return _fetch(url, param, limits)
    if scheme == "file":
        return _local_file(
            Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)), param, limits
        )
    if scheme == "":
        return _local_file(Path(url), param, limits)
    raise bad_request(
        f"Unsupported image URL scheme '{scheme}': use a data: URI, http(s) or a file path.",
        param=param,
        code="invalid_image",
    )


def _data_uri(url: str, param: str) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise bad_request(
            "An image data URI must look like data:image/png;base64,<data>.",
            param=param,
            code="invalid_image",
        )
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(
            f"The image data URI is not valid base64: {e}", param=param, code="invalid_image"
        ) from e


def _fetch(url: str, param: str, limits: ImageLimits) -> bytes:
    rules = FetchRules(limits.fetch_timeout, limits.max_bytes, limits.allow_local_urls)
    try:
        return fetch(url, rules)
    except TooLarge as e:
        raise _too_large(e.size, limits, param) from e
    except FetchError as e:
        if e.refused:
            raise bad_request(
                f"The image URL may not be fetched: {e}.", param=param, code="image_url_not_allowed"
            ) from e
        raise _unreachable(url, str(e), param) from e


def _local_file(path: Path, param: str, limits: ImageLimits) -> bytes:
    try:
        resolved = path.expanduser().resolve()
    except (OSError, ValueError) as e:  # a NUL byte, a name too long
        raise bad_request(f"Not a file path: {e}.", param=param, code="invalid_image") from e
    if not any(resolved.is_relative_to(root.resolve()) for root in limits.allowed_dirs):
        raise bad_request(
            "Local image files are only read from the folders given with --image-dir or "
            "--model-dir; this path is outside them.",
            param=param,
            code="image_path_not_allowed",
        )
    if not resolved.is_file():
        raise bad_request(f"No image file at '{path}'.", param=param, code="invalid_image")
    if resolved.stat().st_size > limits.max_bytes:
        raise _too_large(resolved.stat().st_size, limits, param)
    return resolved.read_bytes()


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


def _too_large(size: int, limits: ImageLimits, param: str) -> ServiceError:
    return bad_request(
        f"The image is larger than the server's limit of {limits.max_bytes} bytes"
        f" ({size} bytes or more); see --max-image-bytes.",
        param=param,
        code="image_too_large",
    )


def _unreachable(url: str, reason: str, param: str) -> ServiceError:
    shown = url if len(url) <= 200 else url[:200] + "..."
    return bad_request(
        f"The image at {shown} could not be fetched: {reason}.",
        param=param,
        code="image_unreachable",
    )
