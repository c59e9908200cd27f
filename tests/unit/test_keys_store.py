"""The key store and gate on a real SQLite file, without a server: a secret is kept only
as its hash; a revoked name may be taken again; usage adds up per key, model and day; a
change made through another connection is seen by the gate at once for a new key and
within its refresh for a revocation; limits refuse with their codes; stores made before
batches had owners, and before MCP calls were counted, open and gain their columns."""

from __future__ import annotations

import sqlite3
import time

import pytest

from mlxserve.batches.store import BatchStore
from mlxserve.keys.gate import REFRESH_SECONDS, KeyGate
from mlxserve.keys.records import KeyRecord, digest
from mlxserve.keys.store import KeyExists, KeyStore, day_of
from mlxserve.protocol.errors import ErrorKind, ServiceError
from mlxserve.telemetry.record import Metered


def test_secrets_are_hashed_and_names_come_back_after_revocation(tmp_path):
    store = KeyStore(tmp_path / "keys.sqlite")
    secret = store.create(KeyRecord("alice", "", ("m",), rpm=5))
    raw = (tmp_path / "keys.sqlite").read_bytes()
    assert secret.encode() not in raw and digest(secret) in store.by_hash()
    assert (tmp_path / "keys.sqlite").stat().st_mode & 0o777 == 0o600
    with pytest.raises(KeyExists):
        store.create(KeyRecord("alice", "", None))
    assert store.revoke("alice") and not store.revoke("alice")
    again = store.create(KeyRecord("alice", "", None))
    assert [k.name for k in store.all_keys()] == ["alice"] and digest(again) in store.by_hash()
    assert digest(secret) not in store.by_hash()
    store.close()


def test_usage_adds_up_per_key_model_and_day(tmp_path):
    store = KeyStore(tmp_path / "keys.sqlite")
    now = time.time()
    store.charge("a", "m1", Metered(requests=1, prompt_tokens=10, completion_tokens=5), now)
    store.charge("a", "m1", Metered(prompt_tokens=3, cached_tokens=2, images=1), now)
    store.charge("a", "m2", Metered(requests=1, audio_seconds=1.5), now)
    store.charge("a", "m1", Metered(requests=1, prompt_tokens=100), now - 86_400)
    store.charge("b", "m1", Metered(requests=1, embedding_inputs=4, prompt_tokens=7), now)
    today = day_of(now)
    assert store.tokens_on("a", today) == 18 and store.tokens_on("b", today) == 7
    rows = store.usage("a", today, today)
    assert [(r.model, r.metered) for r in rows] == [
        ("m1", Metered(1, 13, 2, 5, 0.0, 1, 0)),
        ("m2", Metered(1, 0, 0, 0, 1.5, 0, 0)),
    ]
    assert len(store.usage()) == 4 and len(store.usage(start=today)) == 3
    store.close()


def test_the_gate_sees_another_processs_changes(tmp_path):
    path = tmp_path / "keys.sqlite"
    gate = KeyGate(path, None, create=False)
    assert not gate.required and not path.exists()  # no file: an open server
    writer = KeyStore(path)
    secret = writer.create(KeyRecord("new", "", None))
    with gate.admit(secret) as caller:  # made a moment ago: works at once
        assert caller.name == "new" and not caller.admin
    assert gate.required
    writer.revoke("new")
    time.sleep(REFRESH_SECONDS * 1.5)
    with pytest.raises(ServiceError, match="revoked") as refused, gate.admit(secret):
        pass
    assert refused.value.kind is ErrorKind.AUTHENTICATION
    writer.close()
    gate.close()


def test_limits_refuse_with_their_codes(tmp_path):
    path = tmp_path / "keys.sqlite"
    writer = KeyStore(path)
    rpm = writer.create(KeyRecord("rpm", "", None, rpm=2))
    quota = writer.create(KeyRecord("quota", "", None, tokens_per_day=10))
    one = writer.create(KeyRecord("one", "", None, max_concurrent=1))
    gate = KeyGate(path, "the-api-key", create=True)
    for _ in range(2):
        with gate.admit(rpm):
            pass
    with pytest.raises(ServiceError) as refused, gate.admit(rpm):
        pass
    assert refused.value.code == "rate_limit_exceeded" and 59 <= refused.value.retry_after <= 60
    gate.charge("quota", "m", Metered(prompt_tokens=6, completion_tokens=4))
    with pytest.raises(ServiceError) as spent, gate.admit(quota):
        pass
    assert spent.value.kind is ErrorKind.QUOTA_EXCEEDED
    with gate.admit(quota, spends=False) as caller:  # a read still answers
        assert caller.name == "quota"
    with gate.admit(one), pytest.raises(ServiceError) as busy, gate.admit(one):
        pass
    assert busy.value.code == "concurrency_limit_exceeded" and busy.value.retry_after == 1
    with gate.admit(one):  # released
        pass
    with gate.admit("the-api-key") as admin:
        assert admin.name == "api-key" and admin.admin
    with pytest.raises(ServiceError, match="Invalid"), gate.admit("x" * 300):
        pass
    writer.close()
    gate.close()


def test_a_batch_store_from_before_owners_opens(tmp_path):
    path = tmp_path / "batches.sqlite"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE files (id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL,"
        " bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL);"
        "INSERT INTO files VALUES ('file-old', 'batch', 'a.jsonl', 2, 1, x'7b7d');"
    )
    old.close()
    store = BatchStore(path)
    found = store.file("file-old")
    assert found is not None and found.owner is None
    made = store.add_file("batch", "b.jsonl", b"{}", owner="alice")
    assert store.files(None, 10, None, True, owner="alice") == [made]
    assert [f.id for f in store.files(None, 10, None, True, owner=None)] == ["file-old"]
    assert len(store.files(None, 10, None, True)) == 2
    store.close()


def test_a_store_from_before_mcp_calls_were_counted_opens(tmp_path):
    """Usage written before a unit existed keeps its rows; the new unit counts from zero."""
    path = tmp_path / "keys.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE usage (key TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL, "
        "requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0, "
        "cached_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL "
        "DEFAULT 0, audio_seconds REAL NOT NULL DEFAULT 0, images INTEGER NOT NULL DEFAULT "
        "0, embedding_inputs INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (key, day, model))"
    )
    now = time.time()
    old.execute(
        "INSERT INTO usage (key, model, day, requests) VALUES ('a', 'm', ?, 3)", (day_of(now),)
    )
    old.commit()
    old.close()
    store = KeyStore(path)
    store.charge("a", "m", Metered(requests=1, mcp_calls=2, mcp_seconds=0.5), now)
    (row,) = store.usage("a", day_of(now), day_of(now))
    assert row.metered == Metered(requests=4, mcp_calls=2, mcp_seconds=0.5)
    store.close()
