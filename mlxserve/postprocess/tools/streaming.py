"""Streaming a tool-call block's arguments as they are generated.

A stream is fed the text of one call block (between the format's markers) and returns
CallPieces: the start of a call (its name) and fragments of its arguments, whose
concatenation is the call's arguments as a JSON string. Three ways, by format:

- JsonBodyStream: `{"name": ..., "arguments": {...}}` (Hermes / Qwen): the arguments object
  is passed on character by character as the model writes it.
- HeaderJsonStream: `NAME[ARGS]{...}` (mistral), `functions.NAME:0<|tool_call_argument_begin|>{...}`
  (kimi_k2): a header names the call, the JSON object after it is passed on as written;
  several calls may follow each other.
- ReparseStream: the format's own parser is run on the body so far, made parseable by a
  closer that keeps complete parameters only: XML-style formats append their closing tag
  (their parsers match complete parameters only); call expressions (pythonic, tool_code,
  gemma) are cut at the last argument boundary and their brackets closed. Complete
  parameters never change, so the JSON of the arguments only grows and all but its closing
  brace can be passed on.

`close()` returns what is left once the block has ended, or None when nothing in the
block parses (the caller then returns it as plain content).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallPiece:
    call: int  # which call of the block, from 0
    name: str | None = None  # set on the piece that starts the call
    arguments: str = ""  # a fragment of the call's arguments JSON


def arguments_json(arguments) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _warn_unless_json(text: str, body: str) -> None:
    """Streamed arguments cannot be taken back; like OpenAI's, they may be invalid JSON."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        log.warning("a tool call's arguments are not valid JSON: %r", body)


def _as_list(parsed) -> list[dict]:
    return [c for c in (parsed if isinstance(parsed, list) else [parsed]) if c and c.get("name")]


def whole_calls(calls: list[dict], first: int = 0) -> list[CallPiece]:
    """Finished calls, each as a start and all of its arguments."""
    pieces = []
    for n, call in enumerate(calls, start=first):
        pieces += [
            CallPiece(n, call["name"]),
            CallPiece(n, None, arguments_json(call.get("arguments", {}))),
        ]
    return pieces


class JsonObjectScanner:
    """Tells where a JSON object that is being written ends (depth outside strings)."""

    def __init__(self):
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def consume(self, text: str) -> int:
        """How many characters of `text` belong to the object (all, while it is open)."""
        for i, char in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


class _Stream:
    def __init__(self, parse: Callable, tools: list[dict] | None):
        self._parse = parse
        self._tools = tools
        self.body = ""

    def _parsed(self, body: str) -> list[dict] | None:
        try:
            return _as_list(self._parse(body, self._tools))
        except Exception:
            return None


_NAME = re.compile(r'"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


class JsonBodyStream(_Stream):
    def __init__(self, parse: Callable, tools: list[dict] | None):
        super().__init__(parse, tools)
        self._name: str | None = None
        self._args_start: int | None = None
        self._emitted = 0
        self._scanner = JsonObjectScanner()

    def feed(self, text: str) -> list[CallPiece]:
        self.body += text
        pieces = []
        if self._name is None and (match := _NAME.search(self.body)):
            self._name = json.loads(match.group(1))
            pieces.append(CallPiece(0, self._name))
        match = _ARGUMENTS.search(self.body) if self._args_start is None else None
        if match is not None and match.end() < len(self.body):
            self._args_start = match.end()
        start = self._args_start
        streamable = start is not None and self.body[start] == "{"
        if self._name is not None and start is not None and streamable and not self._scanner.done:
            pending = self.body[start + self._emitted :]
            size = self._scanner.consume(pending)
            if size:
                pieces.append(CallPiece(0, None, pending[:size]))
                self._emitted += size
        return pieces

    def close(self) -> list[CallPiece] | None:
        if self._emitted and (start := self._args_start) is not None:
            _warn_unless_json(self.body[start : start + self._emitted], self.body)
            return []
        calls = self._parsed(self.body)
        if not calls:
            return [CallPiece(0, None, "{}")] if self._name is not None else None
        arguments = CallPiece(0, None, arguments_json(calls[0].get("arguments", {})))
        return (
            [arguments] if self._name is not None else [CallPiece(0, calls[0]["name"]), arguments]
        )


class HeaderJsonStream(_Stream):
    def __init__(self, parse: Callable, tools: list[dict] | None, header: re.Pattern):
        super().__init__(parse, tools)
        self._header = header
        self._calls = 0  # calls started
        self._position = 0  # where in the body the scan goes on
        self._scanner: JsonObjectScanner | None = None  # the open arguments object

    def feed(self, text: str) -> list[CallPiece]:
        self.body += text
        pieces = []
        while True:
            if self._scanner is not None:
                pending = self.body[self._position :]
                size = self._scanner.consume(pending)
                if size:
                    pieces.append(CallPiece(self._calls - 1, None, pending[:size]))
                    self._position += size
                if not self._scanner.done:
                    return pieces
                self._scanner = None
            match = self._header.search(self.body, self._position)
            if match is None or match.end() == len(self.body) or self.body[match.end()] != "{":
                return pieces
            pieces.append(CallPiece(self._calls, match.group("name")))
            self._calls += 1
            self._position = match.end()
            self._scanner = JsonObjectScanner()

    def close(self) -> list[CallPiece] | None:
        if self._calls:
            if self._scanner is not None:
                log.warning("tool call arguments ended unfinished: %r", self.body)
            return []
        calls = self._parsed(self.body)
        return whole_calls(calls) if calls else None


class ReparseStream(_Stream):
    def __init__(self, parse: Callable, tools: list[dict] | None, closer: Callable):
        super().__init__(parse, tools)
        self._closer = closer  # body so far -> parseable text of its complete part, or None
        self._emitted: list[str] = []  # per call: the arguments JSON passed on so far
        self._finished = 0  # calls whose arguments are complete

    def feed(self, text: str) -> list[CallPiece]:
        self.body += text
        closed = self._closer(self.body)
        return self._advance((self._parsed(closed) or []) if closed else [], final=False)

    def close(self) -> list[CallPiece] | None:
        calls = self._parsed(self.body)
        if calls is None or (not calls and not self._emitted):
            return None
        return self._advance(calls, final=True)

    def _advance(self, calls: list[dict], final: bool) -> list[CallPiece]:
        pieces = []
        for n in range(self._finished, len(calls)):
            arguments = calls[n].get("arguments")
            complete = final or n < len(calls) - 1  # a later call means this one ended
            if not complete and not (isinstance(arguments, dict) and arguments):
                break  # start a call once an argument is complete: its name is too
            if n == len(self._emitted):
                self._emitted.append("")
                pieces.append(CallPiece(n, calls[n]["name"]))
            text = arguments_json(arguments if arguments is not None else {})
            fragment = self._extend(n, text if complete else text[:-1])
            if fragment:
                pieces.append(CallPiece(n, None, fragment))
            if not complete:
                break
            self._finished = n + 1
        return pieces

    def _extend(self, n: int, text: str) -> str:
        if not text.startswith(self._emitted[n]):
            log.warning("tool call arguments changed while streaming: %r", self.body)
            return ""
        fragment, self._emitted[n] = text[len(self._emitted[n]) :], text
        return fragment


def suffix_closer(suffix: str) -> Callable[[str], str]:
    """For parsers that only match complete parameters: close the block with its end tag."""
    return lambda body: body if suffix in body else body + suffix


_CLOSING = {"(": ")", "[": "]", "{": "}"}


def bracket_closer(quotes: tuple[str, ...], call_bracket: str) -> Callable[[str], str | None]:
    """For call expressions: the body cut at its last argument boundary (a comma at the
    call's own bracket depth, or the end of a call), outside strings, brackets closed."""

    def close(body: str) -> str | None:
        stack: list[str] = []
        call_depth = None  # the depth of the open call's argument bracket
        safe = None
        quote = None
        i = 0
        while i < len(body):
            if quote is not None:
                if len(quote) == 1 and body[i] == "\\":
                    i += 2
                    continue
                if body.startswith(quote, i):
                    i += len(quote)
                    quote = None
                else:
                    i += 1
                continue
            opening = next((q for q in quotes if body.startswith(q, i)), None)
            if opening is not None:
                quote = opening
                i += len(opening)
                continue
            char = body[i]
            if char in _CLOSING:
                stack.append(char)
                if char == call_bracket and call_depth is None:
                    call_depth = len(stack)
            elif char in ")]}" and stack:
                stack.pop()
                if call_depth is not None and len(stack) < call_depth:
                    call_depth = None
                    safe = body[: i + 1] + "".join(_CLOSING[b] for b in reversed(stack))
            elif char == "," and call_depth is not None and len(stack) == call_depth:
                safe = body[:i] + "".join(_CLOSING[b] for b in reversed(stack))
            i += 1
        return safe

    return close


class WholeStream(_Stream):
    """Formats whose calls can only be parsed once the block is complete."""

    def feed(self, text: str) -> list[CallPiece]:
        self.body += text
        return []

    def close(self) -> list[CallPiece] | None:
        calls = self._parsed(self.body)
        return whole_calls(calls) if calls else None
