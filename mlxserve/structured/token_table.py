"""A grammar engine's token table built from any tokenizer's vocabulary: each token's
bytes (special tokens behind llguidance's 0xFF marker) and a way to tokenize text, for
tokenizers whose tokenizer.json llguidance cannot read itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from tokenizers import Tokenizer

from mlxserve.compat import hf_tokenizer
from mlxserve.models.token_bytes import token_bytes

# llguidance reads a token whose bytes start with 0xFF (never valid UTF-8) as special.
SPECIAL_MARKER = b"\xff"


@dataclass
class VocabularyTable:
    """What llguidance.TokenizerWrapper reads."""

    eos_token_id: int
    bos_token_id: int | None
    tokens: list[bytes]
    special_token_ids: list[int]
    encode: Callable[[str], list[int]]

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.encode(text)

    @classmethod
    def of(cls, tokenizer) -> VocabularyTable:
        """The table of an mlx-lm tokenizer (its Hugging Face tokenizer inside)."""
        hf = hf_tokenizer(tokenizer)
        # Every added token is special, as llguidance's own reader has it: markup such as
        # <tool_call> is then one token in a grammar, never text spelled another way.
        special = set(hf.added_tokens_decoder) | set(hf.all_special_ids)
        raw = token_bytes(tokenizer)
        pieces = hf.convert_ids_to_tokens(list(range(len(hf))))
        tokens = [
            SPECIAL_MARKER + piece.encode("utf-8") if i in special else raw(i)
            for i, piece in enumerate(pieces)
        ]
        return cls(
            eos_token_id=min(tokenizer.eos_token_ids),
            bos_token_id=hf.bos_token_id,
            tokens=tokens,
            special_token_ids=sorted(special),
            encode=_mid_text_encoder(hf),
        )


def _mid_text_encoder(hf) -> Callable[[str], list[int]]:
    """Tokenize text as it reads inside a reply, not at the start of a document: without
    the "▁" a word-marking tokenizer prepends to a document's first word (the grammar
    engine takes its forced tokens from here, so "\n" must be "\n", not "▁\n").
    Slow tokenizers (tiktoken vocabularies) prepend nothing."""
    backend: Tokenizer | None = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return lambda text: hf.encode(text, add_special_tokens=False)
    spec = json.loads(backend.to_str())
    spec["normalizer"] = _without_prepend(spec.get("normalizer"))
    _never_prepend(spec.get("pre_tokenizer"))
    mid_text = Tokenizer.from_str(json.dumps(spec))
    return lambda text: mid_text.encode(text, add_special_tokens=False).ids


def _without_prepend(normalizer: dict | None) -> dict | None:
    """The normalizer less its Prepend steps (Llama-2's legacy "▁" before the text)."""
    if normalizer is None or normalizer.get("type") == "Prepend":
        return None
    if normalizer.get("type") == "Sequence":
        steps = [n for n in map(_without_prepend, normalizer["normalizers"]) if n]
        return {**normalizer, "normalizers": steps}
    return normalizer


def _never_prepend(pre_tokenizer: dict | None) -> None:
    if pre_tokenizer is None:
        return
    if pre_tokenizer.get("type") == "Metaspace":
        pre_tokenizer["prepend_scheme"] = "never"
    for step in pre_tokenizer.get("pretokenizers") or []:
        _never_prepend(step)
