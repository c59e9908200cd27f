"""Names made through Ollama's copy and create: a new name for a model, with its own
system prompt, parameters, opening messages or adapter. Kept in SQLite in the cache
folder (written before the reply says so), so they outlive the server."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mlxserve.hub.commands import local_models, remove_cached_repo
from mlxserve.models.demo import cache_root
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request

if TYPE_CHECKING:
    from mlxserve.api.ollama.requests import CreateRequest
    from mlxserve.models.spec import ModelSpec
    from mlxserve.service.chat import ChatService

STORE_NAME = "ollama-names.sqlite"


def names_path(given: Path | None) -> Path:
    """--model-names-db, else `ollama-names.sqlite` in the cache folder."""
    return given if given is not None else cache_root() / STORE_NAME


SCHEMA = """
CREATE TABLE IF NOT EXISTS names (
    name TEXT PRIMARY KEY,
    base TEXT NOT NULL,
    system TEXT,
    parameters TEXT NOT NULL DEFAULT '{}',
    messages TEXT NOT NULL DEFAULT '[]',
    adapter TEXT,
    created_at REAL NOT NULL
)
"""


@dataclass(frozen=True)
class MadeName:
    """A name for `base` (a name the core resolves) and what it adds to each request."""

    name: str
    base: str
    system: str | None = None
    parameters: dict | None = None  # Ollama options, under the request's own
    messages: tuple[dict, ...] = ()  # opening turns before the request's
    adapter: str | None = None  # a served adapter, by name or folder

    def apply(self, request: neutral.ChatRequest) -> neutral.ChatRequest:
        """The request as this name serves it: its system prompt unless the request has
        one, its opening turns first, its adapter."""
        opening = tuple(
            neutral.Message(m["role"], m["content"], f"create.messages[{i}]")
            for i, m in enumerate(self.messages)
        )
        messages = request.messages
        if self.system and not any(m.role == "system" for m in messages):
            opening = (neutral.Message("system", self.system, "create.system"), *opening)
        return replace(request, messages=(*opening, *messages), adapter=self.adapter)


class ModelNames:
    """The store, opened when a name is first made (a server that makes none writes no
    file, and starts where the cache folder cannot be written)."""

    def __init__(self, path: Path):
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._mutex = threading.Lock()

    def _open(self, create: bool) -> sqlite3.Connection | None:
        """The connection (under the mutex); None while there is no store to read."""
        if self._db is None and (create or self.path.exists()):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA busy_timeout=10000")  # another server on the same file
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # written means on disk
            db.executescript(SCHEMA)
            self._db = db
        return self._db

    def _rows(self, where: str = "", args: tuple = ()) -> list[tuple]:
        query = "SELECT name, base, system, parameters, messages, adapter FROM names"
        with self._mutex:
            db = self._open(create=False)
            if db is None:
                return []
            return db.execute(f"{query} {where} ORDER BY created_at DESC", args).fetchall()

    def get(self, name: str) -> MadeName | None:
        rows = self._rows("WHERE name = ?", (name,))
        return _made(rows[0]) if rows else None

    def all(self) -> dict[str, MadeName]:
        return {row[0]: _made(row) for row in self._rows()}

    def copy(self, source: str, destination: str) -> None:
        """`destination` names what `source` names (a made name's additions with it)."""
        made = self.get(source) or MadeName(destination, source)
        self._put(replace(made, name=destination))

    def create(self, name: str, base: str, wire: CreateRequest, service: ChatService) -> None:
        if wire.template:
            raise bad_request(
                "A template of its own is not served: mlxserve renders every model with its "
                "own chat template (set another with --chat-template).",
                param="template",
            )
        adapter = None
        for given in (wire.adapters or {}).values():
            adapter = _served_adapter(given, service)
        made = self.get(base)
        parameters = {**((made.parameters or {}) if made else {}), **(wire.parameters or {})}
        messages = tuple({"role": m.role, "content": m.content} for m in wire.messages or []) or (
            made.messages if made else ()
        )
        self._put(
            MadeName(
                name,
                made.base if made else base,
                wire.system if wire.system is not None else (made.system if made else None),
                parameters,
                messages,
                adapter or (made.adapter if made else None),
            )
        )

    def remove(self, name: str) -> None:
        with self._mutex:
            db = self._open(create=False)
            if db is not None:
                db.execute("DELETE FROM names WHERE name = ?", (name,))

    def remove_local(self, name: str, spec: ModelSpec, service: ChatService) -> bool:
        """Delete a model `mlxserve ls` lists (a hub snapshot or a converted folder),
        unloaded first: a 409 while it is busy. Whether there was one."""
        for model in local_models():
            if model.name != name:
                continue
            if service.models.is_resident(spec) and not service.models.expire(spec):
                raise ServiceError(
                    ErrorKind.CONFLICT,
                    f"model '{name}' is in use; delete it once its requests end.",
                    param="model",
                )
            if model.converted:
                shutil.rmtree(model.path)
            else:
                remove_cached_repo(name)
            return True
        return False

    def _put(self, made: MadeName) -> None:
        with self._mutex:
            db = self._open(create=True)
            assert db is not None
            db.execute(
                "INSERT OR REPLACE INTO names VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    made.name,
                    made.base,
                    made.system,
                    json.dumps(made.parameters or {}),
                    json.dumps(list(made.messages)),
                    made.adapter,
                    time.time(),
                ),
            )


def _made(row: tuple) -> MadeName:
    name, base, system, parameters, messages, adapter = row
    return MadeName(
        name, base, system, json.loads(parameters), tuple(json.loads(messages)), adapter
    )


def _served_adapter(given: str, service: ChatService) -> str:
    """An adapter of create's `adapters`: a served adapter's name or folder."""
    found = service.models.find_adapter(given)
    if found is None:
        raise bad_request(
            f"No adapter '{given}' is served: load it first (--lora NAME=PATH, or POST "
            "/v1/adapters/load), then name it or its folder here.",
            param="adapters",
        )
    return found.name
