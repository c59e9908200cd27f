"""POST /v1/rerank (also /rerank and /v2/rerank), in the shape Cohere, Jina and vLLM
share, and POST /v1/score in vLLM's. Errors go out in OpenAI's shape, as vLLM's do."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, field_validator

from mlxserve.api.responder import Responder
from mlxserve.api.wire import Strict, parse
from mlxserve.protocol.errors import bad_request
from mlxserve.rerank.service import RerankRequest, Scores
from mlxserve.service.chat import ChatService

MAX_DOCUMENTS = 1000  # Cohere's limit per request
Text = Annotated[str, Field(min_length=1)]


class TextDocument(Strict):
    text: str


class RerankBody(Strict):
    model: str | None = None
    query: Text
    documents: list[Text | TextDocument]
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = True
    instruction: str | None = None  # decoder rerankers' task line (Qwen3-Reranker)

    @field_validator("documents")
    @classmethod
    def _some(cls, value):
        if not 1 <= len(value) <= MAX_DOCUMENTS:
            raise ValueError(f"must hold 1 to {MAX_DOCUMENTS} documents")
        return value

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class ScoreBody(Strict):
    model: str | None = None
    text_1: Text | list[Text]
    text_2: Text | list[Text]
    instruction: str | None = None

    def pairs(self) -> tuple[list[str], list[str]]:
        """vLLM's pairing: one text against many, or two lists item by item."""
        first = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        second = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if not first or not second:
            raise bad_request("text_1 and text_2 must not be empty lists.", "text_2")
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise bad_request(
                f"text_1 has {len(first)} texts and text_2 {len(second)}: give one text_1, "
                "or as many as text_2.",
                "text_2",
            )
        if len(second) > MAX_DOCUMENTS:
            raise bad_request(f"At most {MAX_DOCUMENTS} pairs may be scored at once.", "text_2")
        return first, second


@dataclass
class RerankEndpoints:
    service: ChatService

    def rerank(self, raw: bytes, responder: Responder) -> dict:
        wire = parse(RerankBody, raw)
        texts = wire.texts()
        request = RerankRequest(
            wire.model, (wire.query,) * len(texts), tuple(texts), wire.instruction
        )
        name, result = self._score(request, responder)
        order = sorted(range(len(texts)), key=lambda i: (-float(result.scores[i]), i))
        results = [
            {"index": i, "relevance_score": float(result.scores[i])}
            | ({"document": {"text": texts[i]}} if wire.return_documents else {})
            for i in order[: wire.top_n]
        ]
        return {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": name,
            "results": results,
            "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        }

    def score(self, raw: bytes, responder: Responder) -> dict:
        wire = parse(ScoreBody, raw)
        first, second = wire.pairs()
        request = RerankRequest(wire.model, tuple(first), tuple(second), wire.instruction)
        name, result = self._score(request, responder)
        return {
            "id": f"score-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": name,
            "data": [
                {"index": i, "object": "score", "score": float(value)}
                for i, value in enumerate(result.scores)
            ],
            "usage": {
                "prompt_tokens": result.tokens,
                "total_tokens": result.tokens,
                "completion_tokens": 0,
            },
        }

    def _score(self, request: RerankRequest, responder: Responder) -> tuple[str, Scores]:
        service = self.service
        spec = service.models.resolve_kind(
            request.model, responder.context, "rerank", "it does not rerank", "model_not_reranker"
        )
        name = request.model or service.models.name(spec)
        result = service.media.score(spec, request, responder.client_gone)
        if (record := responder.context.record) is not None:
            record.add_usage(result.tokens, 0, 0)
        return name, result
