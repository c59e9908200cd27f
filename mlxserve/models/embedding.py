"""Embedding models: sentence-transformers folders whose pooling (last token, mean or CLS,
then optionally L2-normalised) turns a network's hidden states into one vector per input.

The network loads with mlx-embeddings when it implements the architecture (BERT,
XLM-RoBERTa, ModernBERT, and the decoders it adapts for embeddings: Qwen3, bidirectional
Gemma 3 and Llama), else with mlx-lm as a decoder without its LM head (gte-Qwen2 and any
other architecture mlx-lm knows). Only the Transformer -> Pooling -> Normalize pipeline
is applied: a folder with other modules (Dense projections) is refused rather than given
wrong vectors. Generation thread only: these run MLX."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx

from mlxserve.models.capabilities import (
    has_module,
    is_text_model,
    read_config,
    sentence_transformers_modules,
)

PoolingMode = Literal["lasttoken", "mean", "cls"]
# sentence-transformers' pooling config flags -> the mode they name
_MODES: dict[str, PoolingMode] = {
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}


@dataclass(frozen=True)
class Pooling:
    mode: PoolingMode
    normalize: bool


SUPPORTED_MODULES = ("Transformer", "Pooling", "Normalize")


def pooling_of(path: Path) -> Pooling:
    """The pooling a sentence-transformers folder asks for."""
    modules = sentence_transformers_modules(path)
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in SUPPORTED_MODULES:
            raise ValueError(
                f"its pipeline has a {kind} module; only {', '.join(SUPPORTED_MODULES)} "
                "are applied here"
            )
    pool = next(m for m in modules if str(m.get("type", "")).endswith("Pooling"))
    config = json.loads((path / pool.get("path", "1_Pooling") / "config.json").read_text())
    modes = [mode for flag, mode in _MODES.items() if config.get(flag)]
    if len(modes) != 1:
        raise ValueError(f"unsupported pooling {config}: one of last-token, mean or CLS")
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    return Pooling(modes[0], normalize)


@dataclass
class PartialEmbedding:
    """One input part-way through a decoder: its KV cache and its pooling so far."""

    cache: list[Any]
    pooled: mx.array | None = None
    tokens: int = 0
    vector: Any = None  # the input's vector (numpy, float32), once its last part is in


class EmbeddingModel:
    """A loaded embedding model: token ids in, one vector per input out."""

    def __init__(self, network: Any, pooling: Pooling, encoder: bool, pad_id: int):
        """`encoder`: an mlx-embeddings network (it takes an attention mask); else an
        mlx-lm decoder (causal: right padding changes none of an input's positions)."""
        self.network = network
        self.pooling = pooling
        self.encoder = encoder
        self._pad_id = pad_id

    def parameters(self) -> dict:
        return self.network.parameters()

    @property
    def in_parts(self) -> bool:
        """Whether one input can be embedded a part at a time (a causal decoder, with a KV
        cache between the parts), so that no forward pass is longer than a prefill chunk."""
        return not self.encoder

    def embed_part(self, part: PartialEmbedding | None, ids: list[int]) -> PartialEmbedding:
        """Run the next part of one input through the decoder, keeping what its pooling
        needs (the first, the last or the sum of the hidden states)."""
        from mlx_lm.models.cache import make_prompt_cache

        if part is None:
            part = PartialEmbedding(make_prompt_cache(self.network.model))
        hidden = self.network.model(mx.array([ids]), cache=part.cache)[0].astype(mx.float32)
        mode = self.pooling.mode
        if mode == "cls":
            part.pooled = hidden[0] if part.pooled is None else part.pooled
        elif mode == "lasttoken":
            part.pooled = hidden[-1]
        else:
            total = hidden.sum(axis=0)
            part.pooled = total if part.pooled is None else part.pooled + total
        part.tokens += len(ids)
        mx.eval(part.pooled, [c.state for c in part.cache])
        return part

    def finish(self, part: PartialEmbedding) -> mx.array:
        """The vector of an input embedded in parts: (1, d), as `embed` gives it."""
        assert part.pooled is not None  # a part was embedded
        pooled = part.pooled / part.tokens if self.pooling.mode == "mean" else part.pooled
        return self._normalized(pooled[None])

    def _normalized(self, pooled: mx.array) -> mx.array:
        if self.pooling.normalize:
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        return pooled

    def embed(self, inputs: list[list[int]]) -> mx.array:
        """The vectors of `inputs` (one batch, right-padded): float32, (len(inputs), d)."""
        lengths = mx.array([len(ids) for ids in inputs])
        width = max(len(ids) for ids in inputs)
        ids = mx.array([ids + [self._pad_id] * (width - len(ids)) for ids in inputs])
        mask = mx.arange(width)[None, :] < lengths[:, None]
        if self.encoder:
            hidden = self.network(ids, attention_mask=mask.astype(mx.int32)).last_hidden_state
        else:
            hidden = self.network.model(ids)
        return self._normalized(_pool(hidden.astype(mx.float32), mask, lengths, self.pooling.mode))


def _pool(hidden: mx.array, mask: mx.array, lengths: mx.array, mode: PoolingMode) -> mx.array:
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        return hidden[mx.arange(hidden.shape[0]), lengths - 1]
    weights = mask.astype(mx.float32)[..., None]
    return (hidden * weights).sum(axis=1) / lengths[:, None].astype(mx.float32)


def load_embedding_model(path: Path, pad_id: int, trust_remote_code: bool) -> EmbeddingModel:
    pooling = pooling_of(path)
    model_type = str(read_config(path).get("model_type", "")).lower().replace("-", "_")
    if has_module("mlx_embeddings.models", model_type):
        from mlx_embeddings.utils import load_model

        return EmbeddingModel(load_model(path), pooling, True, pad_id)
    if is_text_model(path):
        return EmbeddingModel(_decoder(path, trust_remote_code), pooling, False, pad_id)
    raise ValueError(f"neither mlx-embeddings nor mlx-lm implements '{model_type}'")


def _decoder(path: Path, trust_remote_code: bool) -> Any:
    """An mlx-lm model whose weights may lack the LM head and the "model." prefix (the
    checkpoints of embedding models hold the bare transformer)."""
    from mlx_lm.utils import load_model

    from mlxserve.compat import model_classes

    def headless(config: dict):
        model_class, args_class = model_classes(config)

        class Headless(model_class):  # type: ignore[valid-type,misc]  # a class known at run time
            def sanitize(self, weights: dict) -> dict:
                if not any(key.startswith("model.") for key in weights):
                    weights = {f"model.{key}": value for key, value in weights.items()}
                parent = super()
                weights = parent.sanitize(weights) if hasattr(parent, "sanitize") else weights
                if hasattr(self, "lm_head") and "lm_head.weight" not in weights:
                    # An untied head the checkpoint does not have: never used here.
                    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
                return weights

        return Headless, args_class

    model, _ = load_model(path, get_model_classes=headless, trust_remote_code=trust_remote_code)
    return model
