"""POST /v1/images/generations (JSON) and /v1/images/edits (a multipart form) in OpenAI's
shapes: the images as b64_json or as links (response_format "url"), or a stream of
partial images and the finished ones (`stream`, `partial_images`)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Annotated, Literal

from pydantic import Field

from mlxserve.api.images.links import ImageLinks
from mlxserve.api.multipart import Form, parse_form
from mlxserve.api.openai.errors import error_body
from mlxserve.api.responder import Responder
from mlxserve.api.sse import SSEWriter, stream_failure
from mlxserve.api.wire import Strict, parse
from mlxserve.images.codec import OUTPUT_FORMATS, encode, mask_keep, open_image, source_pixels
from mlxserve.images.render import PATCH, ImageJob, image_tokens
from mlxserve.images.service import Rendered
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import bad_request
from mlxserve.service.chat import ChatService
from mlxserve.service.context import RequestContext
from mlxserve.telemetry.record import Metered

MAX_PROMPT_CHARS = 32_000  # OpenAI's (gpt-image-1)
MAX_IMAGES = 10  # n, as OpenAI allows
MAX_STEPS = 100
MIN_SIDE, MAX_SIDE = 64, 2048  # pixels; each side a multiple of PATCH
DEFAULT_SIZE = "1024x1024"
MAX_PARTIAL_IMAGES = 3
MAX_SEED = 2**32 - 1
OPENAI_IMAGE_MODELS = ("dall-e-", "gpt-image-")  # names a client may send for "an image model"
DEFAULT_EDIT_STRENGTH = 0.6  # mlx-vlm's; a masked edit redraws its area whole (1.0)

Quality = Literal["auto", "low", "medium", "high", "standard", "hd"]
OutputName = Literal["png", "jpeg", "webp"]


@dataclass(frozen=True)
class ImageOptions:
    """What shapes the reply, for both endpoints."""

    n: int
    width: int
    height: int
    size: str  # as the reply echoes it
    quality: str
    response_format: str  # b64_json or url
    output_format: str
    compression: int | None
    stream: bool
    partial_images: int
    seed: int
    steps: int | None


class GenerationBody(Strict):
    model: str | None = None
    prompt: Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
    n: Annotated[int, Field(ge=1, le=MAX_IMAGES)] | None = None
    size: str | None = None
    quality: Quality | None = None
    response_format: Literal["url", "b64_json"] | None = None
    output_format: OutputName | None = None
    output_compression: Annotated[int, Field(ge=0, le=100)] | None = None
    stream: bool | None = None
    partial_images: Annotated[int, Field(ge=0, le=MAX_PARTIAL_IMAGES)] | None = None
    background: Literal["transparent", "opaque", "auto"] | None = None
    moderation: Literal["low", "auto"] | None = None  # no moderation runs here
    style: Literal["vivid", "natural"] | None = None  # DALL-E 3's: not used
    user: str | None = None
    # mlxserve's: the same seed gives the same image (image i of n takes seed + i)
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None


@dataclass
class ImageEndpoints:
    service: ChatService
    links: ImageLinks

    def generations(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(GenerationBody, raw)
        spec = self._spec(wire.model, responder.context)
        if not wire.prompt.strip():
            raise bad_request("prompt must hold text to draw.", "prompt")
        width, height = _size(wire.size or "auto", None)
        options = _options(wire, width, height)
        jobs = [
            ImageJob(wire.prompt, width, height, options.steps, options.seed + i)
            for i in range(options.n)
        ]
        return self._answer(spec, jobs, options, responder, "image_generation")

    def edits(self, raw: bytes, responder: Responder) -> dict | None:
        form = parse_form(responder.header("Content-Type"), raw, "the image")
        spec = self._spec(form.text("model"), responder.context)
        wire = _edit_body(form)
        if not wire.prompt.strip():
            raise bad_request("prompt must say what to change.", "prompt")
        names = [name for name in ("image", "image[]") if form.file_counts.get(name)]
        count = sum(form.file_counts[name] for name in names)
        if count != 1:
            raise bad_request(
                "Send one image to edit, in the form field 'image' (this model edits one "
                f"image at a time; the form has {count}).",
                "image",
            )
        image = open_image(form.files[names[0]], "image")
        width, height = _size(wire.size or "auto", image.size)
        source = source_pixels(image, width, height)
        keep = None
        if (mask := form.files.get("mask")) is not None:
            keep = mask_keep(open_image(mask, "mask"), image.size, width, height)
        strength = _strength(form.text("strength"), keep is not None)
        options = _options(wire, width, height)
        jobs = [
            ImageJob(
                wire.prompt, width, height, options.steps, options.seed + i, source, keep, strength
            )
            for i in range(options.n)
        ]
        return self._answer(
            spec, jobs, options, responder, "image_edit", image_tokens(width, height)
        )

    def _spec(self, model: str | None, context: RequestContext) -> ModelSpec:
        """The model named; none named, or one of OpenAI's image models that this server
        does not have (dall-e-3, gpt-image-1: what LibreChat and older clients send), the
        first image model this server serves."""
        models = self.service.models
        if model is None or (model.startswith(OPENAI_IMAGE_MODELS) and not models.knows(model)):
            model = models.first_of_kind("image") or model
        return self.service.models.resolve_kind(
            model, context, "image", "it does not generate images", "model_not_image"
        )

    def _answer(
        self,
        spec: ModelSpec,
        jobs: list[ImageJob],
        options: ImageOptions,
        responder: Responder,
        event: str,
        input_image_tokens: int = 0,
    ) -> dict | None:
        if options.stream:
            jobs = [_with_previews(job, options.partial_images) for job in jobs]
        rendered = self.service.media.render(spec, jobs, responder.client_gone)
        usage = _Usage(options, input_image_tokens, responder.context)
        if options.stream:
            _stream(responder, rendered, usage, options, event)
            return None
        data = [self._item(image, options, responder) for image in usage.counting(rendered)]
        return {
            "created": int(time.time()),
            "data": data,
            "background": "opaque",
            "output_format": options.output_format,
            "quality": options.quality,
            "size": options.size,
            "usage": usage.body(),
        }

    def _item(self, image: Rendered, options: ImageOptions, responder: Responder) -> dict:
        data = encode(image.image, options.output_format, options.compression)
        if options.response_format == "b64_json":
            return {"b64_json": base64.b64encode(data).decode()}
        fmt = OUTPUT_FORMATS[options.output_format]
        path = self.links.add(data, fmt.content_type, fmt.extension)
        return {"url": f"{_origin(responder)}{path}"}


class _Usage:
    """OpenAI's image usage: the prompt's text tokens (and an edit's image tokens) in,
    the DiT's image tokens out; metered for the request's key when the last is done."""

    def __init__(self, options: ImageOptions, input_image_tokens: int, context: RequestContext):
        self._context = context
        self.text_tokens = 0
        self.image_tokens_in = input_image_tokens
        self.image_tokens_out = 0
        self.images = 0
        self._per_image = image_tokens(options.width, options.height)

    def counting(self, rendered: Iterator[Rendered]) -> Iterator[Rendered]:
        for image in rendered:
            if image.final:
                self.text_tokens = image.prompt_tokens
                self.images += 1
                self.image_tokens_out += self._per_image
            yield image
        self._context.meter(
            Metered(
                prompt_tokens=self.text_tokens + self.image_tokens_in,
                completion_tokens=self.image_tokens_out,
                images=self.images,
            )
        )

    def body(self, images: int | None = None) -> dict:
        """The request's usage, or (`images`) that of so many of its images."""
        output = self.image_tokens_out if images is None else images * self._per_image
        prompt = self.text_tokens + self.image_tokens_in
        return {
            "input_tokens": prompt,
            "input_tokens_details": {
                "text_tokens": self.text_tokens,
                "image_tokens": self.image_tokens_in,
            },
            "output_tokens": output,
            "output_tokens_details": {"image_tokens": output, "text_tokens": 0},
            "total_tokens": prompt + output,
        }


def _stream(
    responder: Responder,
    rendered: Iterator[Rendered],
    usage: _Usage,
    options: ImageOptions,
    event: str,
) -> None:
    """OpenAI's image stream: `{event}.partial_image` events (partial_image_index counts
    each image's from 0), then `{event}.completed` with the image and its usage, for each
    image in turn."""
    sse = SSEWriter(responder)
    shared = {
        "background": "opaque",
        "output_format": options.output_format,
        "quality": options.quality,
        "size": options.size,
    }
    partials = 0
    try:
        for image in usage.counting(rendered):
            data = encode(image.image, options.output_format, options.compression)
            body = {
                "b64_json": base64.b64encode(data).decode(),
                "created_at": int(time.time()),
                **shared,
            }
            if image.final:
                partials = 0
                name = f"{event}.completed"
                sse.event({"type": name, **body, "usage": usage.body(images=1)}, name)
            else:
                name = f"{event}.partial_image"
                sse.event({"type": name, **body, "partial_image_index": partials}, name)
                partials += 1
        sse.close()
    except Exception as e:
        sse.event(error_body(stream_failure(sse, e)), "error")
        sse.close()


def _with_previews(job: ImageJob, count: int) -> ImageJob:
    return replace(job, previews=count)


def _options(wire: GenerationBody, width: int, height: int) -> ImageOptions:
    if wire.background == "transparent":
        raise bad_request(
            "This model draws opaque images: background must be opaque or auto.", "background"
        )
    stream = bool(wire.stream)
    if wire.partial_images and not stream:
        raise bad_request("partial_images needs stream: true.", "partial_images")
    if stream and wire.response_format == "url":
        raise bad_request("A streamed reply carries its images as b64_json.", "response_format")
    quality = wire.quality or "auto"
    return ImageOptions(
        n=wire.n or 1,
        width=width,
        height=height,
        size=f"{width}x{height}",
        quality={"auto": "medium", "standard": "medium", "hd": "high"}.get(quality, quality),
        response_format=wire.response_format or "b64_json",
        output_format=wire.output_format or "png",
        compression=wire.output_compression,
        stream=stream,
        partial_images=wire.partial_images or 0,
        seed=wire.seed if wire.seed is not None else secrets.randbelow(MAX_SEED - MAX_IMAGES),
        steps=wire.steps,
    )


def _size(size: str, source: tuple[int, int] | None) -> tuple[int, int]:
    """(width, height): `size` WIDTHxHEIGHT, or auto (an edit's source size, scaled down
    to fit, else DEFAULT_SIZE). Each side a multiple of 16 from MIN_SIDE to MAX_SIDE."""
    if size == "auto":
        if source is None:
            size = DEFAULT_SIZE
        else:
            scale = min(1.0, MAX_SIDE / max(source))
            width, height = (int(side * scale) // PATCH * PATCH for side in source)
            if min(width, height) < MIN_SIDE:
                raise bad_request(
                    f"The image is {source[0]}x{source[1]}: each side must be at least "
                    f"{MIN_SIDE} pixels.",
                    "image",
                )
            return width, height
    parts = size.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise bad_request(f"size must be WIDTHxHEIGHT (e.g. {DEFAULT_SIZE}) or auto.", "size")
    width, height = int(parts[0]), int(parts[1])
    for side in (width, height):
        if not MIN_SIDE <= side <= MAX_SIDE or side % PATCH:
            raise bad_request(
                f"size {size}: each side must be a multiple of {PATCH} from {MIN_SIDE} to "
                f"{MAX_SIDE} pixels.",
                "size",
            )
    return width, height


FORM_FIELDS = tuple(GenerationBody.model_fields)


def _edit_body(form: Form) -> GenerationBody:
    """The form's fields as the JSON body's (numbers and flags arrive as text)."""
    values: dict[str, object] = {}
    for name in FORM_FIELDS:
        text = form.text(name)
        if text is None or name == "model":
            continue
        numeric = name in ("n", "output_compression", "partial_images", "seed", "steps")
        if numeric or name == "stream":
            try:
                values[name] = json.loads(text.lower() if name == "stream" else text)
            except ValueError as e:
                raise bad_request(
                    f"{name} must be a {'flag' if name == 'stream' else 'number'}.", name
                ) from e
        else:
            values[name] = text
    return parse(GenerationBody, json.dumps(values).encode())


def _strength(text: str | None, masked: bool) -> float:
    if text is None or text == "":
        return 1.0 if masked else DEFAULT_EDIT_STRENGTH
    try:
        strength = float(text)
    except ValueError:
        strength = -1.0
    if not 0.0 < strength <= 1.0:
        raise bad_request("strength must be a number above 0, at most 1.", "strength")
    return strength


def _origin(responder: Responder) -> str:
    """This server as the client reached it (a link must work from where it asked)."""
    host = responder.header("Host") or "localhost"
    scheme = responder.header("X-Forwarded-Proto") or "http"
    return f"{scheme}://{host}"
