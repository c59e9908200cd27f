"""Stored responses, for `previous_response_id`, retrieval and input_items: kept in memory,
least recently used first out, under a count and a byte bound.

Each entry holds only its own request's input items and its output; a chain is walked
through its ancestors (each walk marks them all used, so a live conversation is never the
one evicted)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

from mlxserve.protocol.errors import not_found


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the response object as it was returned
    input_items: list[dict]  # the request's own input items, with their ids
    size: int  # bytes, as JSON

    @classmethod
    def of(cls, response: dict, input_items: list[dict]) -> StoredResponse:
        size = len(json.dumps([response, input_items], ensure_ascii=False).encode())
        return cls(response, input_items, size)

    @property
    def previous_id(self) -> str | None:
        return self.response.get("previous_response_id")


class ResponseStore:
    def __init__(self, max_count: int, max_bytes: int):
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, stored: StoredResponse) -> None:
        """Keep a response (unless it alone exceeds the byte bound), evicting the least
        recently used beyond the bounds."""
        if self.max_count < 1 or stored.size > self.max_bytes:
            return
        with self._lock:
            self._entries[stored.response["id"]] = stored
            self._bytes += stored.size
            while len(self._entries) > self.max_count or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        with self._lock:
            stored = self._entries.get(response_id)
            if stored is not None:
                self._entries.move_to_end(response_id)
                return stored
        raise _missing(response_id, param)

    def delete(self, response_id: str) -> None:
        with self._lock:
            stored = self._entries.pop(response_id, None)
            if stored is not None:
                self._bytes -= stored.size
                return
        raise _missing(response_id)

    def history(self, response_id: str) -> list[dict]:
        """The conversation up to and including a stored response: every ancestor's input
        items and output, oldest first."""
        chain: list[StoredResponse] = []
        next_id: str | None = response_id
        while next_id is not None:
            stored = self.get(next_id, "previous_response_id")
            chain.append(stored)
            next_id = stored.previous_id
        return [
            item
            for stored in reversed(chain)
            for item in (*stored.input_items, *stored.response["output"])
        ]


def _missing(response_id: str, param: str | None = None):
    return not_found(
        f"No response with id '{response_id}' is stored: it was never stored (store: false), "
        "was deleted, or was evicted.",
        param=param,
        code="response_not_found" if param is None else "previous_response_not_found",
    )
