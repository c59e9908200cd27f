"""Llama 4's chunked attention, made to batch; applied at load (mlx-lm's and mlx-vlm's).

Llama 4 attends in three layers of four only to the tokens of the query's own chunk of
`attention_chunk_size` positions (8,192 in the published checkpoints), and in every
fourth to all of them. The libraries keep a chunked layer's keys in a ChunkedKVCache that
drops the ones before the chunk, and derive the layers' mask from the first cache's
offset: one row, one position. That cache has no batch form, so mlx-lm's batch could not
take the model (it was served one request at a time), and in a batch each row sits at a
position of its own (left padding, rows of different lengths).

Here every layer keeps its keys in a plain KV cache (batched as any full-attention
model's), and the chunked layers' mask is built per row from each row's positions: a key
is seen where it is in the query's chunk and not after it, as the libraries' chunk mask
has it. The replies are the libraries' (a key outside the chunk is masked, not dropped);
the cost is memory: past one chunk, the chunked layers hold the whole context as the
global ones do. While every row is within its first chunk (any conversation shorter than
8,192 tokens) the mask is the global layers' one, built once. The global layers'
temperature tuning (their queries scaled by their position) is per row too."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

# The modules of the Llama 4 language models this mends: their LlamaModel and Attention.
_LIBRARIES = ("mlx_lm.models.llama4", "mlx_vlm.models.llama4.language")


def batch_chunked_attention(model: Any) -> None:
    """Mend a Llama 4 model (mlx-lm's text model or mlx-vlm's vision-language model, on
    the thread that loads it, once); any other model is left as it is."""
    language: Any = getattr(model, "language_model", None)
    inner: Any = getattr(language, "model", None)
    if type(inner).__module__ not in _LIBRARIES:
        return
    owner = model if type(model).__module__ in _LIBRARIES else language  # its make_cache
    library: Any
    if type(inner).__module__.startswith("mlx_vlm"):
        from mlx_vlm.models import cache as library
    else:
        from mlx_lm.models import cache as library

    def make_cache(self: Any) -> list[Any]:
        """A plain KV cache (the library's own kind) for every layer."""
        return [library.KVCache() for _ in self.layers]

    owner.__class__ = type(type(owner).__name__, (type(owner),), {"make_cache": make_cache})
    inner.__class__ = type(type(inner).__name__, (type(inner),), {"__call__": _model_call})
    attention = type(inner.layers[0].self_attn)
    mended = type(attention.__name__, (attention,), {"__call__": _attention_call})
    for layer in inner.layers:
        layer.self_attn.__class__ = mended


def _chunked(index: int) -> bool:
    """Whether layer `index` attends within chunks (the libraries' rule: all but every
    fourth)."""
    return (index + 1) % 4 != 0


def _model_call(
    self: Any,
    input_ids: mx.array | None = None,
    input_embeds: mx.array | None = None,
    mask: mx.array | None = None,
    cache: list[Any] | None = None,
) -> mx.array:
    """The decoder layers over the tokens (or their embeddings), each chunked layer under
    the rows' chunk mask. Takes mlx-lm's call, `(inputs, cache)`, and mlx-vlm's."""
    if isinstance(input_embeds, list):  # mlx-lm's LanguageModel passes the cache second
        input_embeds, cache = None, input_embeds
    h = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
    caches = cache if cache is not None else [None] * len(self.layers)
    chunk = getattr(self, "attention_chunk_size", None) or self.config.attention_chunk_size
    full_mask = mask if mask is not None else create_attention_mask(h, caches[0])
    if _end(caches[0]) + h.shape[1] <= chunk:  # every position in the first chunk
        chunk_mask = full_mask
    else:
        chunk_mask = chunk_attention_mask(h.shape[1], chunk, caches[0])
    for index, (layer, layer_cache) in enumerate(zip(self.layers, caches, strict=True)):
        h = layer(h, chunk_mask if _chunked(index) else full_mask, cache=layer_cache)
    return self.norm(h)


def _end(cache: Any) -> int:
    """Where the new tokens go in the cache (every row's, in a batch)."""
    if cache is None:
        return 0
    return cache._idx if hasattr(cache, "left_padding") else cache.offset


def chunk_attention_mask(length: int, chunk: int, cache: Any) -> mx.array:
    """The mask of `length` new tokens over `cache`'s keys and theirs: causal, each row's
    padding out, and a key only where it is in its query's chunk. A row's position is its
    place in the cache less its left padding."""
    if cache is None or not hasattr(cache, "left_padding"):  # one row
        offset = _end(cache)
        keys = mx.arange(offset + length)
        queries = mx.arange(offset, offset + length)[:, None]
        return (keys <= queries) & (keys // chunk == queries // chunk)
    start = _end(cache)
    padding = cache.left_padding[:, None]
    keys = mx.arange(start + length)[None] - padding
    queries = mx.arange(start, start + length)[None] - padding
    same_chunk = keys[:, None, :] // chunk == queries[:, :, None] // chunk
    return cache.make_mask(length, return_array=True) & same_chunk[:, None]


def _attention_call(
    self: Any, x: mx.array, mask: mx.array | None = None, cache: Any | None = None
) -> mx.array:
    """Llama 4's attention (the libraries' code) with a row's own positions: RoPE from
    each row's offset, and the global layers' query scale from each row's position."""
    batch, length, _ = x.shape
    queries = self.q_proj(x).reshape(batch, length, self.n_heads, -1).transpose(0, 2, 1, 3)
    keys = self.k_proj(x).reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
    values = self.v_proj(x).reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
    offset = cache.offset if cache is not None else 0
    if self.use_rope:
        queries = self.rope(queries, offset=offset)
        keys = self.rope(keys, offset=offset)
    if self.use_qk_norm:
        queries = mx.fast.rms_norm(queries, weight=None, eps=1e-6)
        keys = mx.fast.rms_norm(keys, weight=None, eps=1e-6)
    if self.attn_temperature_tuning and not self.use_rope:
        rows = offset.reshape(-1, 1) if isinstance(offset, mx.array) else mx.array([[offset]])
        positions = rows + mx.arange(1, length + 1)[None]  # rows x new tokens
        scales = mx.log(mx.floor(positions / self.floor_scale) + 1.0) * self.attn_scale + 1.0
        queries = (queries * scales[:, None, :, None]).astype(queries.dtype)
    if cache is not None:
        keys, values = cache.update_and_fetch(keys, values)
    output = scaled_dot_product_attention(
        queries, keys, values, cache=cache, scale=self.scale, mask=mask
    )
    return self.o_proj(output.transpose(0, 2, 1, 3).reshape(batch, length, -1))
