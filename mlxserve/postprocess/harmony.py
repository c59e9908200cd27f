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

import functools
import logging
import re

from mlxserve.postprocess.events import (
    Content,
    Event,
    Reasoning,
    ToolCallArguments,
    ToolCallStart,
)
from mlxserve.postprocess.parser import CONTENT, REASONING, TOOL, MarkupParser, new_call_id

log = logging.getLogger(__name__)

MESSAGE = "<|message|>"
# Reasoning opens and closes (on to the final answer) with these.
ANALYSIS_OPENING = "<|channel|>analysis<|message|>"
ANALYSIS_CLOSING = "<|end|><|start|>assistant"
FINAL_OPENING = "<|channel|>final<|message|>"
BODY_ENDS = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"]
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
HARMONY_RECIPIENT = "to=functions."  # a header naming a function: the message is a call
_RECIPIENT = re.compile(re.escape(HARMONY_RECIPIENT) + r"([^\s<]+)")

HEADER, IGNORED = "header", "ignored"


@functools.lru_cache(maxsize=16)  # per tokenizer: building its vocabulary dict takes ~50 ms
def is_harmony(tokenizer) -> bool:
    vocab = tokenizer.get_vocab()
    return "<|channel|>" in vocab and MESSAGE in vocab


class HarmonyParser(MarkupParser):
    unparsed_calls = 0  # a call is a message of its own: read whole, or not a call

    def __init__(self, tools_enabled: bool = True, parallel_tool_calls: bool = True):
        self._tools_enabled = tools_enabled
        self._parallel = parallel_tool_calls
        self._state = HEADER
        self._header = ""
        self.tool_calls = 0

    def _end(self, events: list[Event]) -> None:
        if self._state == TOOL:
            self.tool_calls += 1

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

    def _markers(self) -> list[str]:
        return [MESSAGE] if self._state == HEADER else BODY_ENDS

    def _transition(self, marker: str, events: list[Event]) -> None:
        if self._state == HEADER:
            self._open_message(events)
        else:
            self._close_message()

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
