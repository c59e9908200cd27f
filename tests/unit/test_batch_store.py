"""The batch store on a real SQLite file: a line's result is written once; pending lines
come oldest batch first, skipping those running; an ended batch's files and status land
together; a second process cannot open a store that is held; everything is read back after
reopening."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlxserve.batches.store import (
    CANCELED,
    CANCELLING,
    COMPLETED,
    ERRORED,
    IN_PROGRESS,
    SUCCEEDED,
    BatchStore,
    NewLine,
    StoreBusy,
    Usage,
)

DAY = 86400


def lines(count: int, prefix: str = "c") -> list[NewLine]:
    return [NewLine(f"{prefix}{i}", body=b"{}") for i in range(count)]


@pytest.fixture
def store(tmp_path):
    opened = BatchStore(tmp_path / "b.sqlite")
    yield opened
    opened.close()


def test_a_result_is_written_once(store):
    batch = store.create_batch("openai", "/v1/chat/completions", lines(2), DAY, "24h")
    (first, _) = store.pending(set(), 10)
    assert store.record(first.key, SUCCEEDED, 200, {"n": 1}, Usage(3, 1, 2, 0))
    assert not store.record(first.key, SUCCEEDED, 200, {"n": 2}, Usage(3, 1, 2, 0))
    again = store.batch(batch.id)
    assert again is not None
    assert (again.counts.succeeded, again.counts.pending) == (1, 1)
    assert again.usage == Usage(3, 1, 2, 0)
    assert next(store.lines(batch.id)).result == {"n": 1}


def test_pending_lines_oldest_batch_first_skipping_running(store):
    older = store.create_batch("openai", "/v1/embeddings", lines(3), DAY, "24h")
    newer = store.create_batch("anthropic", "/v1/messages", lines(2), DAY, "24h")
    got = store.pending({(older.id, 1)}, 3)
    assert [(line.batch_id, line.line) for line in got] == [
        (older.id, 2),
        (older.id, 3),
        (newer.id, 1),
    ]
    assert got[0].url == "/v1/embeddings" and got[2].url == "/v1/messages"
    store.set_status(older.id, CANCELLING, when=(IN_PROGRESS,))
    assert {line.batch_id for line in store.pending(set(), 10)} == {newer.id}


def test_lines_refused_at_validation_are_errored_and_never_pending(store):
    refused = NewLine("bad", result={"code": "invalid_method", "message": "m"})
    batch = store.create_batch("openai", "/v1/completions", [refused, *lines(1)], DAY, "24h")
    assert [line.custom_id for line in store.pending(set(), 10)] == ["c0"]
    record = store.batch(batch.id)
    assert record is not None and record.counts.errored == 1
    assert [line.outcome for line in store.lines(batch.id)] == [ERRORED, None]


def test_ending_a_batch_writes_its_files_and_status_together(store):
    batch = store.create_batch("openai", "/v1/chat/completions", lines(600), DAY, "24h")
    assert len(list(store.lines(batch.id))) == 600  # read in pages
    store.end_pending(batch.id, CANCELED)
    store.finish(batch.id, COMPLETED, [("error", "e.jsonl", b"x\n")])
    ended = store.batch(batch.id)
    assert ended is not None and ended.status == COMPLETED
    assert ended.output_file_id is None and ended.error_file_id is not None
    assert store.content(ended.error_file_id) == b"x\n"
    assert ended.counts.canceled == 600 and "completed_at" in ended.stamps
    assert not store.set_status(batch.id, CANCELLING)  # ended: no more changes


def test_a_held_store_cannot_be_opened_by_another_process(store):
    opener = f"from mlxserve.batches.store import BatchStore; BatchStore(__import__('pathlib').Path({str(store.path)!r}))"
    result = subprocess.run([sys.executable, "-c", opener], capture_output=True, text=True)
    assert result.returncode != 0 and StoreBusy.__name__ in result.stderr


def test_reopened_store_reads_back(tmp_path):
    path = tmp_path / "b.sqlite"
    first = BatchStore(path)
    uploaded = first.add_file("batch", "in.jsonl", b"{}\n")
    batch = first.create_batch(
        "openai", "/v1/chat/completions", lines(2), DAY, "24h", metadata={"k": "v"}
    )
    first.close()
    second = BatchStore(path)
    try:
        assert second.file(uploaded.id) == uploaded
        again = second.batch(batch.id)
        assert again is not None and again.metadata == {"k": "v"}
        assert again.counts.pending == 2 and again.status == IN_PROGRESS
    finally:
        second.close()
