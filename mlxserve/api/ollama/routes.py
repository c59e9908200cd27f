"""Ollama's routes, at its paths (no /v1), errors in its shape."""

from __future__ import annotations

from mlxserve.api.ollama import requests as o
from mlxserve.api.ollama.endpoints import OllamaEndpoints
from mlxserve.api.ollama.errors import ERRORS
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON
from mlxserve.api.table import Route, as_caller, plain, with_body

TAG = "ollama"

# HEAD is answered where Ollama's clients probe: the version and the model list.
ROUTES: tuple[Route[OllamaEndpoints], ...] = (
    Route("GET", "/api/version", plain(OllamaEndpoints.version), "Ollama: the API version served", TAG, {JSON: s.OLLAMA_VERSION}, ERRORS, head=True),
    Route("GET", "/api/tags", as_caller(OllamaEndpoints.tags), "Ollama: the models", TAG, {JSON: s.OLLAMA_TAGS}, ERRORS, head=True),
    Route("GET", "/api/ps", as_caller(OllamaEndpoints.ps), "Ollama: the models in memory", TAG, {JSON: s.OLLAMA_PS}, ERRORS),
    Route("POST", "/api/show", with_body(OllamaEndpoints.show), "Ollama: a model's details", TAG, {JSON: s.OLLAMA_SHOW}, ERRORS, o.ShowRequest),
    Route("POST", "/api/chat", with_body(OllamaEndpoints.chat), "Ollama: chat", TAG, s.lines(s.OLLAMA_REPLY), ERRORS, o.ChatRequest),
    Route("POST", "/api/generate", with_body(OllamaEndpoints.generate), "Ollama: generate (raw, context, suffix)", TAG, s.lines(s.OLLAMA_REPLY), ERRORS, o.GenerateRequest),
    Route("POST", "/api/embed", with_body(OllamaEndpoints.embed), "Ollama: embeddings", TAG, {JSON: s.OLLAMA_EMBED}, ERRORS, o.EmbedRequest),
    Route("POST", "/api/embeddings", with_body(OllamaEndpoints.embeddings), "Ollama: one embedding (the older route)", TAG, {JSON: s.OLLAMA_EMBEDDING}, ERRORS, o.EmbeddingsRequest),
    Route("POST", "/api/pull", with_body(OllamaEndpoints.pull), "Ollama: download a hub repo", TAG, s.lines(s.OLLAMA_PROGRESS), ERRORS, o.PullRequest, admin=True),
    Route("POST", "/api/copy", with_body(OllamaEndpoints.copy), "Ollama: a new name for a model", TAG, {JSON: s.OBJECT}, ERRORS, o.CopyRequest, admin=True),
    Route("POST", "/api/create", with_body(OllamaEndpoints.create), "Ollama: a named model over another", TAG, s.lines(s.OLLAMA_PROGRESS), ERRORS, o.CreateRequest, admin=True),
    Route("DELETE", "/api/delete", with_body(OllamaEndpoints.delete), "Ollama: delete a model or a name", TAG, {JSON: s.OBJECT}, ERRORS, o.DeleteRequest, admin=True),
)  # fmt: skip
