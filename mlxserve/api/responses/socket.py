"""The Responses API over a WebSocket (OpenAI's WebSocket mode, which Codex speaks): each
`response.create` message carries a POST /v1/responses body and is answered with the events
its SSE stream would carry, one text frame each, one response at a time. A turn may continue
the connection's last response with `previous_response_id` and only its new input, stored
or not; `generate: false` readies a turn without an answer."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mlxserve.api.errors import ErrorReply
from mlxserve.api.responses.endpoints import ResponsesEndpoints
from mlxserve.api.responses.last import LastResponse
from mlxserve.api.responses.requests import WARMUP, ResponsesRequest
from mlxserve.api.table import Turn
from mlxserve.api.websocket import SocketEvents, WebSocket
from mlxserve.api.wire import parse_json_body, validate
from mlxserve.protocol.errors import ClientGone, ServiceError, bad_request, internal_error
from mlxserve.service.context import RequestContext

log = logging.getLogger(__name__)

CREATE = "response.create"
# Fields of the message that are not the request's: the event's type, the warm-up switch,
# and what a client says about itself (Codex's `client_metadata`).
TRANSPORT_FIELDS = ("type", "generate", "client_metadata", "stream")
# What a client may say that asks nothing (some Codex builds acknowledge each response).
IGNORED = ("response.processed",)


class ResponsesSocket:
    """One connection's session."""

    def __init__(
        self,
        endpoints: ResponsesEndpoints,
        socket_: WebSocket,
        turn: Turn,
        errors: Callable[[ServiceError], ErrorReply],
    ):
        self._endpoints = endpoints
        self._socket = socket_
        self._turn = turn  # each message is recorded, admitted and counted as a request
        self._errors = errors
        self._last = LastResponse()

    def serve(self) -> None:
        for message in self._socket:
            try:
                event = _event(message)
            except ServiceError as e:  # not a request: refused without counting as one
                self._refuse(e)
                continue
            if event["type"] in IGNORED:
                continue
            try:
                with self._turn(self._socket.gone) as context:
                    self._create(event, context)
            except ServiceError as e:  # before the response began: the turn is refused
                self._refuse(e)
            except ClientGone:
                log.info("the client left during a response")
                return
            except Exception as e:  # a bug: this turn fails, the session goes on
                log.exception("unhandled error in a WebSocket turn")
                self._refuse(internal_error(f"Internal error: {e}"))

    def _create(self, event: dict, context: RequestContext) -> None:
        generate = event.get("generate", True)
        if not isinstance(generate, bool):
            raise bad_request("generate must be true or false.", "generate")
        fields = {k: v for k, v in event.items() if k not in TRANSPORT_FIELDS}
        request = validate(ResponsesRequest, {**fields, "stream": True}, {WARMUP: not generate})
        events = SocketEvents(self._socket)
        if generate:
            self._endpoints.respond(request, context, events, self._last)
        else:
            self._endpoints.warm_up(request, context, events, self._last)

    def _refuse(self, error: ServiceError) -> None:
        """An `error` event with the HTTP status the request would have had (OpenAI's
        shape on this socket); the connection stays open for the next turn."""
        reply = self._errors(error)
        log.info("WebSocket response.create -> %d: %s", reply.status, error.message)
        try:
            self._socket.send_json({"type": "error", "status": reply.status, **reply.body})
        except Exception:  # the client left: nothing to tell
            log.debug("could not send an error event", exc_info=True)


def _event(message: str | bytes) -> dict:
    """A client event: a JSON object of a type this socket takes."""
    if isinstance(message, bytes):
        raise bad_request("Send each event as a JSON text frame, not a binary one.")
    event = parse_json_body(message.encode("utf-8"))
    kind = event.get("type")
    if kind != CREATE and kind not in IGNORED:
        raise bad_request(f"Unknown event type {kind!r}: this socket takes '{CREATE}'.", "type")
    return event
