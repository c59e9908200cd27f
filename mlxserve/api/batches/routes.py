"""Which batch or file endpoint answers a method and path: /v1/files[/{id}[/content]],
/v1/batches[/{id}[/cancel]], /v1/messages/batches[/{id}[/cancel|/results]] (each also
without its /v1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlxserve.api.batches.anthropic import MessageBatchEndpoints
from mlxserve.api.batches.openai import BatchEndpoints, FileEndpoints
from mlxserve.api.batches.query import Query
from mlxserve.api.methods import Reply, answer_with
from mlxserve.api.responder import Responder
from mlxserve.protocol.errors import not_found

FILES = "/files"
BATCHES = "/batches"
MESSAGE_BATCHES = "/messages/batches"
ROOTS = (FILES, BATCHES, MESSAGE_BATCHES)


def _parts(path: str) -> tuple[str, list[str]] | None:
    """(root, the segments after it) for a batch path, else None."""
    bare = path.removeprefix("/v1")
    for root in sorted(ROOTS, key=len, reverse=True):  # /messages/batches before /batches
        if bare == root or bare.startswith(root + "/"):
            rest = bare[len(root) :].strip("/")
            return root, rest.split("/") if rest else []
    return None


def is_batch_path(path: str) -> bool:
    return _parts(path) is not None


def is_anthropic_path(path: str) -> bool:
    found = _parts(path)
    return found is not None and found[0] == MESSAGE_BATCHES


def is_upload_path(path: str) -> bool:
    """Bodies that may be as large as a batch file (plus a form's fields)."""
    found = _parts(path)
    return found is not None and found[1] == [] and found[0] in (FILES, MESSAGE_BATCHES)


@dataclass
class BatchRoutes:
    files: FileEndpoints
    batches: BatchEndpoints
    messages: MessageBatchEndpoints

    def answer(
        self,
        method: str,
        path: str,
        query: str,
        body: Callable[[], bytes],
        responder: Responder,
    ) -> Reply:
        """The reply to a batch path; `body` reads the request's body (POST only)."""
        found = _parts(path)
        if found is None:
            raise not_found(f"Unknown path: {path}", code="unknown_url")
        root, rest = found
        return answer_with(method, path, self._routes(root, rest, Query(query), body, responder))

    def _routes(
        self,
        root: str,
        rest: list[str],
        query: Query,
        body: Callable[[], bytes],
        responder: Responder,
    ) -> dict[str, Callable[[], Reply]]:
        """The methods a path answers, each with its endpoint call."""
        files, batches, messages = self.files, self.batches, self.messages
        if root == FILES:
            if not rest:
                return {
                    "GET": lambda: files.list(query),
                    "POST": lambda: files.upload(body(), responder),
                }
            if len(rest) == 1:
                return {
                    "GET": lambda: files.retrieve(rest[0]),
                    "DELETE": lambda: files.delete(rest[0]),
                }
            if rest[1:] == ["content"]:
                return {"GET": lambda: files.content(rest[0])}
        elif root == BATCHES:
            if not rest:
                return {
                    "GET": lambda: batches.list(query),
                    "POST": lambda: batches.create(body(), responder),
                }
            if len(rest) == 1:
                return {"GET": lambda: batches.retrieve(rest[0])}
            if rest[1:] == ["cancel"]:
                return {"POST": lambda: batches.cancel(rest[0], body(), responder)}
        else:
            if not rest:
                return {
                    "GET": lambda: messages.list(query, responder),
                    "POST": lambda: messages.create(body(), responder),
                }
            if len(rest) == 1:
                return {
                    "GET": lambda: messages.retrieve(rest[0], responder),
                    "DELETE": lambda: messages.delete(rest[0]),
                }
            if rest[1:] == ["cancel"]:
                return {"POST": lambda: messages.cancel(rest[0], body(), responder)}
            if rest[1:] == ["results"]:
                return {"GET": lambda: messages.results(rest[0])}
        return {}


def label(path: str) -> str:
    """A batch path as a metrics label (ids left out: labels stay bounded)."""
    found = _parts(path)
    if found is None:
        return "other"
    root, rest = found
    return "/v1" + root + ("/{id}" if rest else "") + "".join(f"/{p}" for p in rest[1:2])
