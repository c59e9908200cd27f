"""gpt-oss harmony: channels instead of tags.

    <|channel|>analysis<|message|>...<|end|>                     -> reasoning
    <|start|>assistant<|channel|>final<|message|>...<|return|>   -> content
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
                                                                 -> a tool call (JSON arguments)

The prompt ends with `<|start|>assistant`, so generation begins in a message header. The
recipient may also stand before the channel (`assistant to=functions.NAME<|channel|>...`).
The parser has the interface of OutputParser and emits the same events.
"""

from __future__ import annotations

import logging
import re

from mlxserve.postprocess.events import (
    Content,
    Event,
    Reasoning,
    ToolCallArguments,
    ToolCallStart,
)
from mlxserve.postprocess.parser import new_call_id
from mlxserve.textscan import scan

log = logging.getLogger(__name__)

MESSAGE = "<|message|>"
BODY_ENDS = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"]
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")

HEADER, REASONING, CONTENT, TOOL, IGNORED = "header", "reasoning", "content", "tool", "ignored"


def is_harmony(tokenizer) -> bool:
    vocab = tokenizer.get_vocab()
    return "<|channel|>" in vocab and MESSAGE in vocab


class HarmonyParser:
    def __init__(self, tools_enabled: bool = True, parallel_tool_calls: bool = True):
        self._tools_enabled = tools_enabled
        self._parallel = parallel_tool_calls
        self._state = HEADER
        self._buffer = ""
        self._header = ""
        self.tool_calls = 0

    @property
    def in_reasoning(self) -> bool:
        return self._state == REASONING

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._buffer += text
        while True:
            markers = [MESSAGE] if self._state == HEADER else BODY_ENDS
            ready, marker, self._buffer = scan(self._buffer, markers)
            self._text(ready, events)
            if marker is None:
                return events
            if self._state == HEADER:
                self._open_message(events)
            else:
                self._close_message()

    def finish(self) -> list[Event]:
        events: list[Event] = []
        self._text(self._buffer, events)
        self._buffer = ""
        if self._state == TOOL:
            self.tool_calls += 1
        return events

    def _text(self, text: str, events: list[Event]) -> None:
        if not text:
            return
        if self._state == HEADER:
            self._header += text
        elif self._state == REASONING:
            events.append(Reasoning(text))
        elif self._state == CONTENT:
            events.append(Content(text))
        elif self._state == TOOL:
            events.append(ToolCallArguments(self.tool_calls, text))

    def _open_message(self, events: list[Event]) -> None:
        header, self._header = self._header, ""
        channel = match.group(1) if (match := _CHANNEL.search(header)) else "final"
        recipient = match.group(1) if (match := _RECIPIENT.search(header)) else None
        if recipient is None:
            self._state = REASONING if channel == "analysis" else CONTENT
        elif not self._tools_enabled or (not self._parallel and self.tool_calls > 0):
            log.info("ignored a harmony tool call to %s", recipient)
            self._state = IGNORED
        else:
            self._state = TOOL
            events.append(ToolCallStart(self.tool_calls, new_call_id(), recipient))

    def _close_message(self) -> None:
        if self._state == TOOL:
            self.tool_calls += 1
        self._state = HEADER
