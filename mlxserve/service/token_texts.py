"""Token ids -> the text and bytes that logprobs report (decoded text, not vocabulary pieces)."""

from __future__ import annotations

from dataclasses import dataclass

from mlxserve.models.token_bytes import token_bytes


@dataclass(frozen=True)
class TokenText:
    text: str
    bytes: bytes


class TokenTexts:
    """Per-model cache of each token's raw bytes and their decoded text."""

    def __init__(self, tokenizer):
        self._bytes = token_bytes(tokenizer)
        self._cache: dict[int, TokenText] = {}

    def __call__(self, token: int) -> TokenText:
        if token not in self._cache:
            raw = self._bytes(token)
            self._cache[token] = TokenText(raw.decode("utf-8", errors="replace"), raw)
        return self._cache[token]
