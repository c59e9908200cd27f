"""The image routes (OpenAI's): generations, edits, and the images a url reply links to."""

from __future__ import annotations

from mlxserve.api.images.endpoints import (
    MAX_IMAGES,
    MAX_PARTIAL_IMAGES,
    GenerationBody,
    ImageEndpoints,
)
from mlxserve.api.images.links import LINK_PREFIX, ImageLinks
from mlxserve.api.openai.errors import ERRORS
from mlxserve.api.openapi import shapes as s
from mlxserve.api.table import Route, by_id, upload, with_body
from mlxserve.images.codec import OUTPUT_FORMATS

MAX_IMAGE_UPLOAD_BYTES = 50 * 1024 * 1024  # an edit's image and mask (OpenAI's limit)
IMAGE_FILE = s.binary("image/png")
IMAGE_EDIT_FORM = s.obj(
    {"image": IMAGE_FILE, "prompt": s.STRING},
    {
        "image[]": s.array(IMAGE_FILE),
        "mask": IMAGE_FILE,
        "model": s.STRING,
        "n": {"type": "integer", "minimum": 1, "maximum": MAX_IMAGES},
        "size": s.STRING,
        "response_format": {"enum": ["url", "b64_json"]},
        "output_format": {"enum": list(OUTPUT_FORMATS)},
        "output_compression": {"type": "integer", "minimum": 0, "maximum": 100},
        "stream": s.BOOLEAN,
        "partial_images": {"type": "integer", "minimum": 0, "maximum": MAX_PARTIAL_IMAGES},
        "seed": s.INTEGER,
        "steps": s.INTEGER,
        "strength": s.NUMBER,
    },
)
IMAGE_LINKED = {f.content_type: s.binary(f.content_type) for f in OUTPUT_FORMATS.values()}

ROUTES: tuple[Route[ImageEndpoints], ...] = (
    Route("POST", "/v1/images/generations", with_body(ImageEndpoints.generations), "Text to image", "images", s.stream(s.IMAGES), ERRORS, GenerationBody),
    Route("POST", "/v1/images/edits", with_body(ImageEndpoints.edits), "Edit an image (a mask: only its transparent part)", "images", s.stream(s.IMAGES), ERRORS, IMAGE_EDIT_FORM, body_limit=upload(lambda config: MAX_IMAGE_UPLOAD_BYTES)),
)  # fmt: skip

# The link's random name is its access: no key needed.
LINK_ROUTES: tuple[Route[ImageLinks], ...] = (
    Route("GET", LINK_PREFIX + "{name}", by_id(ImageLinks.get, "name"), "An image a url reply links to (no key needed; for an hour)", "images", IMAGE_LINKED, ERRORS, keyless=True),
)  # fmt: skip
