"""OpenAI's Realtime API: a WebSocket at /v1/realtime."""

from __future__ import annotations

from mlxserve.api.realtime.session import RealtimeSession
from mlxserve.api.table import SocketRoute
from mlxserve.service.chat import ChatService


def session(service: ChatService, socket_, turn) -> None:
    RealtimeSession(service, socket_, turn).serve()


SOCKET_ROUTES: tuple[SocketRoute[ChatService], ...] = (SocketRoute("/v1/realtime", session),)
