"""DFlash block drafters (`--draft-model` folders of that kind: z-lab's `DFlashDraftModel`,
as mlx-vlm 0.7.10 reads them): a block of guesses in one pass.

A DFlash drafter reads the outputs of some of the model's layers (`target_layer_ids`) at
every position the model has taken, projected to its width (`fc`, `hidden_norm`): its
context. Its KV cache holds that context, one entry per token in the model's cache (each
layer's keys and values are its own projections of the same projected states). To draft,
it takes a block of the next token followed by mask tokens and, through its layers, reads
the block against the context and the block itself (not causally: block diffusion); its
output at block position i guesses the token i after the next. Only the context enters
its cache, so a rejected draft leaves nothing to take back.

The folder is read with mlx-vlm's drafter loader; the forward pass here uses its modules
with the batch's caches (mlx-vlm's own pass keeps one sequence's context offset, not the
batch's per-row offsets and left padding).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

# Variants of the architecture a block pass here does not implement, by config field.
VARIANTS = {
    "layer_types": "sliding-window layers",
    "draft_window_size": "a windowed draft cache",
    "attention_sink_bias": "attention sinks",
}


class DFlashUnsupported(ValueError):
    """A DFlash checkpoint of a variant not served; the message says which."""


class DFlashDrafter:
    """mlx-vlm's DFlashDraftModel, bound to the model, drafting in the batch."""

    def __init__(self, drafter: Any):
        self.drafter = drafter
        config = drafter.config
        self.reads = tuple(config.target_layer_ids)  # the model's layers it reads
        runtime = config.runtime_block_size  # a published drafter's preferred block
        # the next token and block - 1 guesses
        self.block = min(int(config.block_size), int(runtime or config.block_size))
        self.name = "DFlash drafter"
        self._mask = int(config.mask_token_id)
        self._causal = bool(config.is_causal)

    @classmethod
    def load(cls, folder: Path, model: Any) -> DFlashDrafter:
        from mlx_vlm.speculative.drafters import DFlashDraftModel, load_drafter

        drafter: Any = load_drafter(str(folder), "dflash")[0]
        if type(drafter) is not DFlashDraftModel:
            raise DFlashUnsupported(
                f"{folder.name} is a {type(drafter).__name__}: of DFlash drafters only "
                "DFlashDraftModel (z-lab's) is served"
            )
        config = drafter.config
        for field, what in VARIANTS.items():
            value = getattr(config, field, None)
            if value and not (field == "layer_types" and set(value) == {"full_attention"}):
                raise DFlashUnsupported(f"{folder.name} uses {what}, which is not served")
        drafter.bind(model)
        drafter.eval()
        return cls(drafter)

    def parameters(self) -> dict:
        """Its own weights (the embedding and output head it reads are the model's)."""
        own = self.drafter.parameters()
        return {k: v for k, v in own.items() if k not in ("embed_tokens", "lm_head")}

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.drafter.layers]

    @property
    def context_width(self) -> int:
        """The width of its context: the outputs of the layers it reads, concatenated."""
        return int(self.drafter.fc.weight.shape[1])

    def as_model(self) -> Any:
        """Taking tokens as context of zero hidden states: for measuring its cache's bytes
        per token."""
        width = self.context_width

        def step(tokens: mx.array, cache: list[Any]) -> mx.array:
            self.take(mx.zeros((*tokens.shape, width)), cache)
            return cache[0].state[0]

        step.make_cache = self.make_cache  # type: ignore[attr-defined]
        return step

    def drafting(self, width: int) -> float:
        """The seconds its guesses for a verify pass over `width` tokens take: one pass
        over a block of that width (for `engine.speculation.draft_costs`)."""
        context = self.context(mx.zeros((1, 1, self.context_width)), 0)
        block = mx.zeros((1, width), dtype=mx.int32)
        visible = mx.ones((1, 1), dtype=mx.bool_)
        mx.eval(self.block_logits(block, 1, context, visible))  # warm up
        start = time.perf_counter()
        mx.eval(self.block_logits(block, 1, context, visible))
        return time.perf_counter() - start

    def context(self, hidden: mx.array, offset: Any) -> list[tuple[mx.array, mx.array]]:
        """Each layer's keys and values (B x heads x n x head width) for the context
        `hidden` (B x n x the read layers' outputs, concatenated) at positions from
        `offset` (an int, or one per row)."""
        d = self.drafter
        projected = d.hidden_norm(d.fc(hidden))
        batch, length, _ = projected.shape
        entries = []
        for layer in d.layers:
            attention = layer.self_attn
            keys = attention.k_proj(projected).reshape(batch, length, attention.n_kv_heads, -1)
            values = attention.v_proj(projected).reshape(batch, length, attention.n_kv_heads, -1)
            keys = d.rope(attention.k_norm(keys).transpose(0, 2, 1, 3), offset=offset)
            entries.append((keys, values.transpose(0, 2, 1, 3)))
        return entries

    def take(self, hidden: mx.array, cache: list[Any]) -> None:
        """Append the context of `hidden` to each layer's cache, at the cache's positions."""
        for (keys, values), c in zip(self.context(hidden, cache[0].offset), cache, strict=True):
            c.update_and_fetch(keys, values)

    def draft(
        self,
        next_tokens: mx.array,
        cache: list[Any],
        count: int,
        choose: Callable[[mx.array], mx.array] | None = None,
    ) -> mx.array:
        """`count` greedy guesses per row (B x count) after each row's next token, read
        against the context in `cache` (batch caches: rows left-padded); `choose` picks
        each position's guesses from its logits (B x vocabulary) in turn, if given."""
        masks = mx.full((next_tokens.shape[0], count), self._mask, dtype=next_tokens.dtype)
        block = mx.concatenate([next_tokens[:, None], masks], axis=1)
        context = [c.keys_and_values() for c in cache]
        stored = context[0][0].shape[2]
        visible = mx.arange(stored)[None, :] >= cache[0].left_padding[:, None]
        logits = self.block_logits(block, cache[0].offset, context, visible)
        if choose is None:
            return mx.argmax(logits, axis=-1).astype(next_tokens.dtype)
        guesses = [choose(logits[:, j]) for j in range(logits.shape[1])]
        return mx.stack(guesses, axis=1).astype(next_tokens.dtype)

    def block_logits(
        self,
        block: mx.array,
        offset: Any,
        context: list[tuple[mx.array, mx.array]],
        visible: mx.array,
    ) -> mx.array:
        """The logits at each block position but the first (B x L - 1 x vocabulary): the
        block (B x L tokens, at positions from `offset`) read through the drafter's
        layers against each layer's `context` keys and values, of which each row sees
        those `visible` marks (B x stored)."""
        d = self.drafter
        batch, length = block.shape
        shown = mx.broadcast_to(visible[:, None, None, :], (batch, 1, length, visible.shape[1]))
        own = mx.ones((length, length), dtype=mx.bool_)
        own = mx.broadcast_to(
            (mx.tril(own) if self._causal else own)[None, None], (batch, 1, length, length)
        )
        mask = mx.concatenate([shown, own], axis=-1)
        h = d.embed_tokens(block) * d.embed_scale
        for layer, (keys, values) in zip(d.layers, context, strict=True):
            h = h + self._attend(
                layer.self_attn, layer.input_layernorm(h), offset, keys, values, mask
            )
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = d.lm_head(d.norm(h[:, 1:]))
        cap = d.config.final_logit_softcapping
        return mx.tanh(logits / cap) * cap if cap is not None else logits

    def _attend(
        self,
        attention: Any,
        x: mx.array,
        offset: Any,
        context_keys: mx.array,
        context_values: mx.array,
        mask: mx.array,
    ) -> mx.array:
        batch, length, _ = x.shape
        queries = attention.q_proj(x).reshape(batch, length, attention.n_heads, -1)
        keys = attention.k_proj(x).reshape(batch, length, attention.n_kv_heads, -1)
        values = attention.v_proj(x).reshape(batch, length, attention.n_kv_heads, -1)
        rope = self.drafter.rope
        queries = rope(attention.q_norm(queries).transpose(0, 2, 1, 3), offset=offset)
        keys = rope(attention.k_norm(keys).transpose(0, 2, 1, 3), offset=offset)
        keys = mx.concatenate([context_keys, keys], axis=2)
        values = mx.concatenate([context_values, values.transpose(0, 2, 1, 3)], axis=2)
        out = mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=attention.scale, mask=mask
        )
        return attention.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))
