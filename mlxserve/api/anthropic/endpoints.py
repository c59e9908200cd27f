"""The Anthropic Messages endpoints: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mlxserve.api.anthropic import context
from mlxserve.api.anthropic.mcp import McpConnector, connector
from mlxserve.api.anthropic.requests import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    assistant_turn,
    chat_request,
)
from mlxserve.api.anthropic.responses import MessageFormat, MessageStream
from mlxserve.api.responder import Responder
from mlxserve.api.sse import SSEWriter, keepalive, stream_failure
from mlxserve.api.wire import parse
from mlxserve.mcp.hub import McpHub
from mlxserve.protocol import request as neutral
from mlxserve.protocol.request import ChatRequest
from mlxserve.service.chat import ChatService
from mlxserve.service.context import RequestContext
from mlxserve.service.results import Choice, Usage

# Thinking goes out as thinking blocks whatever --reasoning-format says: they are
# Anthropic's own way to show it.
REASONING_FORMAT = "separate"


# Rounds of MCP calls in one message at most.
MAX_MCP_ROUNDS = 32


@dataclass
class AnthropicEndpoints:
    service: ChatService
    mcp: McpHub  # where the MCP connector's servers are connected

    def messages(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(MessagesRequest, raw)
        edited = context.edit(
            wire.context_management, wire.messages, self._tokens(wire, responder.context)
        )
        request = chat_request(wire.model_copy(update={"messages": edited.messages}))
        mcp = connector(wire, self.mcp, self.service.config.mcp_allow_urls, responder.context)
        if mcp is not None:
            try:
                return self._rounds(wire, request, mcp, edited.applied, responder)
            finally:
                mcp.close()
        prepared = self.service.prepare_chat(request, responder.context, REASONING_FORMAT)
        run = self.service.run(prepared)
        # with context_management, the reply says what it cleared (maybe nothing)
        applied = None if wire.context_management is None else {"applied_edits": edited.applied}
        omitted = wire.thinking is not None and wire.thinking.omitted
        fmt = MessageFormat(wire.model, applied, omit_thinking=omitted)
        if not wire.stream:
            return fmt.message(run.collect()[0], run.usage)
        sse = SSEWriter(responder)
        stream = MessageStream(sse, fmt, len(prepared.prompts[0]))
        pings = keepalive(sse, self.service.config.keepalive_seconds, stream.ping)
        try:
            for step in run.steps(pings):
                stream.step(step, run.usage)
                if omitted and not step.finished:  # hidden thinking writes nothing meanwhile
                    pings()
        except Exception as e:
            stream.error(stream_failure(sse, e))
        sse.close()
        return None

    def _rounds(
        self,
        wire: MessagesRequest,
        request: ChatRequest,
        mcp: McpConnector,
        applied: list,
        responder: Responder,
    ) -> dict | None:
        """A message with the MCP connector's tools: rounds of generation, each continued
        (from the prompt cache) by the results of the MCP calls the one before made, until
        a round makes none (the answer, or calls for the client) or MAX_MCP_ROUNDS are
        done. The message holds every round's blocks, each call's result after it."""
        applied_edits = None if wire.context_management is None else {"applied_edits": applied}
        omitted = wire.thinking is not None and wire.thinking.omitted
        fmt = MessageFormat(wire.model, applied_edits, omit_thinking=omitted, mcp=mcp.labels())
        sse = SSEWriter(responder) if wire.stream else None
        stream, usage, choice = None, Usage(), None
        request = replace(request, tools=request.tools + mcp.tools())
        try:
            for _ in range(MAX_MCP_ROUNDS):
                extra = _round_messages(fmt.earlier)
                prepared = self.service.prepare_chat(
                    replace(request, messages=request.messages + extra),
                    responder.context,
                    REASONING_FORMAT,
                )
                run = self.service.run(prepared)
                if sse is not None and stream is None:
                    stream = MessageStream(sse, fmt, len(prepared.prompts[0]))
                choice = self._round(run, stream, usage, sse)
                usage += run.usage
                if not fmt.continues(choice):
                    break
                blocks = fmt.blocks(choice)
                results = [mcp.run(b) for b in blocks if b["type"] == "mcp_tool_use"]
                fmt.earlier += [*blocks, *results]
                if stream is not None:
                    stream.results(results)
                if any(b["type"] == "tool_use" for b in blocks):
                    break  # the client runs its own calls: the message ends here
        except Exception as e:
            if stream is None or sse is None:
                raise
            stream.error(stream_failure(sse, e))
            sse.close()
            return None
        assert choice is not None
        if stream is None or sse is None:
            message = fmt.message(choice, usage)
            if fmt.continues(choice):  # ended after its calls ran: they are in `earlier`
                message["content"] = fmt.earlier
            return message
        if fmt.continues(choice):
            stream.finish(choice, usage)
        sse.close()
        return None

    def _round(self, run, stream: MessageStream | None, before: Usage, sse) -> Choice:
        if stream is None:
            return run.collect()[0]
        pings = keepalive(sse, self.service.config.keepalive_seconds, stream.ping)
        choice = None
        for step in run.steps(pings):
            stream.step(step, before + run.usage)
            choice = step.choice
        assert choice is not None
        return choice

    def count_tokens(self, raw: bytes, responder: Responder) -> dict:
        """The prompt's tokens once the request's context edits are applied; with
        `context_management`, the count before them as `original_input_tokens`."""
        wire = parse(CountTokensRequest, raw)
        tokens = self._tokens(wire, responder.context)
        edited = context.edit(wire.context_management, wire.messages, tokens)
        reply: dict = {"input_tokens": tokens(edited.messages)}
        if wire.context_management is not None:
            reply["context_management"] = {"original_input_tokens": tokens(wire.messages)}
        return reply

    def _tokens(self, wire: CountTokensRequest, asked: RequestContext) -> context.PromptTokens:
        """The prompt tokens of `wire` with other messages, counted by the service as
        count_tokens counts them."""
        return context.PromptTokens(
            lambda messages: self.service.prompt_tokens(
                chat_request(wire.model_copy(update={"messages": messages})), asked
            )
        )


def _round_messages(blocks: list[dict]) -> tuple[neutral.Message, ...]:
    """The earlier rounds' blocks (calls, their results, the text around them) as the
    prompt continues them: the assistant's turn, each result a tool message."""
    if not blocks:
        return ()
    message = Message.model_validate({"role": "assistant", "content": blocks})
    assert isinstance(message.content, list)
    return tuple(assistant_turn(message.content, "messages"))
