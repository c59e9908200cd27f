"""The rerank routes: Cohere's and Jina's rerank (and Cohere's v2 path), vLLM's score."""

from __future__ import annotations

from mlxserve.api.openai.errors import ERRORS
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON
from mlxserve.api.rerank.endpoints import RerankBody, RerankEndpoints, ScoreBody
from mlxserve.api.table import Route, with_body

ROUTES: tuple[Route[RerankEndpoints], ...] = (
    Route("POST", "/v1/rerank", with_body(RerankEndpoints.rerank), "Rerank documents (Cohere's and Jina's shape)", "rerank", {JSON: s.RERANKED}, ERRORS, RerankBody),
    Route("POST", "/v2/rerank", with_body(RerankEndpoints.rerank), "Rerank documents (Cohere's v2 path)", "rerank", {JSON: s.RERANKED}, ERRORS, RerankBody),
    Route("POST", "/v1/score", with_body(RerankEndpoints.score), "Score text pairs (vLLM's shape)", "rerank", {JSON: s.SCORED}, ERRORS, ScoreBody),
)  # fmt: skip
