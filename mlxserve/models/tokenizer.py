"""Tokenizer loading: mlx-lm's TokenizerWrapper, with exact detokenization and end tokens."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    SPMStreamingDetokenizer,
    StreamingDetokenizer,
    TokenizerWrapper,
)
from mlx_lm.utils import load_tokenizer

from mlxserve.compat import detokenizer_prototype, hf_tokenizer, set_detokenizer_prototype

# Tokens that end an assistant turn in common chat templates; any in the vocab stop generation.
TURN_END_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|return|>",
    "<|call|>",
)


class ExactBPEDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's byte-level detokenizer drops the first leading space of a reply, which
    corrupts text completions (" Paris" becomes "Paris"); keep the text exactly (the hook
    is `compat.TRIM_SPACE_HOOK`)."""

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text


def keep_leading_space(detokenizer: StreamingDetokenizer) -> None:
    """A continuation's text (a completion, a middle) keeps the space its first token
    starts with: mlx-lm's SentencePiece detokenizer drops it, as HF's decode does for a
    text of its own, which suits a chat reply but turns " a + b" after "return" into
    "a + b". (Byte-level detokenizers keep it always: ExactBPEDetokenizer.)"""
    if isinstance(detokenizer, SPMStreamingDetokenizer):
        detokenizer.trim_space = False


def load_text_tokenizer(path: Path, trust_remote_code: bool) -> TokenizerWrapper:
    config = json.loads((path / "config.json").read_text())
    extra = {"trust_remote_code": True} if trust_remote_code else None
    tokenizer = load_tokenizer(path, extra, eos_token_ids=config.get("eos_token_id"))
    if not tokenizer.has_chat_template:
        _processor_chat_template(tokenizer, path)
    if type(detokenizer_prototype(tokenizer)) is BPEStreamingDetokenizer:
        set_detokenizer_prototype(tokenizer, ExactBPEDetokenizer(hf_tokenizer(tokenizer)))
    vocab = tokenizer.get_vocab()
    for token in TURN_END_TOKENS:
        if token in vocab:
            tokenizer.add_eos_token(token)
    return tokenizer


def _processor_chat_template(tokenizer: TokenizerWrapper, path: Path) -> None:
    """Vision models often keep the template beside the processor (chat_template.json)
    rather than in the tokenizer's config."""
    from mlx_vlm.models.base import load_chat_template

    load_chat_template(hf_tokenizer(tokenizer), path)
    tokenizer.has_chat_template = hf_tokenizer(tokenizer).chat_template is not None


@lru_cache(maxsize=8)  # per tokenizer
def longest_token(tokenizer) -> int:
    """Characters in the tokenizer's longest vocabulary piece: no text of more than n times
    this can be fewer than n tokens, which bounds a prompt before it is tokenized."""
    return max(map(len, tokenizer.get_vocab()), default=1)
