"""One MTP head: the layer that predicts the token after next from a hidden state.

Both public layouts compute the same thing: the embedding of the next token and the
model's hidden state are each RMS-normed, concatenated (embedding first), projected back
to the model's width, passed through one decoder layer of the model's own kind (with its
own KV cache), normed, and read out through the model's output head (DeepSeek's
checkpoints store a copy of it and of the embedding beside the head: "shared", so the
model's are used). They differ in names, and in which hidden state a chained step passes
on (see `Layout`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache


@dataclass(frozen=True)
class Layout:
    """Where a family keeps its head's tensors in the checkpoint, and how it chains.

    `parts` maps the head's parts to their names under the head's prefix; `layer` is
    where the decoder layer's own tensors sit under it."""

    name: str
    parts: tuple[tuple[str, str], ...]
    layer: str
    chains_normed: bool  # a chained step reads the normed output (else the layer's)


QWEN = Layout(
    name="Qwen3.5",
    parts=(
        ("embed_norm", "pre_fc_norm_embedding"),
        ("hidden_norm", "pre_fc_norm_hidden"),
        ("project", "fc"),
        ("out_norm", "norm"),
    ),
    layer="layers.0.",
    chains_normed=True,
)
DEEPSEEK = Layout(
    name="DeepSeek/GLM",
    parts=(
        ("embed_norm", "enorm"),
        ("hidden_norm", "hnorm"),
        ("project", "eh_proj"),
        ("out_norm", "shared_head.norm"),
    ),
    layer="",
    chains_normed=False,
)


@dataclass
class _Target:
    """The model's embedding and output head, which the head shares (held outside the
    head's parameters: they are the model's weights, counted and loaded once)."""

    embed: Any
    readout: Any


class MTPHead(nn.Module):
    def __init__(
        self,
        layout: Layout,
        layer: nn.Module,
        width: int,
        eps: float,
        embed: Any,
        readout: Any,
        array_mask: bool = False,
    ):
        """`array_mask`: the layer takes its causal mask as an array (DeepSeek's latent
        attention), not as mlx's "causal"."""
        super().__init__()
        self.layout = layout
        self.array_mask = array_mask
        self.embed_norm = nn.RMSNorm(width, eps=eps)
        self.hidden_norm = nn.RMSNorm(width, eps=eps)
        self.project = nn.Linear(2 * width, width, bias=False)
        self.layer = layer
        self.out_norm = nn.RMSNorm(width, eps=eps)
        self.target = _Target(embed, readout)

    reads = None  # the model's final hidden state (not some of its layers' outputs)

    @property
    def name(self) -> str:
        return f"{self.layout.name}-layout MTP head"

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def guess(self, logits: mx.array) -> mx.array:
        """The greedy token."""
        return mx.argmax(logits, axis=-1)

    def as_model(self) -> Any:
        return tokens_only(self, self.embed_norm.weight.shape[0])

    def __call__(
        self, tokens: mx.array, hidden: mx.array, cache: list[Any]
    ) -> tuple[mx.array, mx.array]:
        """Logits for the token after each of `tokens` (B x S), given the model's hidden
        state at the position before each (B x S x width); and the hidden state a chained
        step reads in its place."""
        x = mx.concatenate(
            [self.embed_norm(self.target.embed(tokens)), self.hidden_norm(hidden)], axis=-1
        )
        x = self.project(x)
        mask = create_attention_mask(x, cache[0], return_array=self.array_mask)
        x = self.layer(x, mask, cache[0])
        normed = self.out_norm(x)
        return self.target.readout(normed), normed if self.layout.chains_normed else x


def tokens_only(drafter: Any, width: int) -> Any:
    """A drafter that reads hidden states as a model of tokens alone (a zero hidden
    state of `width`), for measuring its cost and its cache's bytes per token."""

    def step(tokens: mx.array, cache: list[Any]) -> mx.array:
        return drafter(tokens, mx.zeros((*tokens.shape, width)), cache)[0]

    step.make_cache = drafter.make_cache  # type: ignore[attr-defined]
    return step
