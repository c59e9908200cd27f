"""Reranker models: token ids of (query, document) pairs in, one relevance score each out.

Two families:
- cross-encoders (BERT, XLM-RoBERTa, ModernBERT with a one-label sequence-classification
  head), loaded with mlx-vlm's sequence-classification loader; the score is the sigmoid
  of the head's logit, as sentence-transformers' CrossEncoder gives it;
- decoder rerankers in Qwen3-Reranker's style, an mlx-lm causal LM asked whether the
  document meets the query: the score is P("yes") against P("no") at the last position.

Both tokenizing (`pairs`) and scoring run on the generation thread, where the model is
resident (rerank/service.py sends them there a bounded piece at a time)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from mlxserve.compat import hf_tokenizer
from mlxserve.models.capabilities import is_cross_encoder, trained_context

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# Qwen3-Reranker's prompt, as its model card writes it
_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
_PREFIX = f"<|im_start|>system\n{_SYSTEM}<|im_end|>\n<|im_start|>user\n"
_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@dataclass(frozen=True)
class Pair:
    """One (query, document) pair as the model reads it."""

    input_ids: list[int]
    token_type_ids: list[int] | None = None  # BERT's segment ids; None for decoders


class CrossEncoder:
    def __init__(self, network: Any, tokenizer: Any, limit: int):
        self.network = network
        self._tokenizer = hf_tokenizer(tokenizer)
        self.limit = limit  # the most tokens of one pair (the document is cut to fit)
        self._pad_id = self._tokenizer.pad_token_id or 0

    def parameters(self) -> dict:
        """The weights (what residency counts)."""
        return self.network.parameters()

    def pairs(self, queries: list[str], documents: list[str]) -> list[Pair]:
        encoded = self._tokenizer(
            queries,
            documents,
            truncation="only_second",
            max_length=self.limit,
        )
        types = encoded.get("token_type_ids")
        return [
            Pair(list(ids), list(types[i]) if types is not None else None)
            for i, ids in enumerate(encoded["input_ids"])
        ]

    def score(self, pairs: list[Pair]) -> np.ndarray:
        width = max(len(p.input_ids) for p in pairs)
        ids = [p.input_ids + [self._pad_id] * (width - len(p.input_ids)) for p in pairs]
        mask = [[1] * len(p.input_ids) + [0] * (width - len(p.input_ids)) for p in pairs]
        inputs = {"input_ids": mx.array(ids), "attention_mask": mx.array(mask)}
        if pairs[0].token_type_ids is not None:
            types = [p.token_type_ids or [] for p in pairs]
            inputs["token_type_ids"] = mx.array([t + [0] * (width - len(t)) for t in types])
        logits = self.network(**inputs).logits.reshape(-1).astype(mx.float32)
        return np.array(mx.sigmoid(logits))


class DecoderReranker:
    def __init__(self, network: Any, tokenizer: Any, limit: int):
        self.network = network
        self._tokenizer = tokenizer
        self.limit = limit
        vocab = tokenizer.get_vocab()
        missing = [word for word in ("yes", "no") if word not in vocab]
        if missing:
            raise ValueError(f"its vocabulary has no single token for {' or '.join(missing)}")
        self._yes, self._no = vocab["yes"], vocab["no"]
        self._pad_id = hf_tokenizer(tokenizer).pad_token_id or 0

    def parameters(self) -> dict:
        """The weights (what residency counts)."""
        return self.network.parameters()

    def pairs(
        self, queries: list[str], documents: list[str], instruction: str | None
    ) -> list[Pair]:
        """Each pair in the reranker's prompt; a document is cut to what the context
        leaves it."""
        encode = self._tokenizer.encode
        task = instruction or DEFAULT_INSTRUCTION
        tail = encode(_SUFFIX, add_special_tokens=False)
        out = []
        for query, document in zip(queries, documents, strict=True):
            head = encode(
                f"{_PREFIX}<Instruct>: {task}\n<Query>: {query}\n<Document>: ",
                add_special_tokens=False,
            )
            room = max(self.limit - len(head) - len(tail), 1)
            out.append(Pair(head + encode(document, add_special_tokens=False)[:room] + tail))
        return out

    def score(self, pairs: list[Pair]) -> np.ndarray:
        """Pairs left-padded, so that every last position is the answer's (rotary
        positions are relative: the padding shifts none of a pair's scores). Padding is
        masked out of attention; a pad attends to itself, so that no row is empty."""
        from mlx_lm.models.base import create_causal_mask

        width = max(len(p.input_ids) for p in pairs)
        pads = [width - len(p.input_ids) for p in pairs]
        ids = mx.array([[self._pad_id] * n + p.input_ids for n, p in zip(pads, pairs, strict=True)])
        valid = mx.arange(width)[None, :] >= mx.array(pads)[:, None]
        keys = valid[:, None, None, :] | mx.eye(width, dtype=mx.bool_)[None, None]
        mask = create_causal_mask(width)[None, None] & keys
        inner = self.network.model
        hidden = inner.embed_tokens(ids)
        for layer in inner.layers:
            hidden = layer(hidden, mask, None)
        last = inner.norm(hidden[:, -1])
        if getattr(self.network, "lm_head", None) is not None:
            logits = self.network.lm_head(last)
        else:
            logits = inner.embed_tokens.as_linear(last)
        logits = logits.astype(mx.float32)
        return np.array(mx.sigmoid(logits[:, self._yes] - logits[:, self._no]))


Reranker = CrossEncoder | DecoderReranker


def load_reranker(path: Path, tokenizer: Any, trust_remote_code: bool) -> Reranker:
    limit = trained_context(path) or 512
    if is_cross_encoder(path):
        from mlx_vlm.reranker_loader import load_sequence_classification_model

        network = load_sequence_classification_model(path)
        return CrossEncoder(network, tokenizer, limit)
    from mlx_lm.utils import load_model

    network, _ = load_model(path, trust_remote_code=trust_remote_code)
    return DecoderReranker(network, tokenizer, limit)
