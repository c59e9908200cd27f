"""What the output parser emits: reasoning, content and tool-call pieces, in order."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """A fragment of the call's arguments; the fragments concatenate to a JSON string."""

    index: int
    text: str


Event = Reasoning | Content | ToolCallStart | ToolCallArguments
