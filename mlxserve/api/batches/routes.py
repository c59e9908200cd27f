"""The batch routes: /v1/files and /v1/batches (OpenAI's), /v1/messages/batches
(Anthropic's, errors in its shape)."""

from __future__ import annotations

from mlxserve.api.anthropic.errors import ERRORS as ANTHROPIC_ERRORS
from mlxserve.api.batches.anthropic import JSONL as ANTHROPIC_JSONL
from mlxserve.api.batches.anthropic import MessageBatchCreate, MessageBatchEndpoints
from mlxserve.api.batches.openai import JSONL as OPENAI_JSONL
from mlxserve.api.batches.openai import BatchCreate, BatchEndpoints, FileEndpoints
from mlxserve.api.batches.query import Query
from mlxserve.api.openai.errors import ERRORS
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON
from mlxserve.api.table import Route, by_id, upload, with_body

TAG = "batches"
LIMIT = {"limit": {"type": "integer", "minimum": 1}}
UPLOAD_FORM = s.obj({"file": s.binary("application/octet-stream"), "purpose": {"const": "batch"}})
BATCH_FILE = upload(lambda config: config.max_batch_file_bytes)

FILE_ROUTES: tuple[Route[FileEndpoints], ...] = (
    Route("POST", "/v1/files", with_body(FileEndpoints.upload), "Upload a batch input file", TAG, {JSON: s.ref("File")}, ERRORS, UPLOAD_FORM, body_limit=BATCH_FILE),
    Route("GET", "/v1/files", lambda e, call: e.list(Query(call.query)), "Files", TAG, {JSON: s.FILE_LIST}, ERRORS, query={"purpose": s.STRING, **LIMIT, "order": {"enum": ["asc", "desc"]}, "after": s.STRING}),
    Route("GET", "/v1/files/{file_id}", by_id(FileEndpoints.retrieve, "file_id"), "A file", TAG, {JSON: s.ref("File")}, ERRORS),
    Route("DELETE", "/v1/files/{file_id}", by_id(FileEndpoints.delete, "file_id"), "Delete a file", TAG, {JSON: s.DELETED_FILE}, ERRORS),
    Route("GET", "/v1/files/{file_id}/content", by_id(FileEndpoints.content, "file_id"), "A file's content", TAG, {OPENAI_JSONL: s.STRING}, ERRORS),
)  # fmt: skip

BATCH_ROUTES: tuple[Route[BatchEndpoints], ...] = (
    Route("POST", "/v1/batches", with_body(BatchEndpoints.create), "Create a batch", TAG, {JSON: s.ref("Batch")}, ERRORS, BatchCreate),
    Route("GET", "/v1/batches", lambda e, call: e.list(Query(call.query)), "Batches", TAG, {JSON: s.BATCH_LIST}, ERRORS, query={**LIMIT, "after": s.STRING}),
    Route("GET", "/v1/batches/{batch_id}", by_id(BatchEndpoints.retrieve, "batch_id"), "A batch", TAG, {JSON: s.ref("Batch")}, ERRORS),
    Route("POST", "/v1/batches/{batch_id}/cancel", lambda e, call: e.cancel(call.params["batch_id"], call.body, call.responder), "Cancel a batch", TAG, {JSON: s.ref("Batch")}, ERRORS),
)  # fmt: skip

MESSAGE_BATCH_ROUTES: tuple[Route[MessageBatchEndpoints], ...] = (
    Route("POST", "/v1/messages/batches", with_body(MessageBatchEndpoints.create), "Create a message batch", TAG, {JSON: s.ref("MessageBatch")}, ANTHROPIC_ERRORS, MessageBatchCreate, body_limit=BATCH_FILE),
    Route("GET", "/v1/messages/batches", lambda e, call: e.list(Query(call.query), call.responder), "Message batches", TAG, {JSON: s.MESSAGE_BATCH_LIST}, ANTHROPIC_ERRORS, query={**LIMIT, "after_id": s.STRING, "before_id": s.STRING}),
    Route("GET", "/v1/messages/batches/{batch_id}", lambda e, call: e.retrieve(call.params["batch_id"], call.responder), "A message batch", TAG, {JSON: s.ref("MessageBatch")}, ANTHROPIC_ERRORS),
    Route("POST", "/v1/messages/batches/{batch_id}/cancel", lambda e, call: e.cancel(call.params["batch_id"], call.body, call.responder), "Cancel a message batch", TAG, {JSON: s.ref("MessageBatch")}, ANTHROPIC_ERRORS),
    Route("DELETE", "/v1/messages/batches/{batch_id}", by_id(MessageBatchEndpoints.delete, "batch_id"), "Delete an ended message batch", TAG, {JSON: s.DELETED_MESSAGE_BATCH}, ANTHROPIC_ERRORS),
    Route("GET", "/v1/messages/batches/{batch_id}/results", by_id(MessageBatchEndpoints.results, "batch_id"), "An ended message batch's results", TAG, {ANTHROPIC_JSONL: s.STRING}, ANTHROPIC_ERRORS),
)  # fmt: skip
