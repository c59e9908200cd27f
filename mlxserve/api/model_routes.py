"""GET /v1/models and /v1/models/{model}: the one route two dialects share. OpenAI's list
and entries, or Anthropic's where the request carries anthropic-version (its errors too)."""

from __future__ import annotations

from mlxserve.api.anthropic.errors import ERRORS as ANTHROPIC_ERRORS
from mlxserve.api.anthropic.models import model_info, model_page, speaks_anthropic
from mlxserve.api.errors import Errors
from mlxserve.api.openai.endpoints import OpenAIEndpoints
from mlxserve.api.openai.errors import ERRORS
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON
from mlxserve.api.table import Call, Route

MODEL_ERRORS = Errors(ERRORS.shape, (speaks_anthropic, ANTHROPIC_ERRORS.shape))
ANTHROPIC_VERSION = {"anthropic-version": s.STRING}
ANTHROPIC_PAGE = {
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    "after_id": s.STRING,
    "before_id": s.STRING,
    "lifecycle[]": s.array({"enum": ["active", "deprecated", "retired"]}),
}


def models(endpoints: OpenAIEndpoints, call: Call) -> dict:
    if speaks_anthropic(call.headers):
        return model_page(endpoints.service.models.entries(call.context.caller), call.query)
    return endpoints.models(call.context.caller)


def model(endpoints: OpenAIEndpoints, call: Call) -> dict:
    entry = endpoints.model(call.params["model"], call.context)
    return model_info(entry) if speaks_anthropic(call.headers) else entry


ROUTES: tuple[Route[OpenAIEndpoints], ...] = (
    Route("GET", "/v1/models", models, "The servable models and adapters (a page of Anthropic's list with anthropic-version)", "models", {JSON: s.either(s.MODEL_LIST, s.ANTHROPIC_MODEL_LIST)}, MODEL_ERRORS, query=ANTHROPIC_PAGE, headers=ANTHROPIC_VERSION),
    Route("GET", "/v1/models/{model:path}", model, "One model (Anthropic's shape with anthropic-version)", "models", {JSON: s.either(s.ref("Model"), s.ref("AnthropicModel"))}, MODEL_ERRORS, headers=ANTHROPIC_VERSION),
)  # fmt: skip
