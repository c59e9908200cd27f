"""OpenAI's Files and Batch APIs: /v1/files (upload, list, retrieve, delete, content) and
/v1/batches (create, retrieve, list, cancel), with their output and error files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from mlxserve.api.batches.keeper import BatchKeeper
from mlxserve.api.batches.owners import new_owner, scope, visible
from mlxserve.api.batches.query import Query
from mlxserve.api.multipart import parse_form
from mlxserve.api.responder import RawReply, Responder
from mlxserve.api.wire import Strict, parse
from mlxserve.batches.store import (
    CANCELED,
    CANCELLING,
    IN_PROGRESS,
    LINE_EXPIRED,
    SUCCEEDED,
    BatchRecord,
    BatchStore,
    FileRecord,
    LineRecord,
    NewLine,
)
from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request, not_found

# What a batch's lines may ask for: the endpoints that answer a request with one JSON reply.
BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
WINDOWS = {"24h": 24 * 3600}  # completion_window -> seconds (OpenAI's only window)
METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
FILE_PURPOSE = "batch"
# Files a Responses request names by id (input_image, input_file): OpenAI's purposes.
INPUT_PURPOSES = ("user_data", "vision")
JSONL = "application/jsonl"
CUSTOM_ID_CHARS = 512


class BatchCreate(Strict):
    input_file_id: Annotated[str, Field(min_length=1)]
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None

    @field_validator("endpoint", "completion_window")
    @classmethod
    def _served(cls, value: str, info: ValidationInfo) -> str:
        served = BATCH_ENDPOINTS if info.field_name == "endpoint" else tuple(WINDOWS)
        if value not in served:
            raise ValueError(f"must be one of {', '.join(served)}")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and (
            len(value) > METADATA_KEYS
            or any(
                len(k) > METADATA_KEY_CHARS or len(v) > METADATA_VALUE_CHARS
                for k, v in value.items()
            )
        ):
            raise ValueError(
                f"at most {METADATA_KEYS} keys of at most {METADATA_KEY_CHARS} characters, "
                f"values of at most {METADATA_VALUE_CHARS}"
            )
        return value


@dataclass
class Validated:
    """An input file read into lines, or the problems that fail the whole batch."""

    lines: list[NewLine]
    errors: list[dict]


def _problem(code: str, message: str, line: int | None = None, param: str | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}


def read_input(content: bytes, endpoint: str, max_lines: int) -> Validated:
    """The file's JSONL lines. A line that cannot be told apart from the others (not a
    JSON object, no custom_id, a custom_id used twice) fails the batch; a line that can
    but asks for what the batch does not serve goes to the error file."""
    rows = [(n, text) for n, text in enumerate(content.split(b"\n"), 1) if text.strip()]
    if not rows:
        return Validated([], [_problem("empty_file", "The input file has no requests.")])
    if len(rows) > max_lines:
        message = f"The input file has {len(rows)} requests; a batch takes at most {max_lines}."
        return Validated([], [_problem("too_many_requests", message)])
    lines: list[NewLine] = []
    errors: list[dict] = []
    seen: set[str] = set()
    for number, text in rows:
        try:
            request = json.loads(text)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            errors.append(_problem("invalid_json_line", "This line is not a JSON object.", number))
            continue
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not 0 < len(custom_id) <= CUSTOM_ID_CHARS:
            message = f"custom_id must be a string of 1 to {CUSTOM_ID_CHARS} characters."
            errors.append(_problem("missing_required_parameter", message, number, "custom_id"))
            continue
        if custom_id in seen:
            message = "The custom_id for this request is a duplicate of another request."
            errors.append(_problem("duplicate_custom_id", message, number, "custom_id"))
            continue
        seen.add(custom_id)
        lines.append(_line(custom_id, request, endpoint))
    return Validated(lines, errors)


def _line(custom_id: str, request: dict, endpoint: str) -> NewLine:
    body = request.get("body")
    if request.get("method") != "POST":
        return NewLine(custom_id, result=_fault("invalid_method", "method must be POST."))
    if request.get("url") != endpoint:
        message = f"url must be the batch's endpoint, {endpoint}."
        return NewLine(custom_id, result=_fault("mismatched_endpoint", message))
    if not isinstance(body, dict):
        return NewLine(custom_id, result=_fault("invalid_body", "body must be a JSON object."))
    # A line's reply is one JSON object: a stream is answered whole.
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return NewLine(custom_id, body=json.dumps(body, ensure_ascii=False).encode())


def _fault(code: str, message: str) -> dict:
    return {"code": code, "message": message}


def file_object(record: FileRecord) -> dict:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(batch: BatchRecord) -> dict:
    counts, usage, stamps = batch.counts, batch.usage, batch.stamps
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": batch.created_at,
        "in_progress_at": stamps.get("in_progress_at"),
        "expires_at": batch.expires_at,
        "finalizing_at": stamps.get("finalizing_at"),
        "completed_at": stamps.get("completed_at"),
        "failed_at": stamps.get("failed_at"),
        "expired_at": stamps.get("expired_at"),
        "cancelling_at": stamps.get("cancelling_at"),
        "cancelled_at": stamps.get("cancelled_at"),
        "request_counts": {
            "total": counts.total,
            "completed": counts.succeeded,
            "failed": counts.errored,
        },
        "metadata": batch.metadata,
        "usage": {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
    }


NOT_RUN = {
    CANCELED: _fault("batch_cancelled", "This request was not run: the batch was cancelled."),
    LINE_EXPIRED: _fault(
        "batch_expired", "This request could not be run before the completion window expired."
    ),
}


def output_line(line: LineRecord) -> tuple[str, dict]:
    """A line's entry in the output file ("output") or the error file ("error")."""
    entry: dict = {"id": line.request_id, "custom_id": line.custom_id}
    if line.outcome in NOT_RUN:
        return "error", {**entry, "response": None, "error": NOT_RUN[line.outcome]}
    if line.status_code is None:  # refused when the batch was created
        return "error", {**entry, "response": None, "error": line.result}
    response = {"status_code": line.status_code, "request_id": line.request_id, "body": line.result}
    kind = "output" if line.outcome == SUCCEEDED else "error"
    return kind, {**entry, "response": response, "error": None}


def output_files(store: BatchStore, batch: BatchRecord) -> list[tuple[str, str, bytes]]:
    """An ended batch's output and error files (each only where it has lines)."""
    parts: dict[str, list[bytes]] = {"output": [], "error": []}
    for line in store.lines(batch.id):
        kind, entry = output_line(line)
        parts[kind].append(json.dumps(entry, ensure_ascii=False).encode() + b"\n")
    return [
        (kind, f"{batch.id}_{kind}.jsonl", b"".join(lines))
        for kind, lines in parts.items()
        if lines
    ]


@dataclass
class FileEndpoints:
    keeper: BatchKeeper

    def upload(self, raw: bytes, responder: Responder) -> dict:
        """POST /v1/files (multipart: purpose, file)."""
        form = parse_form(responder.header("Content-Type"), raw, "the JSONL file")
        purpose = form.text("purpose")
        if purpose not in (FILE_PURPOSE, *INPUT_PURPOSES):
            purposes = ", ".join(f"'{p}'" for p in (FILE_PURPOSE, *INPUT_PURPOSES))
            raise bad_request(
                f"purpose must be one of {purposes} (batch input, or files a request names).",
                param="purpose",
            )
        content = form.files.get("file")
        if content is None:
            raise bad_request("The form has no file: send it in a field named file.", param="file")
        limit = self.keeper.config.max_batch_file_bytes
        if len(content) > limit:
            raise ServiceError(
                ErrorKind.TOO_LARGE,
                f"The file exceeds the limit of {limit} bytes (--max-batch-file-bytes).",
                param="file",
                code="file_too_large",
            )
        name = form.filenames.get("file", "file")
        record = self.keeper.store().add_file(purpose, name, content, new_owner())
        return file_object(record)

    def list(self, query: Query) -> dict:
        """GET /v1/files?purpose=&limit=&order=&after="""
        limit = query.limit(10_000, 10_000)
        order = query.choice("order", ("desc", "asc"))
        store = self.keeper.existing()
        after = query.text("after")
        records = (
            store.files(query.text("purpose"), limit + 1, after, order == "asc", scope())
            if store
            else []
        )
        return _page([file_object(r) for r in records], limit)

    def retrieve(self, file_id: str) -> dict:
        return file_object(self._file(file_id))

    def delete(self, file_id: str) -> dict:
        self._file(file_id)
        self.keeper.store().delete_file(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    def content(self, file_id: str) -> RawReply:
        record = self._file(file_id)
        data = self.keeper.store().content(record.id) or b""
        return RawReply(JSONL, data)

    def _file(self, file_id: str) -> FileRecord:
        store = self.keeper.existing()
        record = store.file(file_id) if store else None
        if record is None or not visible(record.owner):
            raise not_found(f"No such File object: {file_id}", param="id", code="file_not_found")
        return record


@dataclass
class BatchEndpoints:
    keeper: BatchKeeper

    def create(self, raw: bytes, responder: Responder) -> dict:
        """POST /v1/batches: the input file read and checked now; the batch runs (or, if
        its file cannot be run, has failed) when the reply comes."""
        wire = parse(BatchCreate, raw)
        store = self.keeper.store()
        record = store.file(wire.input_file_id)
        if record is None or not visible(record.owner):
            raise not_found(
                f"No such File object: {wire.input_file_id}",
                param="input_file_id",
                code="file_not_found",
            )
        if record.purpose != FILE_PURPOSE:
            raise bad_request(
                f"The input file's purpose is '{record.purpose}', not '{FILE_PURPOSE}'.",
                param="input_file_id",
            )
        validated = read_input(
            store.content(record.id) or b"", wire.endpoint, self.keeper.config.max_batch_lines
        )
        batch = store.create_batch(
            "openai",
            wire.endpoint,
            validated.lines,
            WINDOWS[wire.completion_window],
            wire.completion_window,
            input_file_id=record.id,
            metadata=wire.metadata,
            errors=validated.errors or None,
            owner=new_owner(),
        )
        self.keeper.wake()
        return batch_object(batch)

    def retrieve(self, batch_id: str) -> dict:
        return batch_object(self._batch(batch_id))

    def list(self, query: Query) -> dict:
        """GET /v1/batches?limit=&after= (the newest first)."""
        limit = query.limit(20, 100)
        store = self.keeper.existing()
        after = query.text("after")
        records = store.batches("openai", limit + 1, after, owner=scope()) if store else []
        return _page([batch_object(r) for r in records], limit)

    def cancel(self, batch_id: str, raw: bytes, responder: Responder) -> dict:
        """POST /v1/batches/{id}/cancel: lines running end, the rest are not run; the batch
        is cancelled (with its output and error files) once none runs."""
        store = self.keeper.store()
        batch = self._batch(batch_id)
        cancelled = store.set_status(batch.id, CANCELLING, when=(IN_PROGRESS,))
        if not cancelled and batch.status != CANCELLING:
            raise bad_request(
                f"Cannot cancel a batch with status '{batch.status}'.", code="invalid_state"
            )
        self.keeper.wake()
        return batch_object(self._batch(batch_id))

    def _batch(self, batch_id: str) -> BatchRecord:
        store = self.keeper.existing()
        batch = store.batch(batch_id) if store else None
        if batch is None or batch.dialect != "openai" or not visible(batch.owner):
            raise not_found(f"No such Batch object: {batch_id}", param="id", code="batch_not_found")
        return batch


def _page(data: list[dict], limit: int) -> dict:
    """OpenAI's list shape; `data` was read one beyond `limit` to know if more follow."""
    shown = data[:limit]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(data) > limit,
    }
