"""The batch runner on a real store, without a model: a batch whose completion window has
passed ends `expired`, its lines never run and each in the error file as OpenAI writes
`batch_expired`; a line its endpoint answers is written once, in the output file; a line
whose run did not end (the server too busy) stays pending and runs again."""

from __future__ import annotations

import json
import time

from mlxserve.api.batches.openai import output_files
from mlxserve.api.batches.runner import BatchRunner
from mlxserve.api.openai.errors import error_reply
from mlxserve.batches.store import EXPIRED, BatchStore, NewLine
from mlxserve.keys.gate import KeyGate
from mlxserve.protocol.errors import ErrorKind, ServiceError

CHAT = "/v1/chat/completions"


def run_until(store: BatchStore, batch_id: str, endpoint, status: str) -> None:
    keys = KeyGate(store.path.with_name("keys.sqlite"), None, create=False)  # no keys
    runner = BatchRunner(
        store,
        {CHAT: endpoint},
        lambda path: error_reply,
        {"openai": output_files},
        2,
        keys,
        lambda at: None,
    )
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while store.status(batch_id) != status:
            assert time.monotonic() < deadline, store.batch(batch_id)
            time.sleep(0.02)
    finally:
        runner.stop()


def errors_of(store: BatchStore, batch_id: str) -> list[dict]:
    batch = store.batch(batch_id)
    assert batch is not None and batch.error_file_id is not None
    content = store.content(batch.error_file_id) or b""
    return [json.loads(line) for line in content.splitlines()]


def test_an_expired_batch_reports_its_lines_not_run(tmp_path):
    store = BatchStore(tmp_path / "b.sqlite")
    lines = [NewLine("a", body=b"{}"), NewLine("b", body=b"{}")]
    batch = store.create_batch("openai", CHAT, lines, 0, "24h")  # its window already over

    def endpoint(body, responder):
        raise AssertionError("an expired batch's lines never run")

    run_until(store, batch.id, endpoint, "expired")
    ended = store.batch(batch.id)
    assert ended is not None and ended.status == EXPIRED and "expired_at" in ended.stamps
    assert ended.output_file_id is None and ended.counts.expired == 2
    assert [(e["custom_id"], e["error"]["code"]) for e in errors_of(store, batch.id)] == [
        ("a", "batch_expired"),
        ("b", "batch_expired"),
    ]
    store.close()


def test_a_line_the_server_was_too_busy_for_runs_again(tmp_path):
    store = BatchStore(tmp_path / "b.sqlite")
    batch = store.create_batch("openai", CHAT, [NewLine("a", body=b'{"n": 1}')], 3600, "24h")
    calls: list[bytes] = []

    def endpoint(body, responder):
        calls.append(body)
        if len(calls) == 1:
            raise ServiceError(ErrorKind.OVERLOADED, "busy", retry_after=1)
        return {"ok": True}

    run_until(store, batch.id, endpoint, "completed")
    assert calls == [b'{"n": 1}', b'{"n": 1}']
    done = store.batch(batch.id)
    assert done is not None and done.counts.succeeded == 1 and done.error_file_id is None
    assert done.output_file_id is not None
    (entry,) = [json.loads(x) for x in (store.content(done.output_file_id) or b"").splitlines()]
    assert entry["response"] == {
        "status_code": 200,
        "request_id": entry["id"],
        "body": {"ok": True},
    }
    store.close()
