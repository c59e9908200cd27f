"""Streams the arguments of a `{"name": ..., "arguments": {...}}` call body as it grows.

The name is known once its string closes; from then on every character of the arguments
value is passed on as generated, and the JSON nesting depth (outside strings) tells when
the value is complete. The fragments concatenate to the exact JSON text the model wrote.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable

from mlxserve.postprocess.tools.reparse_stream import arguments_json

log = logging.getLogger(__name__)

_NAME = re.compile(r'"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


class JsonArgumentsStream:
    def __init__(self, parse: Callable, tools: list[dict] | None):
        self._parse = parse
        self._tools = tools
        self.body = ""
        self.name: str | None = None
        self._args_start: int | None = None  # where the arguments value starts in body
        self._emitted = 0  # characters of the value already passed on
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self.done = False  # the arguments value is complete

    def feed(self, text: str) -> str:
        """Add body text; return the new argument characters that can be passed on."""
        self.body += text
        if self.name is None and (match := _NAME.search(self.body)):
            self.name = json.loads(match.group(1))
        if self._args_start is None:
            match = _ARGUMENTS.search(self.body)
            if match is None or match.end() == len(self.body):
                return ""
            self._args_start = match.end()
        if self.name is None or self.done or self.body[self._args_start] != "{":
            return ""  # only an object is streamed; anything else is parsed whole
        return self._advance()

    @property
    def streamed(self) -> bool:
        """Whether arguments were passed on (so the caller must not send them again)."""
        return self._emitted > 0

    def close(self) -> tuple[str, list[dict]]:
        """The arguments not passed on yet (all of them, if they were not an object)."""
        if self.streamed:
            if not self.done:
                log.warning("tool call arguments ended unfinished: %r", self.body)
            return "", []
        try:
            parsed = self._parse(self.body, self._tools)
        except Exception as e:
            log.warning("tool call arguments did not parse (%s): %r", e, self.body)
            return "{}", []
        return arguments_json(parsed.get("arguments", {})), []

    def _advance(self) -> str:
        start = self._args_start + self._emitted
        out = []
        for char in self.body[start:]:
            out.append(char)
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
                    break
        self._emitted += len(out)
        return "".join(out)
