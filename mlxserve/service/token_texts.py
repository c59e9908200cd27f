"""Token ids -> the text and bytes that logprobs report (decoded text, not vocabulary pieces)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlx_lm.tokenizer_utils import _byte_decoder

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass(frozen=True)
class TokenText:
    text: str
    bytes: bytes


class TokenTexts:
    """Per-model cache of each token's raw bytes and their decoded text."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._cache: dict[int, TokenText] = {}

    def __call__(self, token: int) -> TokenText:
        if token not in self._cache:
            raw = self._raw_bytes(token)
            self._cache[token] = TokenText(raw.decode("utf-8", errors="replace"), raw)
        return self._cache[token]

    def _raw_bytes(self, token: int) -> bytes:
        piece = self._tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str):
            if match := _BYTE_FALLBACK.match(piece):
                return bytes([int(match.group(1), 16)])
            decoder = _byte_decoder()
            if piece and all(c in decoder for c in piece):
                return bytes(decoder[c] for c in piece)
        return self._tokenizer.decode([token]).encode("utf-8")
