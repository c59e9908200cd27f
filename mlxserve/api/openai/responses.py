"""Generation results -> OpenAI JSON objects, for whole responses and SSE chunks alike."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import ClassVar

from mlxserve import __version__
from mlxserve.postprocess.events import (
    Content,
    Event,
    Reasoning,
    ToolCallArguments,
    ToolCallStart,
)
from mlxserve.service.results import Block, Choice, TokenLogprob, Usage
from mlxserve.service.token_texts import TokenText, TokenTexts

SYSTEM_FINGERPRINT = f"fp_mlxserve_{__version__}"


def usage_dict(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def tool_call_dict(call: Block) -> dict:
    function = {"name": call.name, "arguments": call.text}
    return {"id": call.call_id, "type": "function", "function": function}


@dataclass
class ReplyFormat:
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
        return {**self.envelope(self.chunk_object, []), "usage": usage_dict(usage)}


@dataclass
class ChatFormat(ReplyFormat):
    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"
    # The request used the older `functions`: its call comes back as `function_call`
    legacy_functions: bool = False

    def start_chunk(self, index: int) -> dict | None:
        return self._chunk(index, {"role": "assistant", "content": ""})

    def event_chunk(self, choice: Choice, event: Event | None, entries: list[TokenLogprob]) -> dict:
        delta = _legacy_delta(event) if self.legacy_functions else _delta(event)
        chunk = self._chunk(choice.index, delta)
        if choice.logprobs is not None:
            chunk["choices"][0]["logprobs"] = {"content": [self._entry(e) for e in entries]}
        return chunk

    def finish_chunk(self, index: int, finish_reason: str) -> dict:
        return self._chunk(index, {}, self._finish_reason(finish_reason))

    def _finish_reason(self, reason: str | None) -> str | None:
        return "function_call" if self.legacy_functions and reason == "tool_calls" else reason

    def response(self, choices: list[Choice], usage: Usage) -> dict:
        out = []
        for choice in choices:
            calls, text = choice.tool_calls, choice.text
            message: dict = {"role": "assistant", "content": None if calls and not text else text}
            if choice.reasoning:
                message["reasoning_content"] = message["reasoning"] = choice.reasoning
            if calls and self.legacy_functions:
                message["function_call"] = {"name": calls[0].name, "arguments": calls[0].text}
            elif calls:
                message["tool_calls"] = [tool_call_dict(call) for call in calls]
            item = {
                "index": choice.index,
                "message": message,
                "logprobs": None,
                "finish_reason": self._finish_reason(choice.finish_reason),
            }
            if choice.logprobs is not None:
                item["logprobs"] = {"content": [self._entry(e) for e in choice.logprobs]}
            out.append(item)
        return {**self.envelope("chat.completion", out), "usage": usage_dict(usage)}

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


def _delta(event: Event | None) -> dict:
    """The chat delta for one event (empty for a chunk that only carries logprobs)."""
    if isinstance(event, Content):
        return {"content": event.text}
    if isinstance(event, Reasoning):
        return {"reasoning_content": event.text, "reasoning": event.text}
    if isinstance(event, ToolCallStart):
        function = {"name": event.name, "arguments": ""}
        call = {"index": event.index, "id": event.id, "type": "function", "function": function}
        return {"tool_calls": [call]}
    if isinstance(event, ToolCallArguments):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
    return {}


def _legacy_delta(event: Event | None) -> dict:
    """The older functions' delta: `function_call` (a request of them makes one call)."""
    if isinstance(event, ToolCallStart):
        return {"function_call": {"name": event.name, "arguments": ""}}
    if isinstance(event, ToolCallArguments):
        return {"function_call": {"arguments": event.text}}
    return _delta(event)


class CompletionFormat(ReplyFormat):
    id_prefix = "cmpl"
    chunk_object = "text_completion"

    def start_chunk(self, index: int) -> dict | None:
        return None

    def event_chunk(self, choice: Choice, event: Event | None, entries: list[TokenLogprob]) -> dict:
        text = event.text if isinstance(event, Content) else ""
        logprobs = self._legacy_logprobs(choice, entries, choice.text_offset)
        return self.envelope(self.chunk_object, [self._choice(choice.index, text, logprobs)])

    def finish_chunk(self, index: int, finish_reason: str) -> dict:
        return self.envelope(self.chunk_object, [self._choice(index, "", None, finish_reason)])

    def response(self, choices: list[Choice], usage: Usage) -> dict:
        out = [
            self._choice(c.index, c.text, self._legacy_logprobs(c, c.logprobs, 0), c.finish_reason)
            for c in choices
        ]
        return {**self.envelope("text_completion", out), "usage": usage_dict(usage)}

    @staticmethod
    def _choice(
        index: int, text: str, logprobs: dict | None, finish_reason: str | None = None
    ) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def _legacy_logprobs(
        self, choice: Choice, entries: list[TokenLogprob] | None, offset: int
    ) -> dict | None:
        """The legacy logprobs of `entries`, or None when the request asked for none."""
        if choice.logprobs is None:
            return None
        entries = entries or []
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
