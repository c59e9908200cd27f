"""Generation results -> Anthropic messages: a whole message, or its SSE events, built
from the same blocks (a block starts where Choice.add starts one, so indices agree)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from mlxserve.api.anthropic.errors import error_body
from mlxserve.api.anthropic.thinking import signature
from mlxserve.api.sse import SSEWriter
from mlxserve.postprocess.events import Content, Reasoning, ToolCallArguments, ToolCallStart
from mlxserve.protocol.errors import ServiceError
from mlxserve.service.results import Block, Choice, Usage
from mlxserve.service.run import Step

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
MCP_TOOL_USE_PREFIX = "mcptoolu_"


def stop_reason(choice: Choice) -> str:
    if choice.finish_reason == "stop":
        return "stop_sequence" if choice.stop_sequence is not None else "end_turn"
    if choice.context_full:  # Anthropic's own reason when the context, not max_tokens, ends it
        return "model_context_window_exceeded"
    return STOP_REASONS[str(choice.finish_reason)]


def usage_dict(usage: Usage) -> dict:
    """Anthropic counts the prompt in parts: input_tokens are those processed anew, the
    cache read the ones continued from the prompt cache."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def tool_use_id(call_id: str, prefix: str = "toolu_") -> str:
    return prefix + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict:
    """The arguments JSON as an object ({} when the model wrote something else)."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def content_block(block: Block, omitted: bool = False, mcp: dict[str, str] | None = None) -> dict:
    """A block as the whole message has it; thinking with its text `omitted`, or not; a
    call to a tool of `mcp` (its name -> its server's) as an mcp_tool_use."""
    if block.kind == "reasoning":
        text = "" if omitted else block.text
        return {"type": "thinking", "thinking": text, "signature": signature(block.text, omitted)}
    if block.kind == "text":
        return {"type": "text", "text": block.text}
    if mcp and block.name in mcp:
        return {
            "type": "mcp_tool_use",
            "id": tool_use_id(block.call_id, MCP_TOOL_USE_PREFIX),
            "name": block.name,
            "server_name": mcp[block.name],
            "input": tool_input(block.text),
        }
    return {
        "type": "tool_use",
        "id": tool_use_id(block.call_id),
        "name": block.name,
        "input": tool_input(block.text),
    }


@dataclass
class MessageFormat:
    model: str
    # what the request's context edits cleared ({"applied_edits": [...]}), None without
    # context_management: the whole message's field, and the final message_delta's
    context: dict | None = None
    # thinking.display "omitted": thinking blocks without their text (their signature
    # holds it), and no thinking_delta in a stream
    omit_thinking: bool = False
    mcp: dict[str, str] = field(default_factory=dict)  # an MCP tool -> its server's name
    earlier: list[dict] = field(default_factory=list)  # earlier rounds' blocks (MCP calls)
    id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(12)}")

    def message(self, choice: Choice, usage: Usage) -> dict:
        return {
            **self._envelope([*self.earlier, *self.blocks(choice)]),
            "stop_reason": self.stop_reason(choice),
            "stop_sequence": choice.stop_sequence,
            "usage": usage_dict(usage),
            **self.context_management(),
        }

    def blocks(self, choice: Choice) -> list[dict]:
        return [content_block(b, self.omit_thinking, self.mcp) for b in choice.blocks]

    def continues(self, choice: Choice) -> bool:
        """Whether a finished round made MCP calls: they run, then the message goes on."""
        calls = [b for b in choice.blocks if b.kind == "tool_call"]
        return choice.finish_reason == "tool_calls" and any(b.name in self.mcp for b in calls)

    def stop_reason(self, choice: Choice) -> str:
        """tool_use only where the client has calls to run (MCP calls ran here)."""
        reason = stop_reason(choice)
        client_calls = [
            b for b in choice.blocks if b.kind == "tool_call" and b.name not in self.mcp
        ]
        return "end_turn" if reason == "tool_use" and not client_calls else reason

    def context_management(self) -> dict:
        return {} if self.context is None else {"context_management": self.context}

    def start(self, prompt_tokens: int) -> dict:
        """The message_start payload. The prompt cache hit is not known yet: the usage
        of message_delta, at the end, has the final split."""
        usage = usage_dict(Usage(prompt_tokens=prompt_tokens))
        message = {**self._envelope([]), "stop_reason": None, "stop_sequence": None}
        return {"type": "message_start", "message": {**message, "usage": usage}}

    def _envelope(self, content: list[dict]) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
        }


class MessageStream:
    """Writes one message as Anthropic's SSE events."""

    def __init__(self, sse: SSEWriter, fmt: MessageFormat, prompt_tokens: int):
        self._sse = sse
        self._fmt = fmt
        self._prompt_tokens = prompt_tokens
        self._open: int | None = None  # the index of the block being written, in its round
        self._count = 0  # blocks started in this round
        self._base = 0  # the message's blocks before this round's

    def ping(self) -> None:
        """While the prompt is processed: the message starts, pings keep it alive."""
        self._start()
        self._send("ping", {"type": "ping"})

    def step(self, step: Step, usage: Usage) -> None:
        self._start()
        for event in step.events:
            if isinstance(event, ToolCallArguments):
                delta = {"type": "input_json_delta", "partial_json": event.text}
            elif isinstance(event, ToolCallStart):
                self._open_block(step.choice)
                continue
            else:
                kind = "reasoning" if isinstance(event, Reasoning) else "text"
                if self._open is None or step.choice.blocks[self._open].kind != kind:
                    self._open_block(step.choice)
                if kind == "reasoning" and self._fmt.omit_thinking:
                    continue  # the text is in the signature at the block's end
                delta = _text_delta(event)
            self._send("content_block_delta", self._indexed("content_block_delta", delta))
        if step.finished:
            self._close_block(step.choice)
            if not self._fmt.continues(step.choice):
                self._finish(step.choice, usage)

    def finish(self, choice: Choice, usage: Usage) -> None:
        """End a message whose last round's calls ran (it also called the client's)."""
        self._finish(choice, usage)

    def results(self, blocks: list[dict]) -> None:
        """A round's MCP results, each a whole block; the next round's blocks follow."""
        self._base += self._count
        self._count = 0
        for block in blocks:
            self._open = 0
            self._send(
                "content_block_start",
                self._indexed("content_block_start", block, "content_block"),
            )
            self._send("content_block_stop", {"type": "content_block_stop", "index": self._base})
            self._base += 1
        self._open = None

    def error(self, error: ServiceError) -> None:
        self._send("error", error_body(error))

    def _start(self) -> None:
        if not self._sse.started:
            self._send("message_start", self._fmt.start(self._prompt_tokens))

    def _open_block(self, choice: Choice) -> None:
        self._close_block(choice)
        self._open, self._count = self._count, self._count + 1
        start = _block_start(choice.blocks[self._open], self._fmt.mcp)
        self._send(
            "content_block_start", self._indexed("content_block_start", start, "content_block")
        )

    def _close_block(self, choice: Choice) -> None:
        if self._open is None:
            return
        block = choice.blocks[self._open]
        if block.kind == "reasoning":
            sealed = signature(block.text, self._fmt.omit_thinking)
            delta = {"type": "signature_delta", "signature": sealed}
            self._send("content_block_delta", self._indexed("content_block_delta", delta))
        stop = {"type": "content_block_stop", "index": self._base + self._open}
        self._send("content_block_stop", stop)
        self._open = None

    def _finish(self, choice: Choice, usage: Usage) -> None:
        delta = {
            "stop_reason": self._fmt.stop_reason(choice),
            "stop_sequence": choice.stop_sequence,
        }
        payload = {"type": "message_delta", "delta": delta, "usage": usage_dict(usage)}
        payload.update(self._fmt.context_management())
        self._send("message_delta", payload)
        self._send("message_stop", {"type": "message_stop"})

    def _indexed(self, kind: str, value: dict, key: str = "delta") -> dict:
        assert self._open is not None
        return {"type": kind, "index": self._base + self._open, key: value}

    def _send(self, name: str, payload: dict) -> None:
        self._sse.event(payload, name)


def _block_start(block: Block, mcp: dict[str, str]) -> dict:
    """A block as it starts: empty, its content follows as deltas."""
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": ""}
    return {**content_block(Block(block.kind, "", block.call_id, block.name), mcp=mcp), "input": {}}


def _text_delta(event: Content | Reasoning) -> dict:
    if isinstance(event, Reasoning):
        return {"type": "thinking_delta", "thinking": event.text}
    return {"type": "text_delta", "text": event.text}
