"""A vision-language model as the continuous batch calls a text model.

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
- the vision encoder's output for each image kept (`ImageFeatures`), so a later prompt
  with the same image skips the encoder even where the prompt cache cannot help (other
  text before the image); the tower run a block at a time (`EvaluatedBlock`).

A row's prompt is processed with its images by `vision_rows.py`.

Why not mlx-vlm's BatchGenerator (`mlx_vlm/generate/ar.py`): it is a second engine, with
its own prompt cache, scheduler and drafters; every feature of ours (the shared prompt
cache and disk tier, chunked fair prefill, prompt-lookup speculation, constraints,
checkpoints, lockstep) would need writing again against it. Its language models already
take per-row cache offsets and RoPE deltas, which is all a row of ours needs.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import cache as lm_cache
from mlx_vlm.models import cache as vlm_cache

from mlxserve.compat import batched_pass_kwargs, register_cache_class
from mlxserve.engine.continuous.row_entry import RowEntry
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
