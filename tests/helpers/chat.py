"""Asking a server for a chat reply."""

from __future__ import annotations

from helpers.server import CHAT


def chat(server, messages, **extra):
    status, _, body = server.post(CHAT, {"messages": messages, **extra})
    assert status == 200, body
    return body
