"""A choice as it accumulates from its events, and the request's usage: what every
dialect renders a whole reply from (a stream is rendered from the same events)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mlxserve.postprocess.events import Content, Event, Reasoning, ToolCallStart


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, those continued from the prompt cache
    reasoning_tokens: int = 0  # of the completion tokens, those spent reasoning

    def __add__(self, other: Usage) -> Usage:
        """Two runs' usage together (the rounds of a turn that runs MCP tools)."""
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]


BlockKind = Literal["reasoning", "text", "tool_call"]


@dataclass
class Block:
    """A run of one kind of output: reasoning, text, or one tool call (its arguments are
    the JSON text)."""

    kind: BlockKind
    text: str = ""
    call_id: str = ""
    name: str = ""


@dataclass
class Choice:
    """One choice: its output blocks in the order the model wrote them."""

    index: int
    blocks: list[Block] = field(default_factory=list)
    finish_reason: str | None = None  # stop, length or tool_calls
    context_full: bool = False  # length: the context was full before max_tokens was reached
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    logprobs: list[TokenLogprob] | None = None
    text_offset: int = 0  # characters covered by the logprobs already streamed
    reasoning_tokens: int = 0

    def add(self, event: Event) -> None:
        if isinstance(event, ToolCallStart):
            self.blocks.append(Block("tool_call", call_id=event.id, name=event.name))
        elif isinstance(event, Content | Reasoning):
            kind: BlockKind = "text" if isinstance(event, Content) else "reasoning"
            if not self.blocks or self.blocks[-1].kind != kind:
                self.blocks.append(Block(kind))
            self.blocks[-1].text += event.text
        else:
            self.tool_calls[event.index].text += event.text

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.blocks if b.kind == "text")

    @property
    def reasoning(self) -> str:
        return "".join(b.text for b in self.blocks if b.kind == "reasoning")

    @property
    def tool_calls(self) -> list[Block]:
        return [b for b in self.blocks if b.kind == "tool_call"]
