"""OpenAI's Realtime API: a WebSocket at /v1/realtime."""

from __future__ import annotations

from mlxserve.api.realtime.session import RealtimeSession
from mlxserve.api.table import SocketRoute, Turn
from mlxserve.service.chat import ChatService
from mlxserve.service.context import RequestContext


def session(service: ChatService, socket_, opening: RequestContext, turn: Turn) -> None:
    RealtimeSession(service, socket_, opening, turn).serve()


SOCKET_ROUTES: tuple[SocketRoute[ChatService], ...] = (SocketRoute("/v1/realtime", session),)
