"""GET /openapi.json: an OpenAPI 3.1 document of every operation the server answers.

Request bodies are the JSON Schemas of the very pydantic models the endpoints parse with
(so a field added to a wire model is documented by that change); replies and errors are
the shapes in `shapes`. Every path is documented once, with /v1 where it has it: the same
path without /v1 answers too. tests/test_openapi.py fails when a route of the route
table has no operation here, or an operation here names no route."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from mlxserve import __version__
from mlxserve.api.anthropic.requests import CountTokensRequest, MessagesRequest
from mlxserve.api.audio.speech import SpeechBody
from mlxserve.api.batches.anthropic import JSONL as ANTHROPIC_JSONL
from mlxserve.api.batches.anthropic import MessageBatchCreate
from mlxserve.api.batches.openai import JSONL as OPENAI_JSONL
from mlxserve.api.batches.openai import BatchCreate
from mlxserve.api.images.endpoints import MAX_IMAGES, MAX_PARTIAL_IMAGES, GenerationBody
from mlxserve.api.images.links import LINK_PREFIX
from mlxserve.api.infill.requests import InfillRequest
from mlxserve.api.ollama import requests as o
from mlxserve.api.openai.embeddings import EmbeddingsRequest
from mlxserve.api.openai.requests import (
    AdapterLoad,
    AdapterUnload,
    ChatRequest,
    CompletionRequest,
    ModelRequest,
    PinRequest,
)
from mlxserve.api.openai.tokenize import Detokenize, TokenizeText
from mlxserve.api.openapi import shapes as s
from mlxserve.api.rerank.endpoints import RerankBody, ScoreBody
from mlxserve.api.responses.conversations import AddItems, CreateConversation, UpdateConversation
from mlxserve.api.responses.requests import ResponsesRequest
from mlxserve.api.routes import is_keyless
from mlxserve.audio.codec import OUTPUT_FORMATS
from mlxserve.images.codec import OUTPUT_FORMATS as IMAGE_FORMATS

OPENAI, ANTHROPIC, LLAMA_CPP = "OpenAIError", "AnthropicError", "LlamaCppError"
OLLAMA = "OllamaError"
JSON, SSE, TEXT = "application/json", "text/event-stream", "text/plain"
NDJSON = "application/x-ndjson"


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # with {parameters}
    summary: str
    tag: str
    reply: dict[str, s.Schema]  # content type -> schema of a 200
    # The wire model of its JSON body (or any of several), or the schema of its form.
    body: type[BaseModel] | tuple[type[BaseModel], ...] | s.Schema | None = None
    query: dict[str, s.Schema] = field(default_factory=dict)
    headers: dict[str, s.Schema] = field(default_factory=dict)  # that change the reply
    error: str | tuple[str, ...] = OPENAI  # the error body's component (or one of these)
    admin: bool = False  # needs an admin key where the server has keys

    @property
    def models(self) -> tuple[type[BaseModel], ...]:
        if isinstance(self.body, type):
            return (self.body,)
        return self.body if isinstance(self.body, tuple) else ()


def _stream(whole: s.Schema) -> dict[str, s.Schema]:
    """A reply whole, or as server-sent events when the request asks to stream."""
    return {JSON: whole, SSE: s.SSE_EVENT}


def _either(*shapes: s.Schema) -> s.Schema:
    """A reply in one of several shapes (by the dialect the request asks for)."""
    return {"anyOf": list(shapes)}


def _lines(whole: s.Schema) -> dict[str, s.Schema]:
    """Ollama's: NDJSON lines unless the request says `stream: false` (then whole)."""
    return {JSON: whole, NDJSON: s.STRING}


TRANSCRIPTION_FORM = s.obj(
    {"file": {"type": "string", "contentMediaType": "application/octet-stream"}, "model": s.STRING},
    {
        "language": s.STRING,
        "prompt": s.STRING,
        "response_format": {"enum": ["json", "text", "srt", "verbose_json", "vtt"]},
        "temperature": s.NUMBER,
        "timestamp_granularities[]": s.array({"enum": ["word", "segment"]}),
        "stream": s.BOOLEAN,
    },
)
UPLOAD_FORM = s.obj(
    {
        "file": {"type": "string", "contentMediaType": "application/octet-stream"},
        "purpose": {"const": "batch"},
    }
)
IMAGE_FILE = {"type": "string", "contentMediaType": "image/png"}
IMAGE_EDIT_FORM = s.obj(
    {"image": IMAGE_FILE, "prompt": s.STRING},
    {
        "image[]": s.array(IMAGE_FILE),
        "mask": IMAGE_FILE,
        "model": s.STRING,
        "n": {"type": "integer", "minimum": 1, "maximum": MAX_IMAGES},
        "size": s.STRING,
        "response_format": {"enum": ["url", "b64_json"]},
        "output_format": {"enum": list(IMAGE_FORMATS)},
        "output_compression": {"type": "integer", "minimum": 0, "maximum": 100},
        "stream": s.BOOLEAN,
        "partial_images": {"type": "integer", "minimum": 0, "maximum": MAX_PARTIAL_IMAGES},
        "seed": s.INTEGER,
        "steps": s.INTEGER,
        "strength": s.NUMBER,
    },
)
IMAGE_LINKED = {
    f.content_type: {"type": "string", "contentMediaType": f.content_type}
    for f in IMAGE_FORMATS.values()
}
TRANSCRIBED = {JSON: s.TRANSCRIPTION, TEXT: s.STRING, SSE: s.SSE_EVENT}
SPOKEN = {
    **{
        f.content_type: {"type": "string", "contentMediaType": f.content_type}
        for f in OUTPUT_FORMATS.values()
    },
    SSE: s.SSE_EVENT,
}
LIMIT = {"limit": {"type": "integer", "minimum": 1}}
# The model list's in Anthropic's shape (asked for by its version header).
ANTHROPIC_VERSION = {"anthropic-version": s.STRING}
ANTHROPIC_PAGE = {
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    "after_id": s.STRING,
    "before_id": s.STRING,
    "lifecycle[]": s.array({"enum": ["active", "deprecated", "retired"]}),
}
AFTER = {"after": s.STRING}
DAY = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}

OPERATIONS: tuple[Operation, ...] = (
    # OpenAI
    Operation("POST", "/v1/chat/completions", "Chat", "openai", _stream(s.CHAT_COMPLETION), ChatRequest),
    Operation("POST", "/v1/completions", "Text completion (fill in the middle with suffix)", "openai", _stream(s.TEXT_COMPLETION), CompletionRequest),
    Operation("POST", "/v1/embeddings", "Embeddings", "openai", {JSON: s.EMBEDDINGS}, EmbeddingsRequest),
    Operation("GET", "/v1/models", "The servable models and adapters (a page of Anthropic's list with anthropic-version)", "models", {JSON: _either(s.MODEL_LIST, s.ANTHROPIC_MODEL_LIST)}, query=ANTHROPIC_PAGE, headers=ANTHROPIC_VERSION, error=(OPENAI, ANTHROPIC)),
    Operation("GET", "/v1/models/{model}", "One model (Anthropic's shape with anthropic-version)", "models", {JSON: _either(s.ref("Model"), s.ref("AnthropicModel"))}, headers=ANTHROPIC_VERSION, error=(OPENAI, ANTHROPIC)),
    Operation("POST", "/v1/models/load", "Load a model or adapter now", "admin", {JSON: s.MODEL_STATE}, ModelRequest, admin=True),
    Operation("POST", "/v1/models/unload", "Unload a model or adapter now", "admin", {JSON: s.MODEL_STATE}, ModelRequest, admin=True),
    Operation("POST", "/v1/models/pin", "Keep a model resident, or let it go", "admin", {JSON: s.MODEL_STATE}, PinRequest, admin=True),
    Operation("POST", "/v1/adapters/load", "Serve an adapter folder", "admin", {JSON: s.ref("Model")}, AdapterLoad, admin=True),
    Operation("POST", "/v1/adapters/unload", "Stop serving an adapter", "admin", {JSON: s.DELETED_MODEL}, AdapterUnload, admin=True),
    Operation("POST", "/v1/audio/transcriptions", "Speech to text", "audio", TRANSCRIBED, TRANSCRIPTION_FORM),
    Operation("POST", "/v1/audio/translations", "Speech to English text", "audio", TRANSCRIBED, TRANSCRIPTION_FORM),
    Operation("POST", "/v1/audio/speech", "Text to speech", "audio", SPOKEN, SpeechBody),
    Operation("POST", "/v1/images/generations", "Text to image", "images", _stream(s.IMAGES), GenerationBody),
    Operation("POST", "/v1/images/edits", "Edit an image (a mask: only its transparent part)", "images", _stream(s.IMAGES), IMAGE_EDIT_FORM),
    Operation("GET", LINK_PREFIX + "{name}", "An image a url reply links to (no key needed; for an hour)", "images", IMAGE_LINKED),
    Operation("POST", "/v1/rerank", "Rerank documents (Cohere's and Jina's shape)", "rerank", {JSON: s.RERANKED}, RerankBody),
    Operation("POST", "/v2/rerank", "Rerank documents (Cohere's v2 path)", "rerank", {JSON: s.RERANKED}, RerankBody),
    Operation("POST", "/v1/score", "Score text pairs (vLLM's shape)", "rerank", {JSON: s.SCORED}, ScoreBody),
    Operation("POST", "/tokenize", "Tokenize a prompt or a chat (vLLM's shape)", "tokens", {JSON: s.TOKENIZED}, (TokenizeText, ChatRequest)),
    Operation("POST", "/detokenize", "Token ids to text", "tokens", {JSON: s.DETOKENIZED}, Detokenize),
    # Anthropic
    Operation("POST", "/v1/messages", "Messages", "anthropic", _stream(s.MESSAGE), MessagesRequest, error=ANTHROPIC),
    Operation("POST", "/v1/messages/count_tokens", "Count a Messages request's input tokens", "anthropic", {JSON: s.TOKEN_COUNT}, CountTokensRequest, error=ANTHROPIC),
    # Responses
    Operation("POST", "/v1/responses", "Create a response", "responses", _stream(s.RESPONSE), ResponsesRequest),
    Operation("POST", "/v1/responses/compact", "Compact a conversation", "responses", {JSON: s.COMPACTION}, ResponsesRequest),
    Operation("GET", "/v1/responses/{response_id}", "A stored response", "responses", {JSON: s.RESPONSE}),
    Operation("DELETE", "/v1/responses/{response_id}", "Delete a stored response", "responses", {JSON: s.DELETED_RESPONSE}),
    Operation("GET", "/v1/responses/{response_id}/input_items", "A stored response's input items", "responses", {JSON: s.ITEM_LIST}, query={**LIMIT, "order": {"enum": ["asc", "desc"]}, **AFTER}),
    Operation("POST", "/v1/conversations", "Create a conversation", "responses", {JSON: s.ref("Conversation")}, CreateConversation),
    Operation("GET", "/v1/conversations/{conversation_id}", "A conversation", "responses", {JSON: s.ref("Conversation")}),
    Operation("POST", "/v1/conversations/{conversation_id}", "Replace a conversation's metadata", "responses", {JSON: s.ref("Conversation")}, UpdateConversation),
    Operation("DELETE", "/v1/conversations/{conversation_id}", "Delete a conversation", "responses", {JSON: s.DELETED_CONVERSATION}),
    Operation("GET", "/v1/conversations/{conversation_id}/items", "A conversation's items", "responses", {JSON: s.ITEM_LIST}, query={**LIMIT, "order": {"enum": ["asc", "desc"]}, **AFTER, "include": s.array(s.STRING)}),
    Operation("POST", "/v1/conversations/{conversation_id}/items", "Add items to a conversation", "responses", {JSON: s.ITEM_LIST}, AddItems),
    Operation("GET", "/v1/conversations/{conversation_id}/items/{item_id}", "A conversation's item", "responses", {JSON: s.ITEM}),
    Operation("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}", "Delete an item (answers the conversation)", "responses", {JSON: s.ref("Conversation")}),
    # llama.cpp
    Operation("POST", "/infill", "Fill in the middle (llama.cpp's shape)", "editors", _stream(s.INFILLED), InfillRequest, error=LLAMA_CPP),
    # Ollama
    Operation("GET", "/api/version", "Ollama: the API version served", "ollama", {JSON: s.OLLAMA_VERSION}, error=OLLAMA),
    Operation("GET", "/api/tags", "Ollama: the models", "ollama", {JSON: s.OLLAMA_TAGS}, error=OLLAMA),
    Operation("GET", "/api/ps", "Ollama: the models in memory", "ollama", {JSON: s.OLLAMA_PS}, error=OLLAMA),
    Operation("POST", "/api/show", "Ollama: a model's details", "ollama", {JSON: s.OLLAMA_SHOW}, o.ShowRequest, error=OLLAMA),
    Operation("POST", "/api/chat", "Ollama: chat", "ollama", _lines(s.OLLAMA_REPLY), o.ChatRequest, error=OLLAMA),
    Operation("POST", "/api/generate", "Ollama: generate (raw, context, suffix)", "ollama", _lines(s.OLLAMA_REPLY), o.GenerateRequest, error=OLLAMA),
    Operation("POST", "/api/embed", "Ollama: embeddings", "ollama", {JSON: s.OLLAMA_EMBED}, o.EmbedRequest, error=OLLAMA),
    Operation("POST", "/api/embeddings", "Ollama: one embedding (the older route)", "ollama", {JSON: s.OLLAMA_EMBEDDING}, o.EmbeddingsRequest, error=OLLAMA),
    Operation("POST", "/api/pull", "Ollama: download a hub repo", "ollama", _lines(s.OLLAMA_PROGRESS), o.PullRequest, error=OLLAMA, admin=True),
    Operation("POST", "/api/copy", "Ollama: a new name for a model", "ollama", {JSON: s.OBJECT}, o.CopyRequest, error=OLLAMA, admin=True),
    Operation("POST", "/api/create", "Ollama: a named model over another", "ollama", _lines(s.OLLAMA_PROGRESS), o.CreateRequest, error=OLLAMA, admin=True),
    Operation("DELETE", "/api/delete", "Ollama: delete a model or a name", "ollama", {JSON: s.OBJECT}, o.DeleteRequest, error=OLLAMA, admin=True),
    # Batch jobs
    Operation("POST", "/v1/files", "Upload a batch input file", "batches", {JSON: s.ref("File")}, UPLOAD_FORM),
    Operation("GET", "/v1/files", "Files", "batches", {JSON: s.FILE_LIST}, query={"purpose": s.STRING, **LIMIT, "order": {"enum": ["asc", "desc"]}, **AFTER}),
    Operation("GET", "/v1/files/{file_id}", "A file", "batches", {JSON: s.ref("File")}),
    Operation("DELETE", "/v1/files/{file_id}", "Delete a file", "batches", {JSON: s.DELETED_FILE}),
    Operation("GET", "/v1/files/{file_id}/content", "A file's content", "batches", {OPENAI_JSONL: s.STRING}),
    Operation("POST", "/v1/batches", "Create a batch", "batches", {JSON: s.ref("Batch")}, BatchCreate),
    Operation("GET", "/v1/batches", "Batches", "batches", {JSON: s.BATCH_LIST}, query={**LIMIT, **AFTER}),
    Operation("GET", "/v1/batches/{batch_id}", "A batch", "batches", {JSON: s.ref("Batch")}),
    Operation("POST", "/v1/batches/{batch_id}/cancel", "Cancel a batch", "batches", {JSON: s.ref("Batch")}),
    Operation("POST", "/v1/messages/batches", "Create a message batch", "batches", {JSON: s.ref("MessageBatch")}, MessageBatchCreate, error=ANTHROPIC),
    Operation("GET", "/v1/messages/batches", "Message batches", "batches", {JSON: s.MESSAGE_BATCH_LIST}, query={**LIMIT, "after_id": s.STRING, "before_id": s.STRING}, error=ANTHROPIC),
    Operation("GET", "/v1/messages/batches/{batch_id}", "A message batch", "batches", {JSON: s.ref("MessageBatch")}, error=ANTHROPIC),
    Operation("POST", "/v1/messages/batches/{batch_id}/cancel", "Cancel a message batch", "batches", {JSON: s.ref("MessageBatch")}, error=ANTHROPIC),
    Operation("DELETE", "/v1/messages/batches/{batch_id}", "Delete an ended message batch", "batches", {JSON: s.DELETED_MESSAGE_BATCH}, error=ANTHROPIC),
    Operation("GET", "/v1/messages/batches/{batch_id}/results", "An ended message batch's results", "batches", {ANTHROPIC_JSONL: s.STRING}, error=ANTHROPIC),
    # The server
    Operation("GET", "/health", "Ready to serve (no key needed)", "server", {JSON: s.HEALTH}),
    Operation("GET", "/metrics", "Prometheus metrics", "admin", {TEXT: s.STRING}, admin=True),
    Operation("GET", "/v1/status", "What the web app shows", "server", {JSON: s.STATUS}),
    Operation("GET", "/v1/usage", "An API key's usage by day and model", "keys", {JSON: s.USAGE_LIST}, query={"start": DAY, "end": DAY, "key": s.STRING}),
    Operation("GET", "/v1/keys", "The API keys (never their secrets)", "admin", {JSON: s.KEY_LIST}, admin=True),
    Operation("GET", "/v1/mcp/servers", "The MCP servers of --mcp-config: state and tools", "admin", {JSON: s.MCP_SERVER_LIST}, admin=True),
    Operation("GET", "/openapi.json", "This document (no key needed)", "server", {JSON: s.OPENAPI}),
)  # fmt: skip


@cache
def document() -> dict[str, Any]:
    """The OpenAPI document (built once: it is the same for every request)."""
    models = sorted({model for op in OPERATIONS for model in op.models}, key=_name)
    refs, defs = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    bodies = {model: refs[(model, "validation")] for model in models}
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, bodies)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mlxserve",
            "version": __version__,
            "description": (
                "An inference server for MLX models. Every path also answers without its "
                "/v1 prefix. Errors come in the shape of the dialect a path belongs to."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {**defs.get("$defs", {}), **s.COMPONENTS},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }


def _name(model: type[BaseModel]) -> str:
    return f"{model.__module__}.{model.__qualname__}"


def _operation(op: Operation, bodies: dict) -> dict[str, Any]:
    errors = [op.error] if isinstance(op.error, str) else list(op.error)
    shape = _either(*map(s.ref, errors)) if len(errors) > 1 else s.ref(errors[0])
    error = {"content": {JSON: {"schema": shape}}}
    described: dict[str, Any] = {
        "operationId": f"{op.method.lower()}{op.path}",
        "summary": op.summary + (" (an admin key)" if op.admin else ""),
        "tags": [op.tag],
        "responses": {
            "200": {
                "description": "OK",
                "content": {kind: {"schema": schema} for kind, schema in op.reply.items()},
            },
            "4XX": {"description": "The client's mistake, or a refusal", **error},
            "503": {"description": "Not ready, or too busy: retry after Retry-After", **error},
        },
        "security": [] if is_keyless(op.path) else [{}, {"bearer": []}, {"apiKey": []}],
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": s.STRING}
        for name in _path_parameters(op.path)
    ] + [{"name": name, "in": "query", "schema": schema} for name, schema in op.query.items()]
    parameters += [{"name": n, "in": "header", "schema": h} for n, h in op.headers.items()]
    if parameters:
        described["parameters"] = parameters
    if op.method == "POST":
        if isinstance(op.body, dict):
            content = {"multipart/form-data": {"schema": op.body}}
        else:
            schemas = [bodies[model] for model in op.models] or [s.OBJECT]
            schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
            content = {JSON: {"schema": schema}}
        described["requestBody"] = {"required": op.body is not None, "content": content}
    return described


def _path_parameters(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]
