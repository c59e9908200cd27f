"""Vision rows of the continuous batch: a vision-language model's rows (text-only and
image rows alike, through `vision_model.VisionBatchModel`), each prompt processed in
chunks with its images.

The vision encoder runs once per prompt, on a thread of its own (`Encoder`: a large
image's encoder pass costs as much as many prefill chunks, and the streams beside it must
go on meanwhile), and each chunk takes its slice of the merged embeddings and of the whole
prompt's positions (`VisionRow`), as mlx-vlm's own `generate_step` feeds them.
`VisionFeature` is what the batch asks of them (a `row_feature.RowFeature`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxserve.engine.continuous.row_feature import Forwarded, PromptFailed, RowFeature
from mlxserve.engine.continuous.rows import WaitingPrompt
from mlxserve.engine.continuous.vision_model import VisionBatchModel
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.protocol.errors import internal_error

log = logging.getLogger(__name__)

# Where ranks run in lockstep: how often rank 0, its images encoded, asks whether the
# other ranks are done too while nothing else runs (each ask is a published step)
ENCODING_ELSEWHERE_POLL_SECONDS = 0.005
# What get_input_embeddings returns beside the embeddings for families whose embeddings
# are the text's with each image's rows merged in: positions (recomputed from the prompt)
# and Gemma 3's two-way mask (which its language model does not take).
_POSITIONS_ONLY = frozenset({"position_ids", "rope_deltas", "attention_mask_4d"})


@dataclass
class VisionRow:
    """What a waiting vision row's chunks need besides its tokens: the whole prompt's
    merged embeddings where images lie past the cached prefix (None where none do), and
    the language model's keyword arguments for the whole prompt (its positions among
    them)."""

    embeds: mx.array | None
    kwargs: dict[str, Any]

    @classmethod
    def prepare(cls, model: VisionBatchModel, job: GenerationJob, cached: int) -> VisionRow:
        """Run the vision encoder if images remain past the `cached` prefix (a cached
        prefix holds every image or none, see `PromptImages.reusable`)."""
        images = job.images
        tokens = mx.array(job.prompt)[None]
        if images is None or not images.images_after(cached):
            return cls(None, _positions(model, tokens, images))
        keys = [images.cache_tokens[start] for start, _ in images.spans]
        distinct = len(set(keys)) == len(keys)  # else images and runs are not paired
        rows = model.features.get(keys) if distinct else None
        if rows is not None:
            text = model.vlm.get_input_embeddings(tokens, None).inputs_embeds
            return cls(_merged(text, images.spans, rows), _positions(model, tokens, images))
        extra = dict(images.extra)
        features = model.vlm.get_input_embeddings(
            tokens, images.pixel_values, mask=images.attention_mask, **extra
        )
        found = {k: v for k, v in features.to_dict().items() if v is not None}
        embeds = found.pop("inputs_embeds")
        if distinct and set(found) <= _POSITIONS_ONLY:
            # copies: a slice would keep the whole prompt's embeddings alive
            rows = [mx.array(embeds[:, start:end]) for start, end in images.spans]
            mx.eval(rows)
            model.features.put(keys, rows)
        return cls(embeds, {**extra, **found})

    def start(self, model: VisionBatchModel, cache: list[Any]) -> None:
        """Give the row's RoPE delta cache (if it has one) this prompt's delta."""
        deltas = self.kwargs.get("rope_deltas")
        if deltas is not None and model.mrope:
            cache[model.layers_count].deltas = deltas.reshape(1, 1).astype(mx.int32)

    def process(
        self,
        model: VisionBatchModel,
        tokens: list[int],
        start: int,
        cache: list[Any],
        hidden: bool = False,
    ) -> mx.array | None:
        """Process `tokens`, the prompt's tokens from position `start`, into `cache`; the
        final hidden states at those positions if `hidden` (an MTP head's input)."""
        layers = cache[: model.layers_count]
        end = start + len(tokens)
        embeds = self.embeds[:, start:end] if self.embeds is not None else None
        outputs = model.language_model(
            mx.array(tokens)[None],
            inputs_embeds=embeds,
            cache=layers,
            **self.kwargs,
            **({"return_hidden": True} if hidden else {}),
        )
        cache[: len(layers)] = layers  # mlx-vlm's per-row paths replace entries of the list
        return outputs.hidden_states[-1] if hidden else None


def _positions(model: VisionBatchModel, tokens: mx.array, images: Any) -> dict[str, Any]:
    """The language model's keyword arguments for a prompt whose images are not encoded
    now: the processor's outputs, and a Qwen-VL prompt's positions (images included)."""
    extra = dict(images.extra) if images is not None else {}
    if model.mrope:
        positions, deltas = model.language_model.get_rope_index(
            tokens,
            extra.get("image_grid_thw"),
            extra.get("video_grid_thw"),
            images.attention_mask if images is not None else None,
        )
        extra.update(position_ids=positions, rope_deltas=deltas)
    return extra


def _merged(text: mx.array, spans: tuple[tuple[int, int], ...], rows: list[mx.array]) -> mx.array:
    """The text's embeddings with each image's rows in its span."""
    parts, done = [], 0
    for (start, end), row in zip(spans, rows, strict=True):
        parts += [text[:, done:start], row]
        done = end
    return mx.concatenate([*parts, text[:, done:]], axis=1)


class Encoder:
    """Vision rows' images through the vision encoder, one prompt at a time, on a thread
    of its own. MLX gives each thread its own default stream (from 0.31.2): the row's
    arrays are evaluated here, so nothing the generation thread then runs depends on work
    in flight on this thread."""

    def __init__(self, wake: Callable[[], None]):
        """`wake`: called when a prompt's encoding ends (the generation loop may wait)."""
        self._wake = wake
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vision-encoder")

    def submit(self, model: VisionBatchModel, job: GenerationJob, cached: int) -> Future[VisionRow]:
        future = self._pool.submit(_encoded, model, job, cached)
        future.add_done_callback(lambda _: self._wake())
        return future

    def close(self) -> None:
        """Stop the thread (after the encoding it runs): a thread of MLX's still running
        when the process exits aborts it."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _encoded(model: VisionBatchModel, job: GenerationJob, cached: int) -> VisionRow:
    row = VisionRow.prepare(model, job, cached)
    mx.eval(row.embeds, [v for v in row.kwargs.values() if isinstance(v, mx.array)])
    return row


@dataclass(eq=False)
class _Images:
    """A waiting prompt's images: in the encoder (`encoding`), then ready (`row`)."""

    row: VisionRow | None = None
    encoding: Future[VisionRow] | None = None


class VisionFeature(RowFeature):
    """The batch's rows of a vision model. Their state is more than their caches (the
    encoder's output), so idle rows are not parked."""

    parks = False

    def __init__(
        self,
        model: VisionBatchModel,
        wake: Callable[[], None],
        worst: Callable[[float], float],
        running: Callable[[], bool],
        hidden: bool,
    ):
        """`wake`: wakes the generation loop, waiting for work, when a prompt's images are
        through the encoder; `worst`: the largest of every rank's value (see
        engine.loop.loop_step); `running`: whether rows run; `hidden`: a drafter reads
        the model's hidden states of the prompt's passes."""
        self._model = model
        self._encoder = Encoder(wake)
        self._worst = worst
        self._running = running
        self._hidden = hidden

    def waits(self, waiting: WaitingPrompt) -> bool:
        images = waiting.state.get(self)
        return images is not None and images.encoding is not None and not images.encoding.done()

    def ready(self, waiting: WaitingPrompt) -> bool:
        """Whether the prompt's images are through the encoder, which runs on a thread of
        its own so that the streams beside it go on meanwhile (no images: at once)."""
        images = waiting.state.setdefault(self, _Images())
        if images.row is not None:
            return True
        job = waiting.jobs[0]
        done = len(job.prompt) - len(waiting.hit.rest)
        if images.encoding is None:
            if job.images is None or not job.images.images_after(done):
                images.row = VisionRow.prepare(self._model, job, done)  # no encoder
            else:
                images.encoding = self._encoder.submit(self._model, job, done)
                return False
        elif not self._encoded_everywhere(images.encoding):
            return False
        else:
            try:
                images.row = images.encoding.result()
            except Exception as e:
                log.exception("encoding a prompt's images failed")
                raise PromptFailed(internal_error(f"Encoding the images failed: {e}")) from e
        images.row.start(self._model, waiting.hit.cache)
        return True

    def _encoded_everywhere(self, encoding: Future[VisionRow]) -> bool:
        """Whether a prompt's images are through the encoder; where ranks run in lockstep,
        on every rank: each encodes them on a thread of its own, done at its own moment,
        and every rank must take the row at the same step (its model calls hold
        collectives). Rank 0, done first, steps on and asks again each step, a moment
        apart where no stream paces its steps."""
        here = encoding.done()
        everywhere = not self._worst(float(not here))
        if here and not everywhere and not self._running():
            time.sleep(ENCODING_ELSEWHERE_POLL_SECONDS)
        return everywhere

    def whole_prompt(self, waiting: WaitingPrompt) -> bool:
        """Where images remain, the language model's caches take the prompt here (the
        batch feeds tokens; text after the images it places by the row's RoPE delta)."""
        row = waiting.state[self].row
        return row is not None and row.embeds is not None

    def forward(
        self, waiting: WaitingPrompt, tokens: list[int], start: int, caches: list[Any]
    ) -> Forwarded:
        row = waiting.state[self].row
        return Forwarded(row.process(self._model, tokens, start, caches, hidden=self._hidden))

    def live_bytes(self) -> int:
        return self._model.features.nbytes  # the kept image features

    def close(self) -> None:
        self._encoder.close()
