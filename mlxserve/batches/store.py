"""Uploaded files, batch jobs and each of their lines, in SQLite.

Everything a client is told is written first: a file, a batch and its lines are committed
before the reply names them, and a line's result is committed before it counts. A line
without a result is pending; after a restart (or a kill -9) the pending lines of running
batches run again, and a result is written only where none is (`record`), so a line is
answered exactly once.

One server owns a store at a time (an exclusive lock on a file beside it): a second
server given the same folder serves no batches rather than running the first's.
"""

from __future__ import annotations

import fcntl
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content BLOB NOT NULL,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    dialect TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT,
    completion_window TEXT NOT NULL,
    metadata TEXT,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    stamps TEXT NOT NULL DEFAULT '{}',
    output_file_id TEXT,
    error_file_id TEXT,
    errors TEXT,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    custom_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    body BLOB,
    outcome TEXT,
    status_code INTEGER,
    result TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX IF NOT EXISTS pending_lines ON lines (batch_id, line) WHERE outcome IS NULL;
"""

# A batch's statuses (OpenAI's; Anthropic's processing_status is read from them).
IN_PROGRESS = "in_progress"
CANCELLING = "cancelling"
FINALIZING = "finalizing"
COMPLETED = "completed"
CANCELLED = "cancelled"
EXPIRED = "expired"
FAILED = "failed"
RUNNING = (IN_PROGRESS, CANCELLING, FINALIZING)  # not ended: the runner has work

# A line's outcome (None: pending).
SUCCEEDED = "succeeded"
ERRORED = "errored"
CANCELED = "canceled"
LINE_EXPIRED = "expired"


class StoreBusy(Exception):
    """Another process holds the store."""


class Everyone:
    """Whose files and batches a query lists when it is not one key's (an admin's)."""


EVERYONE = Everyone()
Owner = str | None | Everyone  # an API key's name, None (made without keys), or anyone


@dataclass(frozen=True)
class FileRecord:
    id: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    owner: str | None = None  # the API key's name that uploaded it (None: no keys)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class NewLine:
    """A line as validation left it: a request to run (`body`), or already errored
    (`result`, an error the runner need not meet)."""

    custom_id: str
    body: bytes | None = None
    result: dict | None = None


@dataclass(frozen=True)
class Counts:
    """A batch's lines by outcome."""

    total: int = 0
    pending: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


@dataclass(frozen=True)
class BatchRecord:
    id: str
    dialect: str  # "openai" or "anthropic"
    endpoint: str
    input_file_id: str | None
    completion_window: str
    metadata: dict | None
    status: str
    created_at: int
    expires_at: int
    stamps: dict[str, int]  # "in_progress_at", "cancelling_at", ... -> unix seconds
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict] | None
    owner: str | None  # the API key's name that created it (None: no keys)
    counts: Counts = field(default_factory=Counts)
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class LineRecord:
    batch_id: str
    line: int
    custom_id: str
    request_id: str
    url: str  # the batch's endpoint
    body: bytes | None
    outcome: str | None
    status_code: int | None
    result: dict | None
    owner: str | None  # its batch's

    @property
    def key(self) -> tuple[str, int]:
        return self.batch_id, self.line


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class BatchStore:
    def __init__(self, path: Path):
        """Open (or create) the store at `path`; StoreBusy if another process has it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_file = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            self._lock_file.close()
            raise StoreBusy(f"another mlxserve process holds {path}") from e
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # committed means on disk
        self._db.executescript(SCHEMA)
        for table in ("files", "batches"):  # a store made before keys had owners
            _add_column(self._db, table, "owner TEXT")
        self._mutex = threading.Lock()

    def close(self) -> None:
        with self._mutex:
            self._db.close()
            self._lock_file.close()

    # Files --------------------------------------------------------------------------

    def add_file(
        self, purpose: str, filename: str, content: bytes, owner: str | None = None
    ) -> FileRecord:
        now = int(time.time())
        record = FileRecord(new_id("file-"), purpose, filename, len(content), now, owner)
        with self._write() as db:
            _insert_file(db, record, content)
        return record

    def file(self, file_id: str) -> FileRecord | None:
        row = self._one(f"SELECT {FILE_COLUMNS} FROM files WHERE id=?", file_id)
        return FileRecord(*row) if row else None

    def content(self, file_id: str) -> bytes | None:
        row = self._one("SELECT content FROM files WHERE id=?", file_id)
        return bytes(row[0]) if row else None

    def files(
        self,
        purpose: str | None,
        limit: int,
        after: str | None,
        ascending: bool,
        owner: Owner = EVERYONE,
    ) -> list[FileRecord]:
        sql = f"SELECT {FILE_COLUMNS} FROM files"
        where, args = _page("files", after, ascending)
        if purpose is not None:
            where.append("purpose=?")
            args.append(purpose)
        _owned(where, args, owner)
        order = "ASC" if ascending else "DESC"
        rows = self._all(f"{sql}{_where(where)} ORDER BY rowid {order} LIMIT ?", *args, limit)
        return [FileRecord(*row) for row in rows]

    def delete_file(self, file_id: str) -> bool:
        with self._write() as db:
            return db.execute("DELETE FROM files WHERE id=?", (file_id,)).rowcount > 0

    # Batches ------------------------------------------------------------------------

    def create_batch(
        self,
        dialect: str,
        endpoint: str,
        lines: list[NewLine],
        window_seconds: int,
        completion_window: str,
        input_file_id: str | None = None,
        metadata: dict | None = None,
        errors: list[dict] | None = None,
        prefix: str = "batch_",
        owner: str | None = None,
    ) -> BatchRecord:
        """A new batch, running (or, with `errors`, failed at validation)."""
        now = int(time.time())
        batch_id = new_id(prefix)
        status, stamp = (FAILED, "failed_at") if errors else (IN_PROGRESS, "in_progress_at")
        with self._write() as db:
            db.execute(
                "INSERT INTO batches (id, dialect, endpoint, input_file_id, completion_window,"
                " metadata, status, created_at, expires_at, stamps, errors, owner)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    batch_id,
                    dialect,
                    endpoint,
                    input_file_id,
                    completion_window,
                    _json(metadata),
                    status,
                    now,
                    now + window_seconds,
                    json.dumps({stamp: now}),
                    _json(errors),
                    owner,
                ),
            )
            if not errors:
                db.executemany(
                    "INSERT INTO lines (batch_id, line, custom_id, request_id, body, outcome,"
                    " result) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            batch_id,
                            number,
                            line.custom_id,
                            new_id("batch_req_"),
                            line.body,
                            ERRORED if line.result is not None else None,
                            _json(line.result),
                        )
                        for number, line in enumerate(lines, 1)
                    ],
                )
        found = self.batch(batch_id)
        assert found is not None
        return found

    def batch(self, batch_id: str) -> BatchRecord | None:
        row = self._one(f"SELECT {BATCH_COLUMNS} FROM batches WHERE id=?", batch_id)
        return self._batch(row) if row else None

    def status(self, batch_id: str) -> str | None:
        row = self._one("SELECT status FROM batches WHERE id=?", batch_id)
        return row[0] if row else None

    def batches(
        self,
        dialect: str | None,
        limit: int,
        after: str | None = None,
        before: str | None = None,
        owner: Owner = EVERYONE,
    ) -> list[BatchRecord]:
        """A dialect's batches (None: every one), the newest first, after (older than) or
        before (newer than) a batch; `owner`'s only, or everyone's."""
        where, args = ([], []) if dialect is None else (["dialect=?"], [dialect])
        _owned(where, args, owner)
        if after is not None:
            where.append("rowid < (SELECT rowid FROM batches WHERE id=?)")
            args.append(after)
        if before is not None:
            where.append("rowid > (SELECT rowid FROM batches WHERE id=?)")
            args.append(before)
        order = "ASC" if before is not None else "DESC"
        rows = self._all(
            f"SELECT {BATCH_COLUMNS} FROM batches{_where(where)} ORDER BY rowid {order} LIMIT ?",
            *args,
            limit,
        )
        records = [self._batch(row) for row in rows]
        return records[::-1] if before is not None else records

    def running(self) -> list[BatchRecord]:
        """Batches not ended, oldest first."""
        marks = ", ".join("?" * len(RUNNING))
        rows = self._all(
            f"SELECT {BATCH_COLUMNS} FROM batches WHERE status IN ({marks}) ORDER BY rowid",
            *RUNNING,
        )
        return [self._batch(row) for row in rows]

    def set_status(self, batch_id: str, status: str, when: tuple[str, ...] = ()) -> bool:
        """Move a running batch to `status` (stamping `{status}_at`); False if it had
        ended, or was not in one of `when` (if given)."""
        allowed = when or RUNNING
        marks = ", ".join("?" * len(allowed))
        now = int(time.time())
        with self._write() as db:
            updated = db.execute(
                f"UPDATE batches SET status=?, stamps=json_set(stamps, ?, ?)"
                f" WHERE id=? AND status IN ({marks})",
                (status, f"$.{status}_at", now, batch_id, *allowed),
            )
            return updated.rowcount > 0

    def delete_batch(self, batch_id: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM lines WHERE batch_id=?", (batch_id,))
            db.execute("DELETE FROM batches WHERE id=?", (batch_id,))

    # Lines --------------------------------------------------------------------------

    def pending(self, skip: set[tuple[str, int]], limit: int) -> list[LineRecord]:
        """Up to `limit` pending lines of batches in progress, oldest batch first, but
        those in `skip` (running, or waiting to retry)."""
        found: list[LineRecord] = []
        live = self._all(
            "SELECT id FROM batches WHERE status=? AND expires_at>? ORDER BY rowid",
            IN_PROGRESS,
            time.time(),
        )
        for (batch_id,) in live:
            skipped = [line for skipped_id, line in skip if skipped_id == batch_id]
            rows = self._all(
                f"SELECT {LINE_COLUMNS} FROM lines JOIN batches ON batches.id=lines.batch_id"
                " WHERE batch_id=? AND outcome IS NULL"
                f" AND line NOT IN ({', '.join('?' * len(skipped))})"
                " ORDER BY line LIMIT ?",
                batch_id,
                *skipped,
                limit - len(found),
            )
            found += [_line(row) for row in rows]
            if len(found) >= limit:
                break
        return found

    def lines(self, batch_id: str) -> Iterator[LineRecord]:
        """Every line of a batch, in order (read in pages: a batch may be large)."""
        last = 0
        while True:
            rows = self._all(
                f"SELECT {LINE_COLUMNS} FROM lines JOIN batches ON batches.id=lines.batch_id"
                " WHERE batch_id=? AND line>? ORDER BY line LIMIT 500",
                batch_id,
                last,
            )
            if not rows:
                return
            for row in rows:
                yield _line(row)
            last = rows[-1][1]

    def record(
        self, key: tuple[str, int], outcome: str, status_code: int, result: dict, usage: Usage
    ) -> bool:
        """A pending line's result; False if it had one (it is never written twice)."""
        with self._write() as db:
            updated = db.execute(
                "UPDATE lines SET outcome=?, status_code=?, result=?, prompt_tokens=?,"
                " cached_tokens=?, completion_tokens=?, reasoning_tokens=?"
                " WHERE batch_id=? AND line=? AND outcome IS NULL",
                (
                    outcome,
                    status_code,
                    json.dumps(result, ensure_ascii=False),
                    usage.prompt_tokens,
                    usage.cached_tokens,
                    usage.completion_tokens,
                    usage.reasoning_tokens,
                    *key,
                ),
            )
            return updated.rowcount > 0

    def end_pending(self, batch_id: str, outcome: str) -> None:
        """Every line of the batch still pending ends with `outcome` (canceled, expired)."""
        with self._write() as db:
            db.execute(
                "UPDATE lines SET outcome=? WHERE batch_id=? AND outcome IS NULL",
                (outcome, batch_id),
            )

    def finish(
        self,
        batch_id: str,
        status: str,
        outputs: list[tuple[str, str, bytes]],
    ) -> None:
        """End a batch with `status`, writing its result files (purpose, name, content)
        in the same transaction: the output file's id and the status appear together."""
        now = int(time.time())
        ids: dict[str, str | None] = {"output": None, "error": None}
        with self._write() as db:
            owner = db.execute("SELECT owner FROM batches WHERE id=?", (batch_id,)).fetchone()
            for kind, name, content in outputs:
                file_id = new_id("file-")
                record = FileRecord(file_id, "batch_output", name, len(content), now, owner[0])
                _insert_file(db, record, content)
                ids[kind] = record.id
            db.execute(
                "UPDATE batches SET status=?, stamps=json_set(stamps, ?, ?),"
                " output_file_id=?, error_file_id=? WHERE id=?",
                (status, f"$.{status}_at", now, ids["output"], ids["error"], batch_id),
            )

    # Plumbing -----------------------------------------------------------------------

    def _batch(self, row: tuple) -> BatchRecord:
        batch_id = row[0]
        counts: dict[str | None, int] = dict(
            self._all(
                "SELECT outcome, COUNT(*) FROM lines WHERE batch_id=? GROUP BY outcome", batch_id
            )
        )
        usage = self._one(
            "SELECT COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(cached_tokens), 0),"
            " COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(reasoning_tokens), 0)"
            " FROM lines WHERE batch_id=?",
            batch_id,
        )
        return BatchRecord(
            id=row[0],
            dialect=row[1],
            endpoint=row[2],
            input_file_id=row[3],
            completion_window=row[4],
            metadata=json.loads(row[5]) if row[5] else None,
            status=row[6],
            created_at=row[7],
            expires_at=row[8],
            stamps=json.loads(row[9]),
            output_file_id=row[10],
            error_file_id=row[11],
            errors=json.loads(row[12]) if row[12] else None,
            owner=row[13],
            counts=Counts(
                total=sum(counts.values()),
                pending=counts.get(None, 0),
                succeeded=counts.get(SUCCEEDED, 0),
                errored=counts.get(ERRORED, 0),
                canceled=counts.get(CANCELED, 0),
                expired=counts.get(LINE_EXPIRED, 0),
            ),
            usage=Usage(*usage) if usage else Usage(),
        )

    def _write(self) -> Transaction:
        return Transaction(self._db, self._mutex)

    def _one(self, sql: str, *args: Any) -> tuple | None:
        with self._mutex:
            return self._db.execute(sql, args).fetchone()

    def _all(self, sql: str, *args: Any) -> list[tuple]:
        with self._mutex:
            return self._db.execute(sql, args).fetchall()


FILE_COLUMNS = "id, purpose, filename, bytes, created_at, owner"
BATCH_COLUMNS = (
    "id, dialect, endpoint, input_file_id, completion_window, metadata, status, created_at,"
    " expires_at, stamps, output_file_id, error_file_id, errors, owner"
)
LINE_COLUMNS = (
    "batch_id, line, custom_id, request_id, batches.endpoint, body, outcome, status_code, result,"
    " batches.owner"
)


class Transaction:
    """One write, committed as a whole (or not at all), under the store's mutex."""

    def __init__(self, db: sqlite3.Connection, mutex: threading.Lock):
        self._db = db
        self._mutex = mutex

    def __enter__(self) -> sqlite3.Connection:
        self._mutex.acquire()
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, kind, value, traceback) -> None:
        try:
            self._db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self._mutex.release()


def _line(row: tuple) -> LineRecord:
    return LineRecord(
        batch_id=row[0],
        line=row[1],
        custom_id=row[2],
        request_id=row[3],
        url=row[4],
        body=bytes(row[5]) if row[5] is not None else None,
        outcome=row[6],
        status_code=row[7],
        result=json.loads(row[8]) if row[8] else None,
        owner=row[9],
    )


def _insert_file(db: sqlite3.Connection, record: FileRecord, content: bytes) -> None:
    db.execute(
        f"INSERT INTO files ({FILE_COLUMNS}, content) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (*astuple(record), content),
    )


def _add_column(db: sqlite3.Connection, table: str, column: str) -> None:
    names = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if column.split()[0] not in names:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")


def _owned(where: list[str], args: list[Any], owner: Owner) -> None:
    """Narrow a query to one owner's rows (None: those made where there were no keys)."""
    if isinstance(owner, Everyone):
        return
    where.append("owner IS ?")
    args.append(owner)


def _page(table: str, after: str | None, ascending: bool) -> tuple[list[str], list[Any]]:
    if after is None:
        return [], []
    comparison = ">" if ascending else "<"
    return [f"rowid {comparison} (SELECT rowid FROM {table} WHERE id=?)"], [after]


def _where(clauses: list[str]) -> str:
    return f" WHERE {' AND '.join(clauses)}" if clauses else ""


def _json(value: Any) -> str | None:
    return json.dumps(value, ensure_ascii=False) if value is not None else None
