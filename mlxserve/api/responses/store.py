"""Stored responses, for `previous_response_id`, `item_reference`, retrieval and
input_items: kept in memory, least recently used first out, under a count and a byte bound.

Each entry holds only its own request's input items and its output; a chain is walked
through its ancestors (each walk marks them all used, so a live conversation is never the
one evicted). Each is its API key's: another key's is answered as never stored."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

from mlxserve.api.batches.owners import new_owner, visible
from mlxserve.protocol.errors import not_found


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the response object as it was returned
    input_items: list[dict]  # the request's own input items, with their ids
    size: int  # bytes, as JSON
    owner: str | None  # the API key's name that made it (None: no keys)

    @classmethod
    def of(cls, response: dict, input_items: list[dict]) -> StoredResponse:
        """The response the caller has just been given, as its key's."""
        size = len(json.dumps([response, input_items], ensure_ascii=False).encode())
        return cls(response, input_items, size, new_owner())

    @property
    def items(self) -> tuple[dict, ...]:
        """Its input items and its output items, each with its id."""
        return (*self.input_items, *self.response["output"])

    @property
    def previous_id(self) -> str | None:
        return self.response.get("previous_response_id")


class ResponseStore:
    def __init__(self, max_count: int, max_bytes: int):
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        # an item's id -> the responses that hold it (a referenced item is in both)
        self._holders: dict[str, list[str]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, stored: StoredResponse) -> None:
        """Keep a response (unless it alone exceeds the byte bound), evicting the least
        recently used beyond the bounds."""
        if self.max_count < 1 or stored.size > self.max_bytes:
            return
        response_id = stored.response["id"]
        with self._lock:
            self._entries[response_id] = stored
            self._bytes += stored.size
            for item_id in _ids(stored):
                self._holders.setdefault(item_id, []).append(response_id)
            while len(self._entries) > self.max_count or self._bytes > self.max_bytes:
                self._forget(next(iter(self._entries)))

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        with self._lock:
            stored = self._entries.get(response_id)
            if stored is not None and visible(stored.owner):
                self._entries.move_to_end(response_id)
                return stored
        raise _missing(response_id, param)

    def item(self, item_id: str) -> dict | None:
        """A stored item (input or output) by its id; None where no response of the
        caller's key holds it."""
        with self._lock:
            for holder in reversed(self._holders.get(item_id, [])):
                stored = self._entries[holder]
                if visible(stored.owner):
                    self._entries.move_to_end(holder)
                    return next(item for item in stored.items if item.get("id") == item_id)
            return None

    def delete(self, response_id: str) -> None:
        with self._lock:
            stored = self._entries.get(response_id)
            if stored is not None and visible(stored.owner):
                self._forget(response_id)
                return
        raise _missing(response_id)

    def _forget(self, response_id: str) -> None:
        stored = self._entries.pop(response_id)
        self._bytes -= stored.size
        for item_id in _ids(stored):
            holders = self._holders[item_id]
            holders.remove(response_id)
            if not holders:
                del self._holders[item_id]

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


def _ids(stored: StoredResponse) -> set[str]:
    return {item["id"] for item in stored.items if "id" in item}


def _missing(response_id: str, param: str | None = None):
    return not_found(
        f"No response with id '{response_id}' is stored: it was never stored (store: false), "
        "was deleted, or was evicted.",
        param=param,
        code="response_not_found" if param is None else "previous_response_not_found",
    )
