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
from mlxserve.postprocess.tools.streaming import CallPiece
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
    """A tool-call block whose markup is still arriving."""

    first: int  # the index of its first call
    ignored: bool  # a block after the first call, with parallel_tool_calls false
    stream: Any  # the format's stream: call starts and argument fragments
    calls: int = 0  # calls it has started
    dropped: set[int] = field(default_factory=set)  # calls beyond the first, when not parallel


class MarkupParser:
    """Text through a state machine whose transitions are markers in the text: the text
    between markers goes to `_text`, each marker to `_transition`. Only what may still
    become a marker is held back."""

    _buffer = ""
    _state = CONTENT

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
        self._end(events)
        return events

    def _markers(self) -> list[str]:
        raise NotImplementedError

    def _text(self, text: str, events: list[Event]) -> None:
        raise NotImplementedError

    def _end(self, events: list[Event]) -> None:
        """What the state generation ended in still has to say."""

    def _transition(self, marker: str, events: list[Event]) -> None:
        raise NotImplementedError


class OutputParser(MarkupParser):
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
        self.unparsed_calls = 0  # call blocks that could not be read (returned as content)

    def _end(self, events: list[Event]) -> None:
        if self._state == TOOL:
            self._close_call(events)
        elif self._state == CONTENT and self.tool_calls == 0 and self._held_space:
            events.append(Content(self._held_space))

    def _markers(self) -> list[str]:
        fmt, think = (
            self._format,
            self._think,
        )  # a call opens only with a format, reasoning with tags
        tool_start = [fmt.start] if fmt else []
        if self._state == TOOL and fmt is not None:
            return [fmt.end] if fmt.end else []
        if self._state == REASONING and think is not None:
            return [think.end, *tool_start]
        return ([think.start] if think else []) + tool_start

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
        assert call is not None  # fed only while a call is open
        if call.ignored:
            call.stream.body += text
            return
        self._pieces(call, call.stream.feed(text), events)

    def _pieces(self, call: _OpenCall, pieces: list[CallPiece], events: list[Event]) -> None:
        for piece in pieces:
            index = call.first + piece.call
            if piece.name is not None:
                if not self._parallel and index > 0:
                    log.info("dropped a tool call: parallel_tool_calls is false")
                    call.dropped.add(piece.call)
                    continue
                events.append(ToolCallStart(index, new_call_id(), piece.name))
                call.calls += 1
            elif piece.arguments and piece.call not in call.dropped:
                events.append(ToolCallArguments(index, piece.arguments))

    def _close_call(self, events: list[Event]) -> None:
        call, self._call = self._call, None
        assert call is not None and self._format is not None  # closed only while open
        if call.ignored:
            log.info("dropped a tool call: parallel_tool_calls is false")
            return
        pieces = call.stream.close()
        if pieces is None:
            log.warning("unparsable tool call returned as content: %r", call.stream.body)
            self.unparsed_calls += 1
            events.append(Content(self._format.start + call.stream.body + self._format.end))
            return
        self._pieces(call, pieces, events)
        self.tool_calls += call.calls
