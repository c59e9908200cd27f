"""Text-to-image models (mlx-vlm's diffusion pipelines), rendered a piece at a time (a
DiT block, a VAE convolution: see pieces.py) so that a render shares the generation
thread with chat streams (service.py) and a client that leaves stops it at the next
piece.

mlx-vlm's pipelines run a whole render in one call. For the families served here the
loop is driven from outside, with the pipeline's own components (text encoder, DiT,
scheduler, VAE) and the same operations in the same order, so that a render is the
library's own `generate_array` / `edit_array` byte for byte (tests/test_image_generation.py
checks it). Z-Image (Tongyi-MAI/Z-Image and Z-Image-Turbo) is the family served; the other
families mlx-vlm loads are refused at load with a message that says so."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from mlxserve.compat import img2img_start_index, z_image_conditioning, z_image_ready
from mlxserve.images.pieces import in_parts, mark_pipeline
from mlxserve.protocol.errors import bad_request

SERVED_FAMILIES = ("z_image",)
VAE_SCALE = 8  # a latent cell covers 8x8 pixels
PATCH = 16  # the DiT's image token: 2x2 latent cells


@dataclass(frozen=True)
class ImageJob:
    """One image to render: from noise, or (an edit) from `source`."""

    prompt: str
    width: int
    height: int
    steps: int | None  # None: the model's default
    seed: int
    source: np.ndarray | None = None  # an edit's image, (height, width, 3) uint8
    keep: np.ndarray | None = None  # an edit's mask: True where the source stays
    strength: float = 0.6  # how much of the source an edit redraws (0, 1]
    previews: int = 0  # partial images to make on the way


def image_tokens(width: int, height: int) -> int:
    """The DiT's sequence length for an image of this size (what usage counts)."""
    return (width // PATCH) * (height // PATCH)


class ImageModel:
    """A loaded text-to-image pipeline (generation thread only, except the tokenizer)."""

    def __init__(self, pipeline: Any, family: str, sink: Any):
        self.pipeline = pipeline
        self.family = family
        self.sink = sink  # where its marked modules record their outputs (pieces.py)
        config = pipeline.config
        self.default_steps: int = config.default_steps
        self.edit_steps = 8 if config.variant == "turbo" else 50  # mlx-vlm's edit defaults
        self.guidance: float = config.default_guidance

    @classmethod
    def load(cls, path: Path) -> ImageModel:
        from mlx_vlm.generate.image import image_generation_model_class

        model_class = image_generation_model_class(str(path))
        family = getattr(model_class, "model_type", None)
        if family not in SERVED_FAMILIES:
            raise bad_request(
                f"'{path.name}' is a {family} image pipeline; mlxserve renders "
                f"{', '.join(SERVED_FAMILIES)} pipelines (Z-Image, Z-Image-Turbo).",
                "model",
                "model_load_failed",
            )
        from mlx_vlm.models.z_image.pipeline import ZImagePipeline

        pipeline = ZImagePipeline(path, evict_text_encoder=False)  # kept: a server's
        z_image_ready(pipeline)
        return cls(pipeline, family, mark_pipeline(pipeline))

    def parameters(self) -> dict:
        """The weights (what residency counts)."""
        p = self.pipeline
        return {
            "text_encoder": p.text_encoder.parameters(),
            "transformer": p.transformer.parameters(),
            "vae": p.vae.parameters(),
        }

    def prompt_tokens(self, prompt: str) -> int:
        return int(self.pipeline.count_prompt_tokens(prompt))

    def begin(self, job: ImageJob) -> Render:
        if job.steps is None:
            steps = self.default_steps if job.source is None else self.edit_steps
            job = replace(job, steps=steps)
        if job.source is None and job.steps is not None and job.steps < 2:
            raise bad_request("A Z-Image render takes at least 2 steps.", "steps")
        return Render(self, job, self.prompt_tokens(job.prompt))


class Render:
    """One image's render, run a piece at a time: `step()` until `image` is set.
    The pieces: the prompt's encoding, each DiT block of each denoising step, each VAE
    convolution of the decode (and of an edit's encode, and of a partial image's decode)."""

    def __init__(self, model: ImageModel, job: ImageJob, prompt_tokens: int):
        self.prompt_tokens = prompt_tokens
        self.image: np.ndarray | None = None
        self._model, self._job = model, job
        self._work = self._run()
        self._preview: np.ndarray | None = None

    def step(self) -> np.ndarray | None:
        """The next piece; a partial image where one is ready (else None)."""
        self._preview = None
        next(self._work, None)
        return self._preview

    def _run(self) -> Iterator[None]:
        import mlx.core as mx
        from mlx_vlm.models.mage_flow.scheduler import FlowMatchEulerDiscreteScheduler

        pipeline, job, sink = self._model.pipeline, self._job, self._model.sink
        config, guidance, steps = pipeline.config, self._model.guidance, job.steps or 0
        cap, negative = z_image_conditioning(pipeline, job.prompt, guidance)
        yield
        mask: Any = None
        if job.source is None:
            # Upstream skips the terminal zero timestep: N steps are N - 1 forwards.
            shape = (1, 16, 1, 2 * (job.height // PATCH), 2 * (job.width // PATCH))
            latents = mx.random.normal(shape, key=mx.random.key(job.seed), dtype=mx.float32)
            scheduler = FlowMatchEulerDiscreteScheduler(
                num_inference_steps=steps - 1, shift=config.scheduler_shift
            )
            start = 0
        else:
            pixels = mx.array(job.source, dtype=mx.float32)[None] / 127.5 - 1.0
            source = yield from in_parts(lambda: pipeline.vae.encode(pixels), sink)
            source = (source - config.vae.shift_factor) * config.vae.scaling_factor
            source = source.transpose(0, 3, 1, 2)[:, :, None]
            mx.eval(source)
            scheduler = FlowMatchEulerDiscreteScheduler(
                num_inference_steps=steps, shift=config.scheduler_shift
            )
            start = img2img_start_index(steps, job.strength)
            noise = mx.random.normal(source.shape, key=mx.random.key(job.seed), dtype=mx.float32)
            sigma = scheduler.sigmas[start].astype(source.dtype)
            latents = (1.0 - sigma) * source + sigma * noise
            if job.keep is not None:
                mask = mx.array(_latent_edit_mask(job.keep))[None, None, None]
        end = len(scheduler.sigmas) - 1
        previews = _preview_steps(start, end, job.previews)
        for i in range(start, end):
            t = (1.0 - scheduler.sigmas[i]).reshape(1)

            def predict(latents=latents, t=t) -> Any:
                prediction = pipeline.transformer(latents, t, cap)
                if negative is not None:  # guidance all the way (cfg_truncation 1.0)
                    unguided = pipeline.transformer(latents, t, negative)
                    prediction = prediction + guidance * (prediction - unguided)
                return prediction

            prediction = yield from in_parts(predict, sink)
            stepped = scheduler.step(velocity=-prediction, step_index=i, latents=latents)
            if mask is not None:
                sigma = scheduler.sigmas[i + 1].astype(source.dtype)
                known = (1.0 - sigma) * source + sigma * noise
                stepped = mask * stepped + (1.0 - mask) * known
            mx.eval(stepped)
            if i + 1 in previews:
                # The clean image the model predicts from here (flow matching:
                # x0 = x - sigma * v, the velocity being -prediction)
                sigma = scheduler.sigmas[i].astype(latents.dtype)
                self._preview = yield from self._decode(latents + sigma * prediction)
            latents = stepped
        self.image = yield from self._decode(latents)

    def _decode(self, latents: Any) -> Generator[None, None, np.ndarray]:
        """mlx-vlm's `_decode_latents`, a VAE convolution at a time; the masked edit's kept
        pixels are the source's own."""
        import mlx.core as mx

        pipeline, job = self._model.pipeline, self._job
        vae = pipeline.config.vae
        z = latents.squeeze(2).transpose(0, 2, 3, 1)
        z = (z / vae.scaling_factor) + vae.shift_factor
        decoded = yield from in_parts(lambda: pipeline.vae.decode(z), self._model.sink)
        images = mx.clip(decoded / 2.0 + 0.5, 0.0, 1.0)
        image = np.array(mx.round(images * 255.0).astype(mx.uint8)[0])
        if job.keep is None or job.source is None:
            return image
        return np.where(job.keep[..., None], job.source, image)


def _latent_edit_mask(keep: np.ndarray) -> np.ndarray:
    """1.0 on each latent cell with any pixel to redraw, 0.0 where the source stays."""
    h, w = keep.shape
    cells = (~keep).reshape(h // VAE_SCALE, VAE_SCALE, w // VAE_SCALE, VAE_SCALE)
    return np.asarray(cells.any(axis=(1, 3)), dtype=np.float32)


def _preview_steps(start: int, end: int, previews: int) -> frozenset[int]:
    """After which steps the partial images come: evenly spread, never the last."""
    count = end - start
    marks = {start + round(k * count / (previews + 1)) for k in range(1, previews + 1)}
    return frozenset(m for m in marks if start < m < end)
