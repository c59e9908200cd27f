"""OutputParser: model text in, reasoning / content / tool-call events out, incrementally.

One parser per choice. It is fed decoded text as generated and holds back only what may
still become a marker; streamed deltas and the whole message are built from the same
events, so the two are always identical.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from mlxserve.postprocess.events import (
    Content,
    Event,
    Reasoning,
    ToolCallArguments,
    ToolCallStart,
)
from mlxserve.postprocess.tools import ToolFormat
from mlxserve.postprocess.tools.reparse_stream import arguments_json
from mlxserve.textscan import scan

log = logging.getLogger(__name__)

CONTENT, REASONING, TOOL = "content", "reasoning", "tool"


@dataclass(frozen=True)
class ThinkTags:
    start: str
    end: str


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass
class _OpenCall:
    """A tool call whose markup is still arriving."""

    index: int
    ignored: bool  # beyond the first call with parallel_tool_calls false
    stream: Any  # the format's argument stream, None when arguments come on close
    body: str = ""
    id: str = field(default_factory=new_call_id)
    started: bool = False


class OutputParser:
    def __init__(
        self,
        think: ThinkTags | None = None,
        tool_format: ToolFormat | None = None,
        tools: list[dict] | None = None,
        starts_in_reasoning: bool = False,
        parallel_tool_calls: bool = True,
    ):
        self._think = think
        self._format = tool_format
        self._tools = tools
        self._parallel = parallel_tool_calls
        self._state = REASONING if think and starts_in_reasoning else CONTENT
        self._buffer = ""
        self._held_space = ""  # trailing whitespace, dropped if the segment ends there
        self._segment_started = self._state == CONTENT  # strip leading space after markup
        self._call: _OpenCall | None = None
        self.tool_calls = 0

    @property
    def in_reasoning(self) -> bool:
        return self._state == REASONING

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._buffer += text
        while True:
            ready, marker, self._buffer = scan(self._buffer, self._markers())
            self._text(ready, events)
            if marker is None:
                return events
            self._transition(marker, events)

    def finish(self) -> list[Event]:
        """Flush what was held back once generation has ended."""
        events: list[Event] = []
        self._text(self._buffer, events)
        self._buffer = ""
        if self._state == TOOL:
            self._close_call(events)
        elif self._state == CONTENT and self.tool_calls == 0 and self._held_space:
            events.append(Content(self._held_space))
        return events

    def _markers(self) -> list[str]:
        tool_start = [self._format.start] if self._format else []
        if self._state == TOOL:
            return [self._format.end] if self._format.end else []
        if self._state == REASONING:
            return [self._think.end, *tool_start]
        return ([self._think.start] if self._think else []) + tool_start

    def _transition(self, marker: str, events: list[Event]) -> None:
        self._held_space = ""
        if self._state == TOOL:
            self._close_call(events)
            self._enter(CONTENT)
        elif self._format and marker == self._format.start:
            ignored = not self._parallel and self.tool_calls > 0
            stream = self._format.argument_stream(self._tools)
            self._call = _OpenCall(self.tool_calls, ignored, stream)
            self._state = TOOL
        elif self._state == CONTENT:
            self._enter(REASONING)
        else:
            self._enter(CONTENT)

    def _enter(self, state: str) -> None:
        self._state = state
        self._segment_started = False

    def _text(self, text: str, events: list[Event]) -> None:
        if not text:
            return
        if self._state == TOOL:
            self._feed_call(text, events)
            return
        if not self._segment_started:
            text = text.lstrip()
            if not text:
                return
            self._segment_started = True
        body = text.rstrip()
        text, self._held_space = self._held_space + body, text[len(body) :]
        if text:
            events.append(Reasoning(text) if self._state == REASONING else Content(text))

    def _feed_call(self, text: str, events: list[Event]) -> None:
        call = self._call
        call.body += text
        if call.stream is None or call.ignored:
            return
        fragment = call.stream.feed(text)
        if not call.started and call.stream.name is not None:
            call.started = True
            events.append(ToolCallStart(call.index, call.id, call.stream.name))
        if fragment and call.started:
            events.append(ToolCallArguments(call.index, fragment))

    def _close_call(self, events: list[Event]) -> None:
        call, self._call = self._call, None
        if call.ignored:
            log.info("dropped a tool call: parallel_tool_calls is false")
            return
        if call.started:
            self.tool_calls += 1
            rest, more = call.stream.close()
            if rest:
                events.append(ToolCallArguments(call.index, rest))
            self._emit_calls(more, events)
            return
        try:
            parsed = self._format.parse(call.body, self._tools)
        except Exception as e:
            log.warning("unparsable tool call returned as content (%s): %r", e, call.body)
            events.append(Content(self._format.start + call.body + self._format.end))
            return
        self._emit_calls(parsed if isinstance(parsed, list) else [parsed], events)

    def _emit_calls(self, calls: list[dict], events: list[Event]) -> None:
        """Whole calls, each a start and all its arguments at once."""
        for item in calls:
            if not self._parallel and self.tool_calls > 0:
                log.info("dropped a tool call: parallel_tool_calls is false")
                continue
            index = self.tool_calls
            events.append(ToolCallStart(index, new_call_id(), item["name"]))
            events.append(ToolCallArguments(index, arguments_json(item.get("arguments", {}))))
            self.tool_calls += 1
