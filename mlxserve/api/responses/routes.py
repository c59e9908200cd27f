"""OpenAI's Responses routes: create (over HTTP or a WebSocket), compact, stored
responses, and the Conversations API."""

from __future__ import annotations

from mlxserve.api.batches.query import Query
from mlxserve.api.openai.errors import ERRORS, error_reply
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON
from mlxserve.api.responses.conversations import (
    AddItems,
    ConversationEndpoints,
    CreateConversation,
    UpdateConversation,
)
from mlxserve.api.responses.endpoints import ResponsesEndpoints
from mlxserve.api.responses.requests import ResponsesRequest
from mlxserve.api.responses.socket import ResponsesSocket
from mlxserve.api.table import Call, Route, SocketRoute, Turn, by_id, with_body
from mlxserve.service.context import RequestContext

PAGE: dict[str, s.Schema] = {
    "limit": {"type": "integer", "minimum": 1},
    "order": {"enum": ["asc", "desc"]},
    "after": s.STRING,
}
RESPONSE_ID = "response_id"
CONVERSATION_ID = "conversation_id"


def input_items(endpoints: ResponsesEndpoints, call: Call) -> dict:
    return endpoints.input_items(call.params[RESPONSE_ID], call.query)


def socket_session(
    endpoints: ResponsesEndpoints, socket_, opening: RequestContext, turn: Turn
) -> None:
    ResponsesSocket(endpoints, socket_, turn, error_reply).serve()


ROUTES: tuple[Route[ResponsesEndpoints], ...] = (
    Route("POST", "/v1/responses", with_body(ResponsesEndpoints.create), "Create a response", "responses", s.stream(s.RESPONSE), ERRORS, ResponsesRequest),
    Route("POST", "/v1/responses/compact", with_body(ResponsesEndpoints.compact), "Compact a conversation", "responses", {JSON: s.COMPACTION}, ERRORS, ResponsesRequest),
    Route("GET", "/v1/responses/{response_id}", by_id(ResponsesEndpoints.retrieve, RESPONSE_ID), "A stored response", "responses", {JSON: s.RESPONSE}, ERRORS),
    Route("DELETE", "/v1/responses/{response_id}", by_id(ResponsesEndpoints.delete, RESPONSE_ID), "Delete a stored response", "responses", {JSON: s.DELETED_RESPONSE}, ERRORS),
    Route("GET", "/v1/responses/{response_id}/input_items", input_items, "A stored response's input items", "responses", {JSON: s.ITEM_LIST}, ERRORS, query=PAGE),
)  # fmt: skip

SOCKET_ROUTES: tuple[SocketRoute[ResponsesEndpoints], ...] = (
    SocketRoute("/v1/responses", socket_session),
)


def _conversation(call: Call) -> str:
    return call.params[CONVERSATION_ID]


CONVERSATION_ROUTES: tuple[Route[ConversationEndpoints], ...] = (
    Route("POST", "/v1/conversations", lambda e, call: e.create(call.body), "Create a conversation", "responses", {JSON: s.ref("Conversation")}, ERRORS, CreateConversation),
    Route("GET", "/v1/conversations/{conversation_id}", by_id(ConversationEndpoints.retrieve, CONVERSATION_ID), "A conversation", "responses", {JSON: s.ref("Conversation")}, ERRORS),
    Route("POST", "/v1/conversations/{conversation_id}", lambda e, call: e.update(_conversation(call), call.body), "Replace a conversation's metadata", "responses", {JSON: s.ref("Conversation")}, ERRORS, UpdateConversation),
    Route("DELETE", "/v1/conversations/{conversation_id}", by_id(ConversationEndpoints.delete, CONVERSATION_ID), "Delete a conversation", "responses", {JSON: s.DELETED_CONVERSATION}, ERRORS),
    Route("GET", "/v1/conversations/{conversation_id}/items", lambda e, call: e.list_items(_conversation(call), Query(call.query)), "A conversation's items", "responses", {JSON: s.ITEM_LIST}, ERRORS, query={**PAGE, "include": s.array(s.STRING)}),
    Route("POST", "/v1/conversations/{conversation_id}/items", lambda e, call: e.add_items(_conversation(call), call.body, Query(call.query)), "Add items to a conversation", "responses", {JSON: s.ITEM_LIST}, ERRORS, AddItems),
    Route("GET", "/v1/conversations/{conversation_id}/items/{item_id}", lambda e, call: e.item(_conversation(call), call.params["item_id"]), "A conversation's item", "responses", {JSON: s.ITEM}, ERRORS),
    Route("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}", lambda e, call: e.delete_item(_conversation(call), call.params["item_id"]), "Delete an item (answers the conversation)", "responses", {JSON: s.ref("Conversation")}, ERRORS),
)  # fmt: skip
