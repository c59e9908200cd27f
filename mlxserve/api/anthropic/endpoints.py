"""The Anthropic Messages endpoints: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from dataclasses import dataclass

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
        prepared = self.service.prepare_chat(chat_request(wire), REASONING_FORMAT)
        run = self.service.run(prepared, responder.client_gone)
        fmt = MessageFormat(wire.model)
        if not wire.stream:
            return fmt.message(run.collect()[0], run.usage)
        sse = SSEWriter(responder)
        stream = MessageStream(sse, fmt, len(prepared.prompts[0]))
        keepalive = sse.keepalive(self.service.config.keepalive_seconds, stream.ping)
        try:
            for step in run.steps(keepalive):
                stream.step(step, run.usage)
        except Exception as e:
            stream.error(stream_failure(sse, e))
        sse.close()
        return None

    def count_tokens(self, raw: bytes, responder: Responder) -> dict:
        request = chat_request(parse(CountTokensRequest, raw))
        return {"input_tokens": self.service.prompt_tokens(request)}
