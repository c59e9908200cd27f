"""Conversations (OpenAI's Conversations API) and their items, in SQLite.

A conversation and every item added to it are committed before the reply names them, so
a kill -9 loses nothing a client was told of. The file is the batch store's (one database
of the server's durable state); the connection is opened when a conversation is first
made, so a server that never makes one writes nothing."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlxserve.batches.store import Transaction, new_id

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS conversation_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    id TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS items_in_order ON conversation_items (conversation_id, seq);
CREATE INDEX IF NOT EXISTS items_by_id ON conversation_items (id);
"""


@dataclass(frozen=True)
class ConversationRecord:
    id: str
    created_at: int
    metadata: dict[str, str]
    owner: str | None  # the API key's name that made it (None: no keys)

    def wire(self) -> dict:
        """As the API returns it."""
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class Page:
    items: list[dict]
    has_more: bool


class ConversationStore:
    def __init__(self, path: Path):
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._mutex = threading.Lock()  # one statement or transaction at a time
        self._opening = threading.Lock()

    def create(
        self, metadata: dict[str, str], items: list[dict], owner: str | None
    ) -> ConversationRecord:
        record = ConversationRecord(new_id("conv_"), int(time.time()), metadata, owner)
        with self._write() as db:
            db.execute(
                "INSERT INTO conversations (id, created_at, metadata, owner) VALUES (?, ?, ?, ?)",
                (record.id, record.created_at, json.dumps(metadata), owner),
            )
            _insert(db, record.id, items)
        return record

    def get(self, conversation_id: str) -> ConversationRecord | None:
        if not self._exists():
            return None
        with self._read() as db:
            row = db.execute(
                "SELECT id, created_at, metadata, owner FROM conversations WHERE id=?",
                (conversation_id,),
            ).fetchone()
        return ConversationRecord(row[0], row[1], json.loads(row[2]), row[3]) if row else None

    def set_metadata(self, conversation_id: str, metadata: dict[str, str]) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE conversations SET metadata=? WHERE id=?",
                (json.dumps(metadata), conversation_id),
            )

    def delete(self, conversation_id: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM conversation_items WHERE conversation_id=?", (conversation_id,))
            db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def add(self, conversation_id: str, items: list[dict]) -> None:
        """Append items (each with its id), in order."""
        with self._write() as db:
            _insert(db, conversation_id, items)

    def items(self, conversation_id: str) -> list[dict]:
        """Every item, oldest first."""
        with self._read() as db:
            rows = db.execute(
                "SELECT body FROM conversation_items WHERE conversation_id=? ORDER BY seq",
                (conversation_id,),
            ).fetchall()
        return [json.loads(body) for (body,) in rows]

    def page(
        self, conversation_id: str, limit: int, ascending: bool, after: int | None = None
    ) -> Page:
        """Up to `limit` items in order, those past the item at `after` (its seq)."""
        order, past = ("ASC", ">") if ascending else ("DESC", "<")
        where, args = "conversation_id=?", [conversation_id]
        if after is not None:
            where += f" AND seq {past} {after:d}"
        with self._read() as db:
            rows = db.execute(
                f"SELECT body FROM conversation_items WHERE {where} ORDER BY seq {order} LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        return Page([json.loads(body) for (body,) in rows[:limit]], len(rows) > limit)

    def seq(self, conversation_id: str, item_id: str) -> int | None:
        """An item's place in its conversation (the latest, where an id is there twice)."""
        with self._read() as db:
            row = db.execute(
                "SELECT MAX(seq) FROM conversation_items WHERE conversation_id=? AND id=?",
                (conversation_id, item_id),
            ).fetchone()
        return row[0]

    def item(self, conversation_id: str, item_id: str) -> dict | None:
        seq = self.seq(conversation_id, item_id)
        if seq is None:
            return None
        with self._read() as db:
            (body,) = db.execute(
                "SELECT body FROM conversation_items WHERE seq=?", (seq,)
            ).fetchone()
        return json.loads(body)

    def holders(self, item_id: str) -> list[tuple[dict, str | None]]:
        """An item by its id wherever it is, newest first, with its conversation's owner
        (for an item_reference, which names no conversation)."""
        if not self._exists():
            return []
        with self._read() as db:
            rows = db.execute(
                "SELECT body, owner FROM conversation_items JOIN conversations"
                " ON conversations.id=conversation_id WHERE conversation_items.id=?"
                " ORDER BY seq DESC",
                (item_id,),
            ).fetchall()
        return [(json.loads(body), owner) for body, owner in rows]

    def delete_item(self, conversation_id: str, item_id: str) -> bool:
        with self._write() as db:
            deleted = db.execute(
                "DELETE FROM conversation_items WHERE conversation_id=? AND id=?",
                (conversation_id, item_id),
            )
            return deleted.rowcount > 0

    def _exists(self) -> bool:
        """Whether there is a store to read (a lookup never makes one)."""
        return self._db is not None or self.path.exists()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        db = self._open()
        with self._mutex:
            yield db

    def _write(self) -> Transaction:
        return Transaction(self._open(), self._mutex)

    def _open(self) -> sqlite3.Connection:
        with self._opening:
            if self._db is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                db.execute("PRAGMA busy_timeout=10000")  # the batch runner writes to it too
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")  # committed means on disk
                db.executescript(SCHEMA)
                self._db = db
            return self._db


def _insert(db: sqlite3.Connection, conversation_id: str, items: list[dict]) -> None:
    db.executemany(
        "INSERT INTO conversation_items (conversation_id, id, body) VALUES (?, ?, ?)",
        [(conversation_id, item["id"], json.dumps(item, ensure_ascii=False)) for item in items],
    )
