"""Anthropic's routes: Messages and count_tokens."""

from __future__ import annotations

from mlxserve.api.anthropic.endpoints import AnthropicEndpoints
from mlxserve.api.anthropic.errors import ERRORS
from mlxserve.api.anthropic.requests import CountTokensRequest, MessagesRequest
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON
from mlxserve.api.table import Route, with_body

ROUTES: tuple[Route[AnthropicEndpoints], ...] = (
    Route("POST", "/v1/messages", with_body(AnthropicEndpoints.messages), "Messages", "anthropic", s.stream(s.MESSAGE), ERRORS, MessagesRequest),
    Route("POST", "/v1/messages/count_tokens", with_body(AnthropicEndpoints.count_tokens), "Count a Messages request's input tokens", "anthropic", {JSON: s.TOKEN_COUNT}, ERRORS, CountTokensRequest),
)  # fmt: skip
