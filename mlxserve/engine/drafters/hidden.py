"""The model's hidden states, kept from each forward pass the batch makes.

An MTP head reads the hidden state the model's output head reads (after its final norm);
an EAGLE-3 drafter reads the outputs of some of the model's layers. mlx-lm's models
compute the first in `model.model` and read it out in `__call__`; `HiddenCapture` is the
model as the batch calls it, split at that point (and with the layers a drafter reads
recording their outputs), so that the pass that decodes a step also gives the drafter its
input (no second pass)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.wrapped_layer import WrappedLayer


def readout(model: Any) -> Any:
    """The model's output head: hidden states -> logits, as its `__call__` applies it."""
    language = getattr(model, "language_model", model)
    head = getattr(language, "lm_head", None)
    return head if head is not None else language.model.embed_tokens.as_linear


def splits_exactly(model: Any) -> bool:
    """Whether the model's logits are its output head over `model.model`'s output, the
    split HiddenCapture makes (a model that scales or caps its logits after the head,
    as Gemma 2 does, is not split: its drafts would be verified against other logits)."""
    probe = mx.array([[1, 2, 3, 4]])
    whole = model(probe)
    split = readout(model)(model.model(probe))
    return whole.shape == split.shape and bool(mx.allclose(whole, split, atol=1e-4).item())


@dataclass
class _Sink:
    """Where a recording layer leaves its last output (outside the module's parameters)."""

    output: Any = None


class _Recording(WrappedLayer):
    """A layer of the model that keeps its last output."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.sink = _Sink()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.sink.output = self.layer(*args, **kwargs)
        return self.sink.output


def _recording(model: Any, index: int) -> _Sink:
    layers = model.model.layers
    if not isinstance(layers[index], _Recording):
        layers[index] = _Recording(layers[index])
    return layers[index].sink


class HiddenCapture:
    """`model` as mlx-lm's generation batch calls it; `hidden` holds the last call's
    hidden states (B x S x width): the final ones, or the outputs of the layers `reads`
    names, concatenated in that order."""

    def __init__(self, model: Any, reads: tuple[int, ...] | None = None):
        self.inner = model
        self.readout = readout(model)
        self.hidden: mx.array | None = None
        self._sinks = [_recording(model, i) for i in reads or ()]

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        final = self.inner.model(inputs, cache=cache)
        if self._sinks:
            self.hidden = mx.concatenate([sink.output for sink in self._sinks], axis=-1)
        else:
            self.hidden = final
        return self.readout(final)

    def make_cache(self) -> list[Any]:
        return make_prompt_cache(self.inner)
