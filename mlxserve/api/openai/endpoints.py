"""The OpenAI endpoints: Chat Completions, Completions, models and health."""

from __future__ import annotations

from dataclasses import dataclass

from mlxserve.api.openai.errors import error_body
from mlxserve.api.openai.requests import (
    AdapterLoad,
    AdapterUnload,
    ChatRequest,
    CompletionRequest,
    ModelRequest,
    PinRequest,
    chat_request,
    completion_request,
)
from mlxserve.api.openai.responses import ChatFormat, CompletionFormat
from mlxserve.api.responder import Responder
from mlxserve.api.sse import SSEWriter, keepalive, stream_failure
from mlxserve.api.wire import parse
from mlxserve.keys.caller import Caller
from mlxserve.protocol.errors import ErrorKind, ServiceError, not_found
from mlxserve.service.chat import ChatService, Prepared
from mlxserve.service.context import RequestContext
from mlxserve.service.run import Step


@dataclass
class OpenAIEndpoints:
    service: ChatService

    def health(self) -> tuple[int, dict]:
        return self.service.models.health()

    def models(self, caller: Caller) -> dict:
        return {"object": "list", "data": self.service.models.entries(caller)}

    def model(self, model_id: str, context: RequestContext) -> dict:
        """Any name a request may use: a listed id, or an alias, `default`, a cached
        model or a folder a request may name (its entry, under the name asked for)."""
        for entry in self.service.models.entries(context.caller):
            if entry["id"] == model_id:
                return entry
        try:
            self.service.models.resolve(model_id, context)
        except ServiceError as e:
            # a model the caller's key may not use is not there for it, as in the list
            if e.kind not in (ErrorKind.NOT_FOUND, ErrorKind.FORBIDDEN):
                raise
            raise not_found(
                f"The model '{model_id}' does not exist.", param="model", code="model_not_found"
            ) from e
        return {**self.service.models.entry(model_id), "id": model_id}

    def load_model(self, raw: bytes, responder: Responder) -> dict:
        """POST /v1/models/load: make a model (or an adapter) resident now."""
        name = parse(ModelRequest, raw).model
        self.service.models.load(name)
        return self.service.models.state(name)

    def unload_model(self, raw: bytes, responder: Responder) -> dict:
        """POST /v1/models/unload: free a model's (or an adapter's) memory now (a 409
        while it is busy)."""
        name = parse(ModelRequest, raw).model
        self.service.models.unload(name)
        return self.service.models.state(name)

    def pin_model(self, raw: bytes, responder: Responder) -> dict:
        """POST /v1/models/pin: keep a model (or an adapter) resident, or let it go
        again, whatever --pin said."""
        wire = parse(PinRequest, raw)
        self.service.models.pin(wire.model, wire.pinned)
        return self.service.models.state(wire.model)

    def load_adapter(self, raw: bytes, responder: Responder) -> dict:
        """POST /v1/adapters/load: serve a new adapter, resident now (its /v1/models
        entry)."""
        wire = parse(AdapterLoad, raw)
        self.service.models.add_adapter(wire.name, wire.path, wire.model)
        return self.model(wire.name, responder.context)

    def unload_adapter(self, raw: bytes, responder: Responder) -> dict:
        """POST /v1/adapters/unload: stop serving an adapter."""
        name = parse(AdapterUnload, raw).name
        self.service.models.remove_adapter(name)
        return {"id": name, "object": "model", "deleted": True}

    def chat(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(ChatRequest, raw)
        prepared = self.service.prepare_chat(chat_request(wire), responder.context)
        model = wire.model or self.service.models.alias
        fmt = ChatFormat(model, prepared.texts, legacy_functions=wire.legacy_functions)
        return self._reply(prepared, fmt, wire.stream, wire.include_usage, responder)

    def completion(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(CompletionRequest, raw)
        prepared = self.service.prepare_completion(completion_request(wire), responder.context)
        fmt = CompletionFormat(wire.model or self.service.models.alias, prepared.texts)
        return self._reply(prepared, fmt, wire.stream, wire.include_usage, responder)

    def _reply(
        self,
        prepared: Prepared,
        fmt: ChatFormat | CompletionFormat,
        stream: bool,
        include_usage: bool,
        responder: Responder,
    ) -> dict | None:
        run = self.service.run(prepared)
        if not stream:
            return fmt.response(run.collect(), run.usage)
        sse = SSEWriter(responder)
        pings = keepalive(sse, self.service.config.keepalive_seconds)
        started: set[int] = set()
        try:
            for step in run.steps(pings):
                _send(sse, fmt, step, started)
        except Exception as e:
            sse.event(error_body(stream_failure(sse, e)))
        else:
            if include_usage:
                sse.event(fmt.usage_chunk(run.usage))
        sse.done()
        return None


def _send(
    sse: SSEWriter, fmt: ChatFormat | CompletionFormat, step: Step, started: set[int]
) -> None:
    """A step's chunks; a choice's role chunk waits for its first step, so that an error
    is still a plain reply until then."""
    choice, entries = step.choice, step.logprobs
    if choice.index not in started:
        started.add(choice.index)
        start = fmt.start_chunk(choice.index)  # None: text completions have none
        if start is not None:
            sse.event(start)
    if entries and not step.events:
        sse.event(fmt.event_chunk(choice, None, entries))
    for i, event in enumerate(step.events):
        sse.event(fmt.event_chunk(choice, event, entries if i == 0 else []))
    choice.text_offset += sum(len(fmt.texts(e.token).text) for e in entries)
    if step.finished:
        sse.event(fmt.finish_chunk(choice.index, str(choice.finish_reason)))
