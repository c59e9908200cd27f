"""Generation results -> OpenAI JSON objects, for whole responses and SSE chunks alike."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import ClassVar

from mlxserve import __version__
from mlxserve.api.logprobs import TokenText, TokenTexts

SYSTEM_FINGERPRINT = f"fp_mlxserve_{__version__}"


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Choice:
    """One choice as it accumulates."""

    index: int
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    text_offset: int = 0  # characters covered by the logprobs already streamed


@dataclass
class ResponseFormat:
    """What chat and text completions share: ids, envelopes, usage."""

    id_prefix: ClassVar[str]
    chunk_object: ClassVar[str]
    model: str
    texts: TokenTexts
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = f"{self.id_prefix}-{secrets.token_hex(12)}"

    def envelope(self, obj: str, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }

    def usage_chunk(self, usage: Usage) -> dict:
        """The chunk after the last choice chunk when `include_usage` is set."""
        return {**self.envelope(self.chunk_object, []), "usage": usage.to_dict()}


class ChatFormat(ResponseFormat):
    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"

    def start_chunk(self, index: int) -> dict | None:
        return self._chunk(index, {"role": "assistant", "content": ""})

    def text_chunk(self, choice: Choice, text: str, entries: list[TokenLogprob]) -> dict:
        chunk = self._chunk(choice.index, {"content": text} if text else {})
        if choice.logprobs is not None:
            chunk["choices"][0]["logprobs"] = {"content": [self._entry(e) for e in entries]}
        return chunk

    def finish_chunk(self, index: int, finish_reason: str) -> dict:
        return self._chunk(index, {}, finish_reason)

    def response(self, choices: list[Choice], usage: Usage) -> dict:
        out = []
        for choice in choices:
            item = {
                "index": choice.index,
                "message": {"role": "assistant", "content": choice.text},
                "logprobs": None,
                "finish_reason": choice.finish_reason,
            }
            if choice.logprobs is not None:
                item["logprobs"] = {"content": [self._entry(e) for e in choice.logprobs]}
            out.append(item)
        return {**self.envelope("chat.completion", out), "usage": usage.to_dict()}

    def _chunk(self, index: int, delta: dict, finish_reason: str | None = None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self.envelope(self.chunk_object, [choice])

    def _entry(self, entry: TokenLogprob) -> dict:
        return {
            **self._token(self.texts(entry.token), entry.logprob),
            "top_logprobs": [self._token(self.texts(t), lp) for t, lp in entry.top],
        }

    @staticmethod
    def _token(text: TokenText, logprob: float) -> dict:
        return {"token": text.text, "logprob": logprob, "bytes": list(text.bytes)}


class CompletionFormat(ResponseFormat):
    id_prefix = "cmpl"
    chunk_object = "text_completion"

    def start_chunk(self, index: int) -> dict | None:
        return None

    def text_chunk(self, choice: Choice, text: str, entries: list[TokenLogprob]) -> dict:
        item = self._choice(choice.index, text, entries, choice.text_offset, None, choice)
        return self.envelope(self.chunk_object, [item])

    def finish_chunk(self, index: int, finish_reason: str) -> dict:
        return self.envelope(
            self.chunk_object, [self._choice(index, "", [], 0, finish_reason, None)]
        )

    def response(self, choices: list[Choice], usage: Usage) -> dict:
        out = [
            self._choice(c.index, c.text, c.logprobs or [], 0, c.finish_reason, c) for c in choices
        ]
        return {**self.envelope("text_completion", out), "usage": usage.to_dict()}

    def _choice(self, index, text, entries, offset, finish_reason, choice) -> dict:
        logprobs = None
        if choice is not None and choice.logprobs is not None:
            logprobs = self._legacy_logprobs(entries, offset)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def _legacy_logprobs(self, entries: list[TokenLogprob], offset: int) -> dict:
        tokens, offsets = [], []
        for entry in entries:
            text = self.texts(entry.token).text
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self.texts(t).text: lp for t, lp in e.top} for e in entries],
            "text_offset": offsets,
        }
