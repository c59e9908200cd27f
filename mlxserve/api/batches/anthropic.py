"""Anthropic's Message Batches: /v1/messages/batches (create, retrieve, list, cancel,
delete) and each batch's results as JSONL. Its lines run on the same runner and store as
OpenAI's batches, through /v1/messages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated

from pydantic import Field, model_validator

from mlxserve.api.batches.keeper import BatchKeeper
from mlxserve.api.batches.owners import new_owner, scope, visible
from mlxserve.api.batches.query import Query
from mlxserve.api.responder import RawReply, Responder
from mlxserve.api.wire import Strict, parse
from mlxserve.batches.store import (
    CANCELED,
    CANCELLING,
    IN_PROGRESS,
    LINE_EXPIRED,
    RUNNING,
    SUCCEEDED,
    BatchRecord,
    LineRecord,
    NewLine,
)
from mlxserve.protocol.errors import bad_request, not_found

MESSAGES = "/v1/messages"
WINDOW_SECONDS = 24 * 3600  # Anthropic's: a batch not ended in 24 hours expires
JSONL = "application/x-jsonl"
RESULTS_PATH = "/v1/messages/batches/{id}/results"


class BatchRequest(Strict):
    custom_id: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    params: dict


class MessageBatchCreate(Strict):
    requests: Annotated[list[BatchRequest], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique(self) -> MessageBatchCreate:
        seen: set[str] = set()
        for request in self.requests:
            if request.custom_id in seen:
                raise ValueError(f"custom_id '{request.custom_id}' is used more than once")
            seen.add(request.custom_id)
        return self


def _time(seconds: int | None) -> str | None:
    """RFC 3339, as Anthropic writes times."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _processing_status(status: str) -> str:
    if status == CANCELLING:
        return "canceling"
    return "in_progress" if status in RUNNING else "ended"


def _ended_at(batch: BatchRecord) -> int | None:
    stamps = batch.stamps
    return stamps.get("completed_at") or stamps.get("cancelled_at") or stamps.get("expired_at")


def batch_object(batch: BatchRecord, origin: str) -> dict:
    counts = batch.counts
    ended = _processing_status(batch.status) == "ended"
    results = origin + RESULTS_PATH.format(id=batch.id)
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": _processing_status(batch.status),
        "request_counts": {
            "processing": counts.pending,
            "succeeded": counts.succeeded,
            "errored": counts.errored,
            "canceled": counts.canceled,
            "expired": counts.expired,
        },
        "ended_at": _time(_ended_at(batch)),
        "created_at": _time(batch.created_at),
        "expires_at": _time(batch.expires_at),
        "archived_at": None,
        "cancel_initiated_at": _time(batch.stamps.get("cancelling_at")),
        "results_url": results if ended else None,
    }


def result_line(line: LineRecord) -> dict:
    """A line's entry in the results: its message, its error (in Anthropic's error shape,
    as /v1/messages answered it), or that it was not run."""
    if line.outcome == SUCCEEDED:
        result: dict = {"type": "succeeded", "message": line.result}
    elif line.outcome == CANCELED:
        result = {"type": "canceled"}
    elif line.outcome == LINE_EXPIRED:
        result = {"type": "expired"}
    else:
        result = {"type": "errored", "error": line.result}
    return {"custom_id": line.custom_id, "result": result}


@dataclass
class MessageBatchEndpoints:
    keeper: BatchKeeper

    def create(self, raw: bytes, responder: Responder) -> dict:
        wire = parse(MessageBatchCreate, raw)
        limit = self.keeper.config.max_batch_lines
        if len(wire.requests) > limit:
            raise bad_request(
                f"A batch takes at most {limit} requests; this one has {len(wire.requests)}.",
                param="requests",
            )
        lines = [
            NewLine(request.custom_id, body=_body(request.params)) for request in wire.requests
        ]
        batch = self.keeper.store().create_batch(
            "anthropic",
            MESSAGES,
            lines,
            WINDOW_SECONDS,
            "24h",
            prefix="msgbatch_",
            owner=new_owner(),
        )
        self.keeper.wake()
        return batch_object(batch, _origin(responder))

    def retrieve(self, batch_id: str, responder: Responder) -> dict:
        return batch_object(self._batch(batch_id), _origin(responder))

    def list(self, query: Query, responder: Responder) -> dict:
        """GET /v1/messages/batches?limit=&after_id=&before_id= (the newest first)."""
        limit = query.limit(20, 1000)
        store = self.keeper.existing()
        after, before = query.text("after_id"), query.text("before_id")
        records = store.batches("anthropic", limit + 1, after, before, scope()) if store else []
        shown = records[:limit] if query.text("before_id") is None else records[-limit:]
        origin = _origin(responder)
        return {
            "data": [batch_object(r, origin) for r in shown],
            "has_more": len(records) > limit,
            "first_id": shown[0].id if shown else None,
            "last_id": shown[-1].id if shown else None,
        }

    def cancel(self, batch_id: str, raw: bytes, responder: Responder) -> dict:
        store = self.keeper.store()
        batch = self._batch(batch_id)
        if batch.status in RUNNING:
            store.set_status(batch.id, CANCELLING, when=(IN_PROGRESS,))
            self.keeper.wake()
        return batch_object(self._batch(batch_id), _origin(responder))

    def delete(self, batch_id: str) -> dict:
        batch = self._batch(batch_id)
        if batch.status in RUNNING:
            raise bad_request(
                "A batch can be deleted once it has ended: cancel it first.", param="id"
            )
        self.keeper.store().delete_batch(batch.id)
        return {"id": batch.id, "type": "message_batch_deleted"}

    def results(self, batch_id: str) -> RawReply:
        batch = self._batch(batch_id)
        if batch.status in RUNNING:
            raise bad_request(
                f"Batch {batch_id} has not ended; its results are ready once its "
                "processing_status is 'ended'.",
                param="id",
            )
        lines = self.keeper.store().lines(batch.id)
        data = b"".join(
            json.dumps(result_line(line), ensure_ascii=False).encode() + b"\n" for line in lines
        )
        return RawReply(JSONL, data)

    def _batch(self, batch_id: str) -> BatchRecord:
        store = self.keeper.existing()
        batch = store.batch(batch_id) if store else None
        if batch is None or batch.dialect != "anthropic" or not visible(batch.owner):
            raise not_found(f"No such message batch: {batch_id}", param="id")
        return batch


def _body(params: dict) -> bytes:
    """A request's params as /v1/messages takes them: answered whole, never streamed."""
    body = {k: v for k, v in params.items() if k != "stream"}
    return json.dumps(body, ensure_ascii=False).encode()


def _origin(responder: Responder) -> str:
    """Where the client reached this server (results_url is absolute, as Anthropic's)."""
    host = responder.header("Host") or "localhost"
    return f"http://{host}"
