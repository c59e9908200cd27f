"""Keys and their usage in SQLite: what `mlxserve keys` writes and every server sharing
the file reads. Only a hash of each secret is kept. Usage is one row per key, model and
UTC day, added to in a transaction committed before the request's reply goes out.

Several processes open the same file (the CLI beside running servers, several servers);
SQLite's own locking keeps them consistent, and `PRAGMA data_version` tells a server that
another process changed something."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from mlxserve.keys.records import KeyRecord, digest, new_secret
from mlxserve.models.demo import cache_root
from mlxserve.telemetry.record import Metered

SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    models TEXT,
    rpm INTEGER,
    tpm INTEGER,
    tokens_per_day INTEGER,
    max_concurrent INTEGER,
    admin INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE TABLE IF NOT EXISTS usage (
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    audio_seconds REAL NOT NULL DEFAULT 0,
    images INTEGER NOT NULL DEFAULT 0,
    embedding_inputs INTEGER NOT NULL DEFAULT 0,
    mcp_calls INTEGER NOT NULL DEFAULT 0,
    mcp_seconds REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (key, day, model)
);
"""
KEY_COLUMNS = (
    "name, hint, models, rpm, tpm, tokens_per_day, max_concurrent, admin, expires_at, "
    "created_at, revoked_at"
)
UNITS = tuple(f.name for f in fields(Metered))
HINT_CHARS = 9  # "mlxs-" and four characters of the secret
STORE_NAME = "keys.sqlite"


def keys_path(given: Path | None) -> Path:
    """--keys-db, else `keys.sqlite` in the cache folder."""
    return given if given is not None else cache_root() / STORE_NAME


class KeyExists(Exception):
    """A usable key already has that name."""


@dataclass(frozen=True)
class UsageRow:
    key: str
    model: str
    day: str  # YYYY-MM-DD, UTC
    metered: Metered


def day_of(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d")


class KeyStore:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Its owner's only (SQLite gives its -wal and -shm files the same mode).
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout=10000")  # the CLI or another server writing
        self._db.execute("PRAGMA journal_mode=WAL")
        # Committed in the WAL before the reply reports it: a kill -9 or a crash of the
        # server loses nothing. NORMAL, not FULL: no fsync on every request's usage
        # (FULL cost 12 ms a request on this machine's disk, bench/keys.py); a power cut
        # may lose the last moments' usage, never the store.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._add_new_units()
        self._mutex = threading.Lock()

    def _add_new_units(self) -> None:
        """A store written before a unit of usage existed gets its column (zero for the
        days already counted)."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(usage)")}
        for unit in fields(Metered):
            if unit.name not in present:
                kind = "REAL" if unit.type in (float, "float") else "INTEGER"
                self._db.execute(
                    f"ALTER TABLE usage ADD COLUMN {unit.name} {kind} NOT NULL DEFAULT 0"
                )

    def close(self) -> None:
        with self._mutex:
            self._db.close()

    def version(self) -> int:
        """Changes when another connection commits (a key created or revoked elsewhere)."""
        with self._mutex:
            return self._db.execute("PRAGMA data_version").fetchone()[0]

    # Keys ---------------------------------------------------------------------------

    def create(self, record: KeyRecord) -> str:
        """Store a new key under `record`'s name; its secret (shown once, never kept).
        A revoked or expired key's name may be taken again; a usable one's may not."""
        secret = new_secret()
        now = int(time.time())
        with self._write() as db:
            old = db.execute(
                "SELECT revoked_at, expires_at FROM keys WHERE name=?", (record.name,)
            ).fetchone()
            if old is not None and old[0] is None and (old[1] is None or old[1] > now):
                raise KeyExists(f"a key named {record.name!r} exists (revoke it first)")
            db.execute("DELETE FROM keys WHERE name=?", (record.name,))
            db.execute(
                f"INSERT INTO keys ({KEY_COLUMNS}, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    record.name,
                    secret[:HINT_CHARS],
                    json.dumps(list(record.models)) if record.models is not None else None,
                    record.rpm,
                    record.tpm,
                    record.tokens_per_day,
                    record.max_concurrent,
                    int(record.admin),
                    record.expires_at,
                    now,
                    None,
                    digest(secret),
                ),
            )
        return secret

    def revoke(self, name: str) -> bool:
        """Whether a usable key of that name was revoked."""
        with self._write() as db:
            done = db.execute(
                "UPDATE keys SET revoked_at=? WHERE name=? AND revoked_at IS NULL",
                (int(time.time()), name),
            )
            return done.rowcount > 0

    def all_keys(self) -> list[KeyRecord]:
        with self._mutex:
            rows = self._db.execute(f"SELECT {KEY_COLUMNS} FROM keys ORDER BY name").fetchall()
        return [_key(row) for row in rows]

    def by_hash(self) -> dict[str, KeyRecord]:
        """Every key (revoked ones too: they are refused by name) by its secret's hash."""
        with self._mutex:
            rows = self._db.execute(f"SELECT hash, {KEY_COLUMNS} FROM keys").fetchall()
        return {row[0]: _key(row[1:]) for row in rows}

    # Usage --------------------------------------------------------------------------

    def charge(self, key: str, model: str, cost: Metered, at: float) -> None:
        """Add `cost` to the key's row for `model` on `at`'s day, durably."""
        values = [getattr(cost, unit) for unit in UNITS]
        added = ", ".join(f"{unit}={unit}+excluded.{unit}" for unit in UNITS)
        with self._write() as db:
            db.execute(
                f"INSERT INTO usage (key, model, day, {', '.join(UNITS)}) "
                f"VALUES (?,?,?,{','.join('?' * len(UNITS))}) "
                f"ON CONFLICT (key, day, model) DO UPDATE SET {added}",
                (key, model, day_of(at), *values),
            )

    def tokens_on(self, key: str, day: str) -> int:
        """The key's tokens (prompt and completion) on `day`, every model and server."""
        with self._mutex:
            row = self._db.execute(
                "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage "
                "WHERE key=? AND day=?",
                (key, day),
            ).fetchone()
        return row[0]

    def usage(
        self, key: str | None = None, start: str | None = None, end: str | None = None
    ) -> list[UsageRow]:
        """Rows by day, key and model; `key` None: every key; `start`..`end`: inclusive
        days."""
        where, args = ["1=1"], []
        for clause, value in (("key=?", key), ("day>=?", start), ("day<=?", end)):
            if value is not None:
                where.append(clause)
                args.append(value)
        with self._mutex:
            rows = self._db.execute(
                f"SELECT key, model, day, {', '.join(UNITS)} FROM usage "
                f"WHERE {' AND '.join(where)} ORDER BY day, key, model",
                args,
            ).fetchall()
        return [UsageRow(row[0], row[1], row[2], Metered(*row[3:])) for row in rows]

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")


def _key(row: tuple) -> KeyRecord:
    name, hint, models, rpm, tpm, per_day, concurrent, admin, expires, created, revoked = row
    return KeyRecord(
        name,
        hint,
        tuple(json.loads(models)) if models is not None else None,
        rpm,
        tpm,
        per_day,
        concurrent,
        bool(admin),
        expires,
        created,
        revoked,
    )
