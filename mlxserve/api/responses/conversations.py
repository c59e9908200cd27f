"""OpenAI's Conversations API: /v1/conversations[/{id}[/items[/{item_id}]]] (each also
without its /v1). A conversation is a list of items kept in SQLite, owned by the key that
made it; `conversation` on POST /v1/responses continues one and adds the turn to it
(endpoints.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from mlxserve.api.batches.owners import new_owner, visible
from mlxserve.api.batches.query import Query
from mlxserve.api.responses.conversation import CompactionTrigger, InputItem, OtherItem
from mlxserve.api.responses.items import kept, substituted
from mlxserve.api.responses.requests import INCLUDABLE, Metadata
from mlxserve.api.wire import Strict, parse
from mlxserve.conversations.store import ConversationRecord, ConversationStore
from mlxserve.protocol.errors import bad_request, not_found

MAX_ITEMS = 20  # items per create or add request, as OpenAI bounds them

# (input item models, their param) -> the index of each reference -> the stored item
Resolver = Callable[[list, str], dict[int, dict]]


class CreateConversation(Strict):
    items: Annotated[list[InputItem], Field(max_length=MAX_ITEMS)] | None = None
    metadata: Metadata | None = None


class UpdateConversation(Strict):
    metadata: Metadata


class AddItems(Strict):
    items: Annotated[list[InputItem], Field(min_length=1, max_length=MAX_ITEMS)]


@dataclass
class ConversationEndpoints:
    store: ConversationStore
    resolve: Resolver  # item references -> the stored items (the Responses API's)

    def create(self, raw: bytes) -> dict:
        wire = parse(CreateConversation, raw)
        items = self._kept(wire.items or [], "items")
        return self.store.create(wire.metadata or {}, items, new_owner()).wire()

    def retrieve(self, conversation_id: str) -> dict:
        return self.record(conversation_id).wire()

    def update(self, conversation_id: str, raw: bytes) -> dict:
        record = self.record(conversation_id)
        metadata = parse(UpdateConversation, raw).metadata
        self.store.set_metadata(record.id, metadata)
        return ConversationRecord(record.id, record.created_at, metadata, record.owner).wire()

    def delete(self, conversation_id: str) -> dict:
        self.store.delete(self.record(conversation_id).id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    def list_items(self, conversation_id: str, query: Query) -> dict:
        """A page of items, newest first unless order=asc."""
        record = self.record(conversation_id)
        _check_include(query)
        ascending = query.choice("order", ("desc", "asc")) == "asc"
        after = query.text("after")
        seq = None
        if after is not None:
            seq = self.store.seq(record.id, after)
            if seq is None:
                raise _no_item(after, record.id, "after")
        page = self.store.page(record.id, query.limit(20, 100), ascending, seq)
        return _listed(page.items, page.has_more)

    def add_items(self, conversation_id: str, raw: bytes, query: Query) -> dict:
        record = self.record(conversation_id)
        _check_include(query)
        items = self._kept(parse(AddItems, raw).items, "items")
        self.store.add(record.id, items)
        return _listed(items, False)

    def item(self, conversation_id: str, item_id: str) -> dict:
        found = self.store.item(self.record(conversation_id).id, item_id)
        if found is None:
            raise _no_item(item_id, conversation_id)
        return found

    def delete_item(self, conversation_id: str, item_id: str) -> dict:
        """Returns the conversation, as OpenAI does."""
        record = self.record(conversation_id)
        if not self.store.delete_item(record.id, item_id):
            raise _no_item(item_id, conversation_id)
        return record.wire()

    def record(self, conversation_id: str, param: str | None = None) -> ConversationRecord:
        """The caller's conversation; a 404 where there is none (or it is another key's)."""
        record = self.store.get(conversation_id)
        if record is None or not visible(record.owner):
            raise not_found(
                f"Conversation with id '{conversation_id}' not found.",
                param,
                code="conversation_not_found",
            )
        return record

    def _kept(self, items: list, param: str) -> list[dict]:
        """Items as the conversation keeps them: references resolved, ids given."""
        for i, item in enumerate(items):
            if isinstance(item, CompactionTrigger | OtherItem):
                raise bad_request(
                    f"Items of type '{item.type}' cannot be added to a conversation.",
                    f"{param}[{i}].type",
                )
        stored = self.resolve(items, param)
        return kept(substituted(items, stored), stored)


def _check_include(query: Query) -> None:
    """`include` names extra output data; items are listed as kept, which holds all this
    server makes, so only a name OpenAI does not define is refused."""
    for name in query.all("include"):  # include=a&include=b, or include[]=a
        if name not in INCLUDABLE:
            raise bad_request(f"include may not name '{name}'.", "include")


def _listed(items: list[dict], has_more: bool) -> dict:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def _no_item(item_id: str, conversation_id: str, param: str | None = None):
    return not_found(
        f"Item with id '{item_id}' not found in conversation '{conversation_id}'.",
        param,
        code="item_not_found",
    )
