"""OpenAI's routes: Chat Completions, Completions, embeddings, loading models and
adapters, tokens and health (the model list is both OpenAI's and Anthropic's:
api/model_routes.py)."""

from __future__ import annotations

from mlxserve.api.openai.embeddings import EmbeddingEndpoints, EmbeddingsRequest
from mlxserve.api.openai.endpoints import OpenAIEndpoints
from mlxserve.api.openai.errors import ERRORS
from mlxserve.api.openai.requests import (
    AdapterLoad,
    AdapterUnload,
    ChatRequest,
    CompletionRequest,
    ModelRequest,
    PinRequest,
)
from mlxserve.api.openai.tokenize import Detokenize, TokenizeEndpoints, TokenizeText
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON
from mlxserve.api.responder import RawReply, json_reply
from mlxserve.api.table import Call, Route, with_body


def health(endpoints: OpenAIEndpoints, call: Call) -> RawReply:
    return json_reply(*endpoints.health())


def _admin(path: str, summary: str, reply: s.Schema, endpoint, body) -> Route[OpenAIEndpoints]:
    return Route(
        "POST", path, with_body(endpoint), summary, "admin", {JSON: reply}, ERRORS, body, admin=True
    )


ROUTES: tuple[Route[OpenAIEndpoints], ...] = (
    Route("POST", "/v1/chat/completions", with_body(OpenAIEndpoints.chat), "Chat", "openai", s.stream(s.CHAT_COMPLETION), ERRORS, ChatRequest),
    Route("POST", "/v1/completions", with_body(OpenAIEndpoints.completion), "Text completion (fill in the middle with suffix)", "openai", s.stream(s.TEXT_COMPLETION), ERRORS, CompletionRequest),
    _admin("/v1/models/load", "Load a model or adapter now", s.MODEL_STATE, OpenAIEndpoints.load_model, ModelRequest),
    _admin("/v1/models/unload", "Unload a model or adapter now", s.MODEL_STATE, OpenAIEndpoints.unload_model, ModelRequest),
    _admin("/v1/models/pin", "Keep a model resident, or let it go", s.MODEL_STATE, OpenAIEndpoints.pin_model, PinRequest),
    _admin("/v1/adapters/load", "Serve an adapter folder", s.ref("Model"), OpenAIEndpoints.load_adapter, AdapterLoad),
    _admin("/v1/adapters/unload", "Stop serving an adapter", s.DELETED_MODEL, OpenAIEndpoints.unload_adapter, AdapterUnload),
    Route("GET", "/health", health, "Ready to serve (no key needed)", "server", {JSON: s.HEALTH}, ERRORS, keyless=True, also=("/v1/health",)),
)  # fmt: skip

EMBEDDING_ROUTES: tuple[Route[EmbeddingEndpoints], ...] = (
    Route("POST", "/v1/embeddings", with_body(EmbeddingEndpoints.embeddings), "Embeddings", "openai", {JSON: s.EMBEDDINGS}, ERRORS, EmbeddingsRequest),
)  # fmt: skip

TOKEN_ROUTES: tuple[Route[TokenizeEndpoints], ...] = (
    Route("POST", "/tokenize", with_body(TokenizeEndpoints.tokenize), "Tokenize a prompt or a chat (vLLM's shape)", "tokens", {JSON: s.TOKENIZED}, ERRORS, (TokenizeText, ChatRequest), also=("/v1/tokenize",)),
    Route("POST", "/detokenize", with_body(TokenizeEndpoints.detokenize), "Token ids to text", "tokens", {JSON: s.DETOKENIZED}, ERRORS, Detokenize, also=("/v1/detokenize",)),
)  # fmt: skip
