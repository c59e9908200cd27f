"""Token id -> the bytes it stands for, on every tokenizer family: byte-level BPE (GPT-2's
byte alphabet), SentencePiece byte fallback (<0xNN> pieces), and words marked with "▁"
(Metaspace and SentencePiece decoders turn it into a space). Logprob bytes and the
grammar engine's token table both read it, so they agree."""

from __future__ import annotations

import json
import re
from functools import lru_cache

from mlxserve.compat import byte_decoder

BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def word_marker(tokenizer) -> str | None:
    """The character the tokenizer's decoder turns into a space ("▁"), if any."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    for step in decoder.get("decoders") or [decoder]:
        if step.get("type") == "Metaspace":
            return step.get("replacement", "▁")
        pattern = step.get("pattern") or {}
        if step.get("type") == "Replace" and step.get("content") == " ":
            return pattern.get("String")
    return None


@lru_cache(maxsize=8)  # per tokenizer
def drops_first_space(tokenizer) -> bool:
    """Whether the detokenizer drops the space a reply's first token starts with (SentencePiece
    vocabularies: the model writes "▁The", the text reads "The")."""
    first = tokenizer.encode(" a", add_special_tokens=False)[0]
    if not token_bytes(tokenizer)(first).startswith(b" "):
        return False
    detokenizer = tokenizer.detokenizer
    detokenizer.add_token(first)
    detokenizer.finalize()
    return not detokenizer.text.startswith(" ")


@lru_cache(maxsize=8)  # per tokenizer: reading its decoder parses tokenizer.json
def token_bytes(tokenizer) -> TokenBytes:
    return TokenBytes(tokenizer)


class TokenBytes:
    """One tokenizer's token -> bytes, each computed once."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._marker = word_marker(tokenizer)
        self._known: dict[int, bytes] = {}

    def __call__(self, token: int) -> bytes:
        if token not in self._known:
            self._known[token] = self._bytes(token)
        return self._known[token]

    def _bytes(self, token: int) -> bytes:
        piece = self._tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str):
            if match := BYTE_FALLBACK.match(piece):
                return bytes([int(match.group(1), 16)])
            if self._marker:
                return piece.replace(self._marker, " ").encode("utf-8")
            decoder = byte_decoder()
            if piece and all(c in decoder for c in piece):
                return bytes(decoder[c] for c in piece)
        return self._tokenizer.decode([token]).encode("utf-8")
