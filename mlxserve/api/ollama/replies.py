"""Ollama's reply objects: a chat or generate line (the last one `done`, with the measured
durations in nanoseconds), its tool calls and logprobs."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from mlxserve.api.ollama.catalog import timestamp
from mlxserve.service.results import Block, TokenLogprob, Usage
from mlxserve.service.token_texts import TokenTexts

# finish reasons -> done_reason (a tool call is a "stop" in Ollama's replies)
DONE_REASONS = {"stop": "stop", "tool_calls": "stop", "length": "length"}


@dataclass
class Clock:
    """Where the time of one request went, read as Ollama reports it."""

    start: int = field(default_factory=time.perf_counter_ns)
    load: int = 0  # nanoseconds spent loading the model first
    run_start: int = 0
    first_token: int | None = None
    end: int = 0

    def begin(self) -> None:
        self.run_start = time.perf_counter_ns()

    def token(self) -> None:
        if self.first_token is None:
            self.first_token = time.perf_counter_ns()

    def elapsed(self) -> int:
        return time.perf_counter_ns() - self.start

    def metrics(self, usage: Usage) -> dict:
        self.end = time.perf_counter_ns()
        first = self.first_token or self.end
        return {
            "total_duration": self.end - self.start,
            "load_duration": self.load,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": first - self.run_start,
            "eval_count": usage.completion_tokens,
            "eval_duration": self.end - first,
        }


@dataclass(frozen=True)
class ReplyShape:
    """Where a line puts its text: chat's `message`, or generate's `response`."""

    model: str
    chat: bool

    def line(self, content: str = "", thinking: str = "", calls: list[dict] | None = None) -> dict:
        line: dict = {"model": self.model, "created_at": timestamp()}
        if self.chat:
            message: dict = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            line["message"] = message
        else:
            line["response"] = content
            if thinking:
                line["thinking"] = thinking
        return {**line, "done": False}

    def done(self, reason: str, extra: dict | None = None) -> dict:
        """The last line (or a load's or unload's only one)."""
        return {**self.line(), "done": True, "done_reason": reason, **(extra or {})}


def tool_call(block: Block, index: int) -> dict:
    """A finished call as Ollama sends it: its arguments a JSON object."""
    return {
        "id": block.call_id,
        "function": {"index": index, "name": block.name, "arguments": arguments(block)},
    }


def arguments(block: Block) -> dict:
    """The call's arguments as an object (the post-processor gives JSON text; a call whose
    arguments are no JSON object keeps them under "arguments", never dropped)."""
    try:
        parsed = json.loads(block.text or "{}")
    except ValueError:
        return {"arguments": block.text}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def logprobs(entries: list[TokenLogprob], texts: TokenTexts) -> list[dict]:
    return [
        {
            **_token(entry.token, entry.logprob, texts),
            "top_logprobs": [_token(token, value, texts) for token, value in entry.top],
        }
        for entry in entries
    ]


def _token(token: int, logprob: float, texts: TokenTexts) -> dict:
    text = texts(token)
    return {"token": text.text, "logprob": logprob, "bytes": list(text.bytes)}
