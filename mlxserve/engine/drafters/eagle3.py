"""EAGLE-3 drafters (`--draft-model` folders of that kind), run as the batch runs an MTP
head.

An EAGLE-3 drafter reads three of the model's layers' outputs (its config names them),
projects them to its width, and predicts the token after next from them and the next
token, through one or more decoder layers of its own with their own KV caches; chained
steps read its own output instead. Its output head may cover a smaller vocabulary, mapped
to the model's by `d2t` (target id = draft id + d2t[draft id]). The folder is read with
mlx-vlm's drafter loader (its format: the Speculators/SGLang config, `layers.*`, `fc`,
`norm`, `lm_head`, `d2t`); the forward pass here uses its modules with the batch's caches.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from mlxserve.engine.drafters.mtp_head import tokens_only


@lru_cache(maxsize=16)
def drafter_kind(folder: Path) -> str | None:
    """The kind of drafter a --draft-model folder holds ("eagle3", "dflash", "mtp": mlx-vlm's
    table of drafter model types, and DFlash's architecture name); None for a language
    model."""
    from mlx_vlm.speculative.drafters import DRAFTER_KIND_BY_MODEL_TYPE

    config = json.loads((folder / "config.json").read_text())
    if any("DFlash" in name for name in config.get("architectures") or ()):
        return "dflash"  # published as a language model's type, with its own architecture
    model_type = config.get("model_type") or config.get("speculators_model_type")
    return DRAFTER_KIND_BY_MODEL_TYPE.get(model_type)


def is_eagle3(folder: Path) -> bool:
    return drafter_kind(folder) == "eagle3"


class Eagle3Drafter:
    def __init__(self, drafter: Any, shared_embedding: bool):
        """`drafter`: mlx-vlm's Eagle3DraftModel, loaded and bound to the model (whose
        embedding it takes over its own where they agree: `shared_embedding`)."""
        self.drafter = drafter
        self._shared = shared_embedding
        self.reads = tuple(drafter.config.capture_layer_ids)  # the layers whose outputs it reads
        self.name = "EAGLE-3 drafter"

    @classmethod
    def load(cls, folder: Path, model: Any) -> Eagle3Drafter:
        from mlx_vlm.speculative.drafters import load_drafter

        drafter: Any = load_drafter(str(folder), "eagle3")[0]
        drafter.bind(model)
        drafter.eval()
        return cls(drafter, drafter.embed_tokens is model.model.embed_tokens)

    def parameters(self) -> dict:
        """Its weights, less the model's embedding where it shares it (counted once)."""
        own = self.drafter.parameters()
        return {k: v for k, v in own.items() if not (k == "embed_tokens" and self._shared)}

    def as_model(self) -> Any:
        return tokens_only(self, self.drafter.hidden_size)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.drafter.layers]

    def __call__(
        self, tokens: mx.array, hidden: mx.array, cache: list[Any]
    ) -> tuple[mx.array, mx.array]:
        """Logits (over the drafter's vocabulary) for the token after each of `tokens`,
        given the model's layers' outputs at the position before each (or, chained, the
        drafter's own output); and the hidden state a chained step reads."""
        d = self.drafter
        if hidden.shape[-1] != d.hidden_size:  # the model's layers, concatenated
            hidden = d.fc(d.input_norm(hidden) if d.input_norm is not None else hidden)
        embeds = d.embed_tokens(tokens)
        h = hidden
        for i, layer in enumerate(d.layers):
            mask = create_attention_mask(h, cache[i])
            first = (embeds,) if i == 0 else ()  # the first layer attends over both
            h = layer(*first, h, mask, cache[i], None)
        normed = d.norm(h)
        head = d.lm_head if d.lm_head is not None else d.embed_tokens.as_linear
        return head(normed), h

    def guess(self, logits: mx.array) -> mx.array:
        """The greedy token, as the model's id."""
        ids = mx.argmax(logits, axis=-1)
        d2t = self.drafter.d2t
        return ids + d2t[ids] if d2t is not None else ids
