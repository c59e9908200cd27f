"""Every reach into mlx-lm's, mlx-vlm's and transformers' internals, in one place.

mlxserve needs a few names these libraries do not promise to keep (leading underscores,
the state of their generation classes). Each is named here once, with why; the unit test
tests/unit/test_compat.py checks every one against the installed versions, so an upgrade
that moves one fails there, by name, instead of inside a request. pyproject.toml bounds the
versions tested from above; move the bounds deliberately, with that test.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch

# The state of mlx-lm's GenerationBatch that the speculative batches read and write, only
# through GenerationBatchAdapter below: the next tokens and their logprobs, started before
# the current ones return; the tokens generated, the stop matchers, the processors'
# contexts, and the decode step its `next` calls.
GENERATION_BATCH_STATE = (
    "_next_tokens",
    "_next_logprobs",
    "_current_tokens",
    "_current_logprobs",
    "_num_tokens",
    "_matchers",
    "_token_context",
    "_step",
)

# The hook of mlx-lm's byte-level streaming detokenizer that drops a reply's leading
# space; models/tokenizer.py overrides it to keep text exact.
TRIM_SPACE_HOOK = "_maybe_trim_space"

# Attributes in which Qwen-VL language models (mlx-vlm) keep the last prompt's positions.
VISION_POSITION_STATE = ("_position_ids", "_rope_deltas")


def hf_tokenizer(wrapper: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's TokenizerWrapper: llguidance and the
    vocabulary tables read it, and a processor's chat template is set on it."""
    return wrapper._tokenizer


def detokenizer_prototype(wrapper: Any) -> Any:
    """The streaming detokenizer the wrapper copies for each sequence."""
    return wrapper._detokenizer


def set_detokenizer_prototype(wrapper: Any, detokenizer: Any) -> None:
    wrapper._detokenizer = detokenizer


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (character -> byte), for the bytes of a token."""
    from mlx_lm.tokenizer_utils import _byte_decoder

    return _byte_decoder()


def model_classes(config: dict) -> tuple[type, type]:
    """mlx-lm's (Model, ModelArgs) for a config, without loading weights (embedding
    models built headless)."""
    from mlx_lm.utils import _get_classes

    return _get_classes(config)


def install_generation_batch(generator: Any, batch: Any) -> None:
    """Make `batch` the generation batch of mlx-lm's BatchGenerator (which extends it in
    place as sequences join)."""
    generator._generation_batch = batch


def generation_batch(generator: Any) -> GenerationBatch:
    """The generation batch mlx-lm's BatchGenerator decodes now."""
    return generator._generation_batch


def prompt_stage(generator: Any) -> bool:
    """Whether mlx-lm's BatchGenerator holds rows not yet generating (queued, or in their
    prompt pass)."""
    return bool(generator._unprocessed_sequences) or bool(generator._currently_processing)


def settle(generator: Any) -> None:
    """Wait for the step mlx-lm's batch started ahead: it computes the next step while the
    caller reads this one's tokens, so work queued between two calls (a prompt, a row
    leaving) would first wait for that step too."""
    batch = generation_batch(generator)
    if batch.uids:
        mx.eval(batch._next_tokens, batch._next_logprobs)


def empty_like(batch: GenerationBatch) -> GenerationBatch:
    """An empty generation batch of `batch`'s class, on its model and fallback sampler."""
    return type(batch).empty(batch.model, batch.fallback_sampler)


def mend_window_masks() -> None:
    """mlx-lm's BatchRotatingKVCache (a sliding window) builds the mask of a pass over
    several tokens from the trim its update will make at the window's front, computed from
    `_idx`; once single-token steps have rotated the window, `_idx` is the write position,
    not the window's length, so a left-padded row loses its oldest in-window entry to the
    mask. mlx-lm never mixes the two (a prompt, then one token a step); a speculative batch
    does, every verify pass. The mask is made after putting the window in temporal order
    (`_temporal_order`, which the update does first anyway). Idempotent."""
    from mlx_lm.models.cache import BatchRotatingKVCache

    original = BatchRotatingKVCache.make_mask
    if getattr(original, "mended", False):
        return

    @functools.wraps(original)
    def make_mask(self, N: int, window_size: Any = None, return_array: bool = False) -> Any:
        if N > 1 and self.rotated:
            self._temporal_order()
        return original(self, N, window_size=window_size, return_array=return_array)

    make_mask.mended = True  # type: ignore[attr-defined]
    BatchRotatingKVCache.make_mask = make_mask  # type: ignore[method-assign]


def gated_delta_layers() -> tuple[type, ...]:
    """mlx-lm's gated delta-net layers (Qwen3-Next, Qwen3.5): each convolves its input
    with one depthwise `conv1d`, whose window it keeps in cache slot 0, and folds it into
    the state in slot 1 with its module's `gated_delta_update`."""
    from mlx_lm.models import qwen3_5, qwen3_next

    return (qwen3_next.Qwen3NextGatedDeltaNet, qwen3_5.GatedDeltaNet)


def route_gated_delta_updates(wrap: Any) -> None:
    """Route those layers' `gated_delta_update` (a global of each layer's module, read at
    each call) through `wrap(original)`, once."""
    for layer in gated_delta_layers():
        module: Any = sys.modules[layer.__module__]
        if not getattr(module.gated_delta_update, "routed", False):
            routed = wrap(module.gated_delta_update)
            routed.routed = True
            module.gated_delta_update = routed


def batched_pass_kwargs(language_model: Any, inputs: Any) -> dict[str, Any]:
    """What keeps mlx-vlm's Qwen3.5 language model (`Qwen3_5Model`, its MoE sibling's too)
    to one batched call over a pass of several tokens: asked for no hidden states
    (`capture_layer_ids` empty, its `hidden_sink` then a list), it masks each row's left
    padding (mlx-lm's batch caches make the masks) instead of running the rows one at a
    time and merging their caches anew. A verify pass needs that: the recurrent caches'
    speculation records (`ArraysCache.start_speculation`) live on the cache objects."""
    from mlx_vlm.models.qwen3_5.language import Qwen3_5Model

    splits = isinstance(getattr(language_model, "model", None), Qwen3_5Model)
    return {"capture_layer_ids": []} if splits and inputs.shape[1] > 1 else {}


def roll_back_window(cache: Any, shared: int, rest: list[int]) -> None:
    """Take the positions rows did not keep out of a BatchRotatingKVCache (a sliding
    window): `shared` from every row, `rest[i]` more from row i.

    The model's pass over several tokens writes by concatenation, after the window's last
    `max_size - 1` tokens, nothing overwritten: the cache is in temporal order and its
    last positions are the pass's. `trim` moves only the cache's end (`_idx`, the 7th
    item of `state`); the entries past it are cut here, or the next single-token step,
    which sizes the window by the array, would keep them. A row's extra positions become
    its left padding, as `finalize` turns right padding into left padding (`prepare`'s
    `lengths` count from the current offsets, so `-rest` marks the rows' ends; the
    padding is the 4th item of `state`).

    A window written one token at a time since (`rotated`, the last item of `state`: a
    draft model's chain) has overwritten entries the rollback would need: a draft model's
    window goes back to its state before the chain instead (`window_state`)."""
    assert not cache.state[-1], "a window written in place cannot give back its drafts"
    if shared:
        cache.trim(shared)
        keys, values, *middle, end, rotated = cache.state
        cache.state = (keys[..., :end, :], values[..., :end, :], *middle, end, rotated)
    if any(rest):
        # A negative left padding counts entries a full window has dropped: start from none,
        # so that the padding `finalize` adds covers exactly the rolled-in positions.
        keys, values, offset, padding, *more = cache.state
        cache.state = (keys, values, offset, mx.maximum(padding, 0), *more)
        cache.prepare(lengths=[-n for n in rest], right_padding=rest)
        cache.finalize()


def window_state(cache: Any) -> tuple:
    """A BatchRotatingKVCache's `state`, its arrays copied: a single-token step writes its
    keys and values (`keys[..., i, :] = ...`) and its left padding (`-=`) in place, which
    every reference to the same array object sees; an indexed copy keeps what they held."""
    return copied(cache.state)


def copied(items: Any) -> tuple:
    """`items` with each mlx array among them copied (mlx's `a[i] = ...` and `a -= n`
    change the array object itself, not a new one)."""
    return tuple(item[...] if isinstance(item, mx.array) else item for item in items)


def loaded_classes(module: str, name: str) -> tuple[Any, ...]:
    """The class `module.name` if that module has been imported, else none: mlx-vlm (and
    our modules built on it) is imported once a vision model is served, not by a text
    server, whose start its import would slow by most of a second. No object of a class
    not imported yet exists, so an isinstance check against the result is exact."""
    found = sys.modules.get(module)
    return (getattr(found, name),) if found is not None else ()


def register_cache_class(cls: type) -> None:
    """mlx-lm's `load_prompt_cache` finds each cache's class by name among its module's
    names: a cache class of ours (engine/continuous/vision_model.py's RopeDeltas) is added there, so
    the disk tier reads it back."""
    import mlx_lm.models.cache

    setattr(mlx_lm.models.cache, cls.__name__, cls)


def forget_vision_positions(language_model: Any) -> None:
    """Qwen-VL language models keep the last request's positions; the next request
    computes its own."""
    for name in VISION_POSITION_STATE:
        if hasattr(language_model, name):
            setattr(language_model, name, None)


def compile_chat_template(template: str) -> None:
    """Compile a chat template as transformers will render it (its sandbox, and the
    extensions it adds, such as `{% generation %}`), so that a broken --chat-template stops
    the server at start instead of failing every chat; raises jinja2's TemplateError."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    _compile_jinja_template(template)


def z_image_ready(pipeline: Any) -> None:
    """Read a Z-Image pipeline's DiT and VAE now (mlx-vlm reads them on first use), so
    that a loaded image model's weights are all resident and counted."""
    pipeline._ensure_components()


def z_image_conditioning(pipeline: Any, prompt: str, guidance: float) -> tuple[Any, Any]:
    """(the prompt's features, the empty prompt's when guidance is on, else None), as
    mlx-vlm's Z-Image pipeline computes them before it denoises (its text encoder kept:
    the pipeline is made with evict_text_encoder=False)."""
    return pipeline._encode_conditioning(prompt, guidance=guidance, negative_prompt=None)


def img2img_start_index(steps: int, strength: float) -> int:
    """The denoising step a Z-Image edit starts from, as mlx-vlm's edit_array picks it."""
    from mlx_vlm.models.z_image.pipeline import _img2img_start_index

    return int(_img2img_start_index(steps, strength))


class GenerationBatchAdapter(GenerationBatch):
    """mlx-lm's GenerationBatch, its private state given typed public names: the only code
    that reads or writes that state (engine/speculation/verify.py and head_drafts.py build
    on this). A subclass, not a wrapper: mlx-lm's BatchGenerator builds, extends and
    filters the batch it holds and calls its `next`, so a decode step of ours must be that
    object (see install_generation_batch)."""

    _current_tokens: Any  # mlx-lm starts them as None
    _current_logprobs: Any

    @property
    def next_tokens(self) -> mx.array:
        """Each row's next token, its computation started before the current ones return."""
        return self._next_tokens

    @property
    def next_logprobs(self) -> list[mx.array]:
        return self._next_logprobs

    def advance(self, tokens: mx.array, logprobs: list[mx.array]) -> None:
        """The next tokens become the current ones, and `tokens` (with their `logprobs`)
        the next: what mlx-lm's own step leaves behind."""
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        self._next_tokens = tokens
        self._next_logprobs = logprobs

    @property
    def generated(self) -> list[int]:
        """How many tokens each row has generated (its token limit counts these)."""
        return self._num_tokens

    def stops_at(self, row: int, token: int) -> bool:
        """Feed a row's stop matcher `token`: whether the row ends there."""
        return bool(self._matchers[row].advance(token))

    def token_context(self, row: int) -> Any:
        """The tokens a row's logits processors see (updated as mlx-lm's step does)."""
        return self._token_context[row]

    def tokens_seen(self, row: int) -> mx.array:
        """The tokens in a row's token context, which stays as it is (mlx-lm's TokenBuffer
        holds them in a padded array, the first `_size` of it)."""
        context = self._token_context[row]
        return context.state[: context._size]

    def _step(self) -> Any:
        """mlx-lm's decode step, which its `next` calls: routed to `decode_step`, a public
        name subclasses override."""
        return self.decode_step()

    def decode_step(self) -> Any:
        """mlx-lm's own decode step, unchanged (override to work around it; call super)."""
        return GenerationBatch._step(self)
