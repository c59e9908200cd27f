"""Vision-language models in the continuous batch, beside their text-only rows.

The batch (`continuous_batch.ContinuousBatch`) drives mlx-lm's BatchGenerator, which calls
`model(tokens, cache=...)` for logits and merges, filters and extracts each row's caches.
`VisionBatchModel` gives an mlx-vlm model that shape:

- its language model's attention caches as mlx-lm's classes (the ones mlx-lm's batch
  merges), and its recurrent states (hybrid models: Qwen3.5) in mlx-vlm's own class,
  whose richer interface their layers call, under a name of ours (`VisionArraysCache`);
- for models that place tokens with multimodal RoPE (Qwen-VL: an image takes fewer
  positions than tokens), one more cache, `RopeDeltas`, holding each row's offset between
  its token count and its position. It travels with the row through merges, filters, the
  prompt cache and the disk tier, so each row decodes at its own positions;
- a row's prompt processed in chunks with its images (`VisionRow`): the vision encoder
  runs once, on a thread of its own (`Encoder`: a large image's encoder pass costs as
  much as many prefill chunks, and the streams beside it must go on meanwhile), and each
  chunk takes its slice of the merged embeddings and of the whole prompt's positions, as
  mlx-vlm's own `generate_step` feeds them. The encoder's output for each image is kept
  (`ImageFeatures`), so a later prompt with the same image skips the encoder even where
  the prompt cache cannot help (other text before the image).

Why not mlx-vlm's BatchGenerator (`mlx_vlm/generate/ar.py`): it is a second engine, with
its own prompt cache, scheduler and drafters; every feature of ours (the shared prompt
cache and disk tier, chunked fair prefill, prompt-lookup speculation, constraints,
checkpoints, lockstep) would need writing again against it. Its language models already
take per-row cache offsets and RoPE deltas, which is all a row of ours needs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import cache as lm_cache
from mlx_vlm.models import cache as vlm_cache

from mlxserve.compat import batched_pass_kwargs, register_cache_class
from mlxserve.engine.continuous.row_entry import RowEntry
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.wrapped_layer import WrappedLayer


class RopeDeltas(RowEntry):
    """Each row's RoPE delta (its next position minus its token count), shaped [rows, 1]."""

    def __init__(self, deltas: mx.array | None = None):
        self.deltas = deltas if deltas is not None else mx.zeros((1, 1), dtype=mx.int32)

    @property
    def state(self) -> list[mx.array]:
        return [self.deltas]

    @state.setter
    def state(self, value: list[mx.array]) -> None:
        (self.deltas,) = value

    @classmethod
    def from_state(cls, state: list[mx.array], meta_state: Any = None) -> RopeDeltas:
        return cls(state[0])

    @classmethod
    def merge(cls, caches: list[RopeDeltas]) -> RopeDeltas:
        return cls(mx.concatenate([c.deltas for c in caches]))

    def extend(self, other: RopeDeltas) -> None:
        self.deltas = mx.concatenate([self.deltas, other.deltas])

    def filter(self, batch_indices: Any) -> None:
        self.deltas = self.deltas[mx.array(batch_indices)]

    def extract(self, idx: int) -> RopeDeltas:
        return RopeDeltas(self.deltas[idx : idx + 1])

    @property
    def nbytes(self) -> int:
        return self.deltas.nbytes


class VisionArraysCache(vlm_cache.ArraysCache):
    """mlx-vlm's recurrent-state cache, which batches as mlx-lm's does; named apart so
    that the disk tier reads it back as itself, not as mlx-lm's `ArraysCache`."""

    @classmethod
    def from_state(cls, state: list[Any], meta_state: Any = None) -> VisionArraysCache:
        """As mlx-lm's `load_prompt_cache` calls it (state alone)."""
        cache = cls.__new__(cls)
        cache.state = state
        return cache


# the disk tier reads rows back through mlx-lm's load_prompt_cache
register_cache_class(RopeDeltas)
register_cache_class(VisionArraysCache)


def _batchable(cache: Any) -> Any:
    """An empty cache of the kind an mlx-vlm cache is, that mlx-lm's batch merges; an
    unknown kind stays as it is, and `can_batch` then refuses it."""
    if type(cache) is vlm_cache.KVCache:
        return lm_cache.KVCache()
    if type(cache) is vlm_cache.RotatingKVCache and cache.keep == 0:
        return lm_cache.RotatingKVCache(max_size=cache.max_size, keep=0)
    if type(cache) is vlm_cache.ArraysCache:
        return VisionArraysCache(len(cache.cache))
    return cache


# What get_input_embeddings returns beside the embeddings for families whose embeddings
# are the text's with each image's rows merged in: positions (recomputed from the prompt)
# and Gemma 3's two-way mask (which its language model does not take).
_POSITIONS_ONLY = frozenset({"position_ids", "rope_deltas", "attention_mask_4d"})
FEATURES_MAX_BYTES = 256 << 20


class ImageFeatures:
    """The vision encoder's output for the images a model saw lately: the rows each image
    took in its prompt's merged embeddings, keyed by the image's id in the prompt cache's
    tokens (a hash of its bytes and those of the images before it), least recently used
    dropped past FEATURES_MAX_BYTES. Touched on the encoder's thread only."""

    def __init__(self) -> None:
        self._rows: OrderedDict[int, mx.array] = OrderedDict()
        self.nbytes = 0  # read by the generation thread (the memory it holds)

    def get(self, keys: list[int]) -> list[mx.array] | None:
        if not all(key in self._rows for key in keys):
            return None
        for key in keys:
            self._rows.move_to_end(key)
        return [self._rows[key] for key in keys]

    def put(self, keys: list[int], rows: list[mx.array]) -> None:
        for key, row in zip(keys, rows, strict=True):
            if key not in self._rows:
                self._rows[key] = row
                self.nbytes += row.nbytes
        while self.nbytes > FEATURES_MAX_BYTES and self._rows:
            self.nbytes -= self._rows.popitem(last=False)[1].nbytes


class EvaluatedBlock(WrappedLayer):
    """A block of a vision tower that evaluates its output before the next block is
    built: the encoder thread then runs the tower a block at a time. Evaluated whole, the
    tower's graph held up the generation thread's steps for the whole of its attention
    over a large image on the test machine's CPU (0.44 s beside 4,096 patches; a block at
    a time, 0.04 s)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        output = self.layer(*args, **kwargs)
        leaves = [pair[1] for pair in tree_flatten(output)]
        mx.eval([leaf for leaf in leaves if isinstance(leaf, mx.array)])
        return output


def evaluate_by_blocks(tower: nn.Module) -> None:
    """Make each block of the vision tower's block lists an `EvaluatedBlock` (once)."""
    for module in tower.modules():
        for value in module.values():
            if isinstance(value, list):
                for i, block in enumerate(value):
                    if isinstance(block, nn.Module) and not isinstance(block, EvaluatedBlock):
                        value[i] = EvaluatedBlock(block)


class VisionBatchModel:
    """An mlx-vlm model as the batch calls a text model (see the module's docstring)."""

    def __init__(self, model: Any):
        self.vlm = model
        tower = getattr(model, "vision_tower", None)
        if isinstance(tower, nn.Module):
            evaluate_by_blocks(tower)
        self.features = ImageFeatures()
        self.language_model = model.language_model
        self.mrope = callable(getattr(self.language_model, "get_rope_index", None))
        # the language model's caches, first in a row's list (then the RoPE deltas', then
        # a draft model's, which mlx-lm's batch passes along and a model ignores)
        self.layers_count = len(vlm_cache.make_prompt_cache(self.language_model))

    @property
    def layers(self) -> Any:
        return self.language_model.layers

    def make_cache(self) -> list[Any]:
        caches = [_batchable(c) for c in vlm_cache.make_prompt_cache(self.language_model)]
        return [*caches, RopeDeltas()] if self.mrope else caches

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **kwargs: Any) -> Any:
        """Logits for `inputs` continuing each row's cache."""
        return self.outputs(inputs, cache, **kwargs).logits

    def outputs(self, inputs: mx.array, cache: list[Any] | None = None, **kwargs: Any) -> Any:
        """The language model's outputs for `inputs` continuing each row's cache (logits,
        and the final hidden states where `return_hidden` asks); a Qwen-VL row's tokens
        sit at its cache offset plus its RoPE delta."""
        if cache is None:
            return self.language_model(inputs, **kwargs)
        count = self.layers_count
        layers = cache[:count]
        kwargs.update(batched_pass_kwargs(self.language_model, inputs))
        if self.mrope:
            deltas = cache[count]
            offset = next(c.offset for c in layers if hasattr(c, "offset"))  # per row, batched
            offsets = offset if isinstance(offset, mx.array) else mx.array([offset])
            rows, length = inputs.shape
            start = offsets.reshape(-1, 1) + deltas.deltas
            positions = start + mx.arange(length)[None]
            kwargs["position_ids"] = mx.broadcast_to(positions[None], (3, rows, length))
        outputs = self.language_model(inputs, cache=layers, **kwargs)
        cache[:count] = layers  # mlx-vlm's per-row paths replace entries of the list
        return outputs


class VisionHiddenCapture:
    """A vision model as the batch calls it beside an MTP head (what `drafters.hidden`'s
    HiddenCapture is for a text model): `hidden` holds the last call's final hidden
    states (B x S x width), the ones its output head read, from the same pass."""

    def __init__(self, model: VisionBatchModel):
        self.inner = model
        self.hidden: mx.array | None = None

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        outputs = self.inner.outputs(inputs, cache, return_hidden=True)
        self.hidden = outputs.hidden_states[-1]
        return outputs.logits

    def make_cache(self) -> list[Any]:
        return self.inner.make_cache()


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


def batch_model(loaded_model: Any, vision: bool) -> Any:
    """What the batch calls: a text model as it is, a vision model wrapped."""
    return VisionBatchModel(loaded_model) if vision else loaded_model
