"""Streams the arguments of an XML-style call by re-parsing the growing body.

mlx-lm's parser for the format is run on the body so far (closed with the format's suffix);
it sees complete parameters only, and a complete parameter never changes, so the JSON of
the arguments only grows: everything but its closing brace can be passed on. The call
starts once its first argument is complete, when its name is certainly complete too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def arguments_json(arguments) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


class ReparseArgumentsStream:
    def __init__(self, parse: Callable, tools: list[dict] | None, suffix: str):
        self._parse = parse
        self._tools = tools
        self._suffix = suffix
        self.body = ""
        self.name: str | None = None
        self._emitted = ""

    @property
    def streamed(self) -> bool:
        return bool(self._emitted)

    def feed(self, text: str) -> str:
        self.body += text
        calls = self._calls(self.body if self._suffix in self.body else self.body + self._suffix)
        if (
            not calls
            or not isinstance(calls[0].get("arguments"), dict)
            or not calls[0]["arguments"]
        ):
            return ""
        self.name = self.name or calls[0]["name"]
        return self._extend(arguments_json(calls[0]["arguments"])[:-1])

    def close(self) -> tuple[str, list[dict]]:
        """The rest of the first call's arguments, and any further calls in the body."""
        calls = self._calls(self.body) or [{"arguments": {}}]
        rest = self._extend(arguments_json(calls[0].get("arguments", {})))
        return rest, calls[1:]

    def _extend(self, text: str) -> str:
        if not text.startswith(self._emitted):
            log.warning("tool call arguments changed while streaming: %r", self.body)
            return ""
        fragment, self._emitted = text[len(self._emitted) :], text
        return fragment

    def _calls(self, body: str) -> list[dict]:
        try:
            parsed = self._parse(body, self._tools)
        except Exception:
            return []
        return [c for c in (parsed if isinstance(parsed, list) else [parsed]) if c.get("name")]
