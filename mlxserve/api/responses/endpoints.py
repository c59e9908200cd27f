"""The OpenAI Responses endpoints: POST /v1/responses, and GET / DELETE of stored responses
and their input items. Errors go out in OpenAI's shape (this is an OpenAI API); a stream
that fails ends with `error` and `response.failed` events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from pydantic import TypeAdapter

from mlxserve.api.batches.keeper import store_path
from mlxserve.api.batches.owners import visible
from mlxserve.api.responder import Responder
from mlxserve.api.responses.compaction import compaction_item, summary_request
from mlxserve.api.responses.conversation import InputItem, ItemReference, MessageItem
from mlxserve.api.responses.conversations import ConversationEndpoints
from mlxserve.api.responses.files import FileInputs
from mlxserve.api.responses.items import kept, substituted
from mlxserve.api.responses.last import LastResponse
from mlxserve.api.responses.mcp import McpRound, McpToolSpec, McpTurn, not_run
from mlxserve.api.responses.mcp import turn as mcp_turn
from mlxserve.api.responses.output import (
    MCP_APPROVAL,
    MCP_CALL,
    ResponseBuilder,
    ResponseStream,
)
from mlxserve.api.responses.requests import (
    FunctionTool,
    Resolved,
    ResponsesRequest,
    chat_request,
)
from mlxserve.api.responses.store import ResponseStore, StoredResponse
from mlxserve.api.sse import EventSink, SSEWriter, keepalive, stream_failure
from mlxserve.api.wire import parse
from mlxserve.conversations.store import ConversationStore
from mlxserve.mcp.hub import McpHub
from mlxserve.protocol.errors import bad_request, not_found
from mlxserve.protocol.request import ChatRequest
from mlxserve.service.chat import ChatService
from mlxserve.service.context import RequestContext
from mlxserve.service.results import Choice, Usage

# Reasoning goes out as reasoning items whatever --reasoning-format says.
REASONING_FORMAT = "separate"
# Rounds of MCP calls in one response at most, where max_tool_calls does not say.
MAX_MCP_ROUNDS = 32
_ITEMS = TypeAdapter(list[InputItem])
MB = 1 << 20


@dataclass
class ResponsesEndpoints:
    service: ChatService
    files: FileInputs  # the uploaded files a request may name
    mcp: McpHub  # the MCP servers of --mcp-config, whose tools `mcp` tools name
    store: ResponseStore = field(init=False)
    conversations: ConversationEndpoints = field(init=False)

    def __post_init__(self):
        config = self.service.config
        max_bytes = int(config.responses_store_mb * MB)
        self.store = ResponseStore(config.responses_store_size, max_bytes)
        store = ConversationStore(store_path(config))
        self.conversations = ConversationEndpoints(store, self.resolve_items)

    def create(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(ResponsesRequest, raw)
        sink = SSEWriter(responder) if wire.stream else None
        return self.respond(wire, responder.context, sink)

    def respond(
        self,
        request: ResponsesRequest,
        context: RequestContext,
        sink: EventSink | None,
        last: LastResponse | None = None,
    ) -> dict | None:
        """Answer a request: whole (returned) or as events into `sink`. `last`: the
        connection's own last response (a WebSocket's), which `previous_response_id` may
        continue unstored."""
        wire = self._resolved(request)
        history = self._history(wire, last)
        keep = self._keeper(wire, history, last)
        mcp = self._mcp_turn(wire, history, context)
        if mcp is not None:
            try:
                approved = mcp.approved(_given(wire), history)
                self._chat(wire, history, mcp.round(approved))  # refused here, before a call
                return self._rounds(wire, history, mcp, approved, context, sink, keep)
            finally:
                mcp.close()
        chat = self._chat(wire, history)
        if wire.compaction_triggered:
            return self._compaction(wire, chat, context, sink, keep)
        prepared = self.service.prepare_chat(chat, context, REASONING_FORMAT)
        fmt = self._builder(wire, prepared.texts if wire.logprobs is not None else None)
        run = self.service.run(prepared)
        if sink is not None:
            self._stream(run, fmt, sink, keep)
            return None
        choice = None
        for step in run.steps():
            fmt.place_logprobs(step)
            choice = step.choice
        assert choice is not None  # a run's steps end with a finished choice
        response = fmt.response(_status(choice), choice, run.usage)
        keep(response)
        return response

    def warm_up(
        self,
        request: ResponsesRequest,
        context: RequestContext,
        sink: EventSink,
        last: LastResponse,
    ) -> None:
        """A WebSocket's `generate: false` (Codex sends its instructions and tools so as a
        session starts): a response with no output whose id the next turn continues. The
        prompt is not computed ahead: a client that does not wait for its user (`codex
        exec`) would pay for it twice (docs/api-responses.md, WebSocket mode)."""
        wire = self._resolved(request)
        history = self._history(wire, last)
        # refused here for what a turn would refuse (a model the key may not use, unknown
        # files, malformed items)
        self.service.models.resolve(wire.model, context)
        self._chat(wire, history, warmup=True)
        fmt = self._builder(wire, None)
        response = fmt.response("completed", usage=Usage())
        self._keeper(wire, history, last)(response)
        ResponseStream(sink, fmt).whole(response)

    def compact(self, raw: bytes, responder: Responder) -> dict | None:
        """POST /v1/responses/compact: the conversation's compaction, as a
        `response.compaction` object (never stored, never streamed)."""
        wire = self._resolved(parse(ResponsesRequest, raw))
        if wire.stream:
            raise bad_request("/v1/responses/compact does not stream.", "stream")
        chat = self._chat(wire, self._history(wire))
        response = self._compaction(wire, chat, responder.context, None, lambda _: None)
        assert response is not None  # not streamed
        return {
            "id": response["id"],
            "object": "response.compaction",
            "created_at": response["created_at"],
            "output": response["output"],
            "usage": response["usage"],
        }

    def _compaction(
        self,
        wire: Resolved,
        chat: ChatRequest,
        context: RequestContext,
        sse: EventSink | None,
        keep,
    ) -> dict | None:
        """A response whose one output item is the conversation's compaction: a summary
        the model writes (compaction.py), sealed."""
        prepared = self.service.prepare_chat(summary_request(chat), context, REASONING_FORMAT)
        fmt = self._builder(wire, None)
        run = self.service.run(prepared)
        stream = ResponseStream(sse, fmt) if sse is not None else None
        seconds = self.service.config.keepalive_seconds
        pings = keepalive(sse, seconds, stream.keepalive if stream is not None else None)
        try:
            finished = [step.choice for step in run.steps(pings) if step.finished]
        except Exception as e:
            if stream is None or sse is None:
                raise
            keep(stream.fail(stream_failure(sse, e), None))
            sse.close()
            return None
        response = fmt.response("completed", usage=run.usage)
        summary = finished[0].text.strip() or finished[0].reasoning.strip()
        response["output"] = [compaction_item(summary)]
        keep(response)
        if stream is None or sse is None:
            return response
        stream.whole(response)
        sse.close()
        return None

    def _chat(
        self,
        wire: Resolved,
        history: list[dict],
        mcp: McpRound | None = None,
        warmup: bool = False,
    ) -> ChatRequest:
        """The neutral request: the history (`_history`), then the input (then, with MCP
        tools, the turn's earlier rounds)."""
        return chat_request(wire, _ITEMS.validate_python(history), self.files, warmup, mcp)

    def _mcp_turn(
        self, wire: Resolved, history: list[dict], context: RequestContext
    ) -> McpTurn | None:
        tools = wire.tools or []
        specs = [(i, tool) for i, tool in enumerate(tools) if isinstance(tool, McpToolSpec)]
        own = {tool.name for tool in tools if isinstance(tool, FunctionTool)}
        allow = self.service.config.mcp_allow_urls
        return mcp_turn(specs, self.mcp, history, own, allow, context)

    def _rounds(
        self,
        wire: Resolved,
        history: list[dict],
        mcp: McpTurn,
        approved: list[dict],
        context: RequestContext,
        sink: EventSink | None,
        keep,
    ) -> dict | None:
        """A turn with MCP tools: the calls the input approves run, then rounds of
        generation, each continued (from the prompt cache) by the outputs of the MCP calls
        the one before made, until a round makes none (the answer, calls for the client,
        calls to approve) or MAX_MCP_ROUNDS are done."""
        fmt = self._builder(wire, None, mcp)
        fmt.earlier += [mcp.run(item) for item in approved]
        stream = ResponseStream(sink, fmt) if sink is not None else None
        seconds = self.service.config.keepalive_seconds
        pings = keepalive(sink, seconds, stream.keepalive if stream is not None else None)
        usage, calls, choice = Usage(), 0, None
        try:
            if stream is not None:
                stream.earlier()
            for _ in range(MAX_MCP_ROUNDS):
                exhausted = wire.max_tool_calls is not None and calls >= wire.max_tool_calls
                chat = self._chat(wire, history, mcp.round(fmt.earlier, exhausted))
                prepared = self.service.prepare_chat(chat, context, REASONING_FORMAT)
                fmt.texts = prepared.texts if wire.logprobs is not None else None
                run = self.service.run(prepared)
                choice, response = self._round(run, fmt, stream, usage, pings)
                usage += run.usage
                if response is not None:
                    break
                items = [fmt.item(i, block) for i, block in enumerate(choice.blocks)]
                ran = []
                for item in items:
                    if item["type"] == MCP_CALL:
                        limit = wire.max_tool_calls
                        item = mcp.run(item) if limit is None or calls < limit else not_run(item)
                        calls += 1
                    ran.append(item)
                fmt.next_round(ran)
                if stream is not None:
                    stream.ran(ran)
                if any(item["type"] in ("function_call", MCP_APPROVAL) for item in ran):
                    response = fmt.response("completed", usage=usage)
                    if stream is not None:
                        stream.finish(response)
                    break
            else:
                response = fmt.response("incomplete", usage=usage)
                response["incomplete_details"] = {"reason": "max_tool_calls"}
                if stream is not None:
                    stream.finish(response)
        except Exception as e:
            if stream is None or sink is None:
                raise
            response = stream.fail(stream_failure(sink, e), choice)
        keep(response)
        if sink is None:
            return response
        sink.close()
        return None

    def _round(
        self,
        run,
        fmt: ResponseBuilder,
        stream: ResponseStream | None,
        before: Usage,
        pings: Callable[[], None],
    ) -> tuple[Choice, dict | None]:
        """One round's generation, streamed where asked; its final choice, and the
        response where the round ends the turn (None where its MCP calls run next)."""
        choice, response = None, None
        for step in run.steps(pings):
            fmt.place_logprobs(step)
            choice = step.choice
            if stream is not None:
                response = stream.step(step, before + run.usage) or response
        assert choice is not None  # a run's steps end with a finished choice
        if fmt.continues(choice):
            return choice, None
        if response is None:
            response = fmt.response(_status(choice), choice, before + run.usage)
        return choice, response

    def _history(self, wire: Resolved, last: LastResponse | None = None) -> list[dict]:
        """The items before the input: the chain `previous_response_id` continues (the
        connection's own last response, else the stored ones), or the conversation's."""
        previous = wire.previous_response_id
        if previous is not None:
            own = last.history(previous) if last is not None else None
            return own if own is not None else self.store.history(previous)
        if wire.conversation_id is not None:
            record = self.conversations.record(wire.conversation_id, "conversation")
            return self.conversations.store.items(record.id)
        return []

    def _resolved(self, wire: ResponsesRequest) -> Resolved:
        """The request with each item_reference replaced by the stored item it names."""
        if wire.conversation is not None and wire.previous_response_id is not None:
            raise bad_request(
                "Give conversation or previous_response_id, not both.", "conversation"
            )
        if isinstance(wire.input, str):
            return Resolved.model_construct(**dict(wire))
        stored = self.resolve_items(wire.input, "input")
        items = substituted(wire.input, stored)
        return Resolved.model_construct(**{**dict(wire), "input": items}, referenced=stored)

    def resolve_items(self, items: list, param: str) -> dict[int, dict]:
        """The index of each item_reference among `items` -> the stored item it names: an
        input or output item of a stored response, or a conversation's item."""
        return {
            i: self._stored_item(item.id, f"{param}[{i}].id")
            for i, item in enumerate(items)
            if isinstance(item, ItemReference)
        }

    def _stored_item(self, item_id: str, param: str) -> dict:
        found = self.store.item(item_id)
        if found is not None:
            return found
        for item, owner in self.conversations.store.holders(item_id):
            if visible(owner):
                return item
        raise not_found(
            f"Item with id '{item_id}' not found: it was never stored (store: false), "
            "was deleted, or was evicted. Send the item itself, or store responses.",
            param,
            code="item_not_found",
        )

    def _builder(
        self, wire: ResponsesRequest, texts, mcp: McpTurn | None = None
    ) -> ResponseBuilder:
        return ResponseBuilder(
            wire.model or self.service.models.alias,
            self._settings(wire),
            summary=wire.summary is not None,
            encrypted=wire.encrypted_reasoning,
            namespaces=wire.namespaces,
            texts=texts,
            mcp=mcp.labels() if mcp else {},
            approval=mcp.approval if mcp else frozenset(),
            earlier=list(mcp.listed) if mcp else [],
        )

    def _keeper(self, wire: Resolved, history: list[dict], last: LastResponse | None):
        """What keeps a response once made: the store (unless store is false), the
        conversation the turn continues (its input and output added, in order), and the
        connection's memory of its last response."""

        def keep(response: dict) -> None:
            if last is None and wire.conversation_id is None and not wire.store:
                return  # nothing keeps it: no item list is built
            items = _input_items(wire)
            if last is not None:
                last.remember(response, [*history, *items])
            if wire.conversation_id is not None:
                self.conversations.store.add(wire.conversation_id, [*items, *response["output"]])
            if wire.store:
                self.store.put(StoredResponse.of(response, items))

        return keep

    def _stream(self, run, fmt: ResponseBuilder, sse: EventSink, keep) -> None:
        """Stream the response; it is stored before the stream ends, so a client that
        has read the last event finds it stored."""
        stream = ResponseStream(sse, fmt)
        pings = keepalive(sse, self.service.config.keepalive_seconds, stream.keepalive)
        response, choice = None, None
        try:
            for step in run.steps(pings):
                choice = step.choice
                response = stream.step(step, run.usage) or response
        except Exception as e:
            response = stream.fail(stream_failure(sse, e), choice)
        keep(response)
        sse.close()

    # Stored responses -------------------------------------------------------------------

    def retrieve(self, response_id: str) -> dict:
        return self.store.get(response_id).response

    def delete(self, response_id: str) -> dict:
        self.store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def input_items(self, response_id: str, query: str) -> dict:
        """A page of a response's input items (newest first unless order=asc)."""
        items = self.store.get(response_id).input_items
        args = {k: v[-1] for k, v in parse_qs(query).items()}
        order = args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise bad_request("order must be 'asc' or 'desc'.", "order")
        limit = args.get("limit", "20")
        if not limit.isdigit() or not 1 <= int(limit) <= 100:
            raise bad_request("limit must be an integer from 1 to 100.", "limit")
        items = items if order == "asc" else items[::-1]
        if "after" in args:
            ids = [item["id"] for item in items]
            if args["after"] not in ids:
                raise not_found(f"No input item with id '{args['after']}'.", "after")
            items = items[ids.index(args["after"]) + 1 :]
        page = items[: int(limit)]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page),
        }

    def _settings(self, wire: ResponsesRequest) -> dict:
        """The request's settings as every response object echoes them (sampling values
        as used: the server's defaults where the request left them out)."""
        defaults = self.service.config.defaults
        text_format = wire.text.format if wire.text else None
        return {
            "instructions": wire.instructions,
            "max_output_tokens": wire.max_output_tokens,
            "max_tool_calls": wire.max_tool_calls,
            "metadata": wire.metadata or {},
            "parallel_tool_calls": wire.parallel_tool_calls,
            "previous_response_id": wire.previous_response_id,
            "conversation": {"id": wire.conversation_id} if wire.conversation_id else None,
            "reasoning": {
                "effort": wire.reasoning.effort if wire.reasoning else None,
                "summary": wire.summary,
            },
            "service_tier": "default",
            "store": wire.store,
            "temperature": defaults.temperature if wire.temperature is None else wire.temperature,
            "text": {
                "format": _dump(text_format) if text_format else {"type": "text"},
            },
            "tool_choice": wire.tool_choice or "auto",
            "tools": [_dump(tool) for tool in wire.tools or []],
            "top_logprobs": wire.top_logprobs or 0,
            "top_p": defaults.top_p if wire.top_p is None else wire.top_p,
            "truncation": wire.truncation,
            "user": wire.user,
        }


def _given(wire: Resolved) -> list:
    """The input's items (a string input has none)."""
    return [] if isinstance(wire.input, str) else wire.input


def _status(choice: Choice) -> str:
    return "incomplete" if choice.finish_reason == "length" else "completed"


def _dump(model) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True)


def _input_items(wire: Resolved) -> list[dict]:
    """The request's input as input_items lists it (a string as one user message)."""
    if isinstance(wire.input, str):
        return kept([MessageItem(role="user", content=wire.input)], {})
    return kept(wire.input, wire.referenced)
