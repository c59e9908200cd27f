"""The Anthropic Messages endpoints: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from dataclasses import dataclass

from mlxserve.api.anthropic import context
from mlxserve.api.anthropic.requests import CountTokensRequest, MessagesRequest, chat_request
from mlxserve.api.anthropic.responses import MessageFormat, MessageStream
from mlxserve.api.responder import Responder
from mlxserve.api.sse import SSEWriter, stream_failure
from mlxserve.api.wire import parse
from mlxserve.service.chat import ChatService

# Thinking goes out as thinking blocks whatever --reasoning-format says: they are
# Anthropic's own way to show it.
REASONING_FORMAT = "separate"


@dataclass
class AnthropicEndpoints:
    service: ChatService

    def messages(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(MessagesRequest, raw)
        edited = context.edit(wire.context_management, wire.messages, self._tokens(wire))
        request = chat_request(wire.model_copy(update={"messages": edited.messages}))
        prepared = self.service.prepare_chat(request, REASONING_FORMAT)
        run = self.service.run(prepared, responder.client_gone)
        # with context_management, the reply says what it cleared (maybe nothing)
        applied = None if wire.context_management is None else {"applied_edits": edited.applied}
        omitted = wire.thinking is not None and wire.thinking.omitted
        fmt = MessageFormat(wire.model, applied, omit_thinking=omitted)
        if not wire.stream:
            return fmt.message(run.collect()[0], run.usage)
        sse = SSEWriter(responder)
        stream = MessageStream(sse, fmt, len(prepared.prompts[0]))
        keepalive = sse.keepalive(self.service.config.keepalive_seconds, stream.ping)
        try:
            for step in run.steps(keepalive):
                stream.step(step, run.usage)
                if omitted and not step.finished:  # hidden thinking writes nothing meanwhile
                    keepalive()
        except Exception as e:
            stream.error(stream_failure(sse, e))
        sse.close()
        return None

    def count_tokens(self, raw: bytes, responder: Responder) -> dict:
        """The prompt's tokens once the request's context edits are applied; with
        `context_management`, the count before them as `original_input_tokens`."""
        wire = parse(CountTokensRequest, raw)
        tokens = self._tokens(wire)
        edited = context.edit(wire.context_management, wire.messages, tokens)
        reply: dict = {"input_tokens": tokens(edited.messages)}
        if wire.context_management is not None:
            reply["context_management"] = {"original_input_tokens": tokens(wire.messages)}
        return reply

    def _tokens(self, wire: CountTokensRequest) -> context.PromptTokens:
        """The prompt tokens of `wire` with other messages, counted by the service as
        count_tokens counts them."""
        return context.PromptTokens(
            lambda messages: self.service.prompt_tokens(
                chat_request(wire.model_copy(update={"messages": messages}))
            )
        )
