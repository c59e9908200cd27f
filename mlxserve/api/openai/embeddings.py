"""POST /v1/embeddings in OpenAI's shape (with vLLM's truncate_prompt_tokens)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Annotated, Literal, cast

import numpy as np
from pydantic import Field, field_validator

from mlxserve.api.responder import Responder
from mlxserve.api.wire import Strict, parse
from mlxserve.protocol.request import EmbeddingRequest
from mlxserve.service.chat import ChatService

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]  # OpenAI refuses empty inputs


class EmbeddingsRequest(Strict):
    model: str | None = None
    input: Text | list[Text] | TokenIds | list[TokenIds]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None

    @field_validator("input")
    @classmethod
    def _some(cls, value):
        if isinstance(value, list) and not 1 <= len(value) <= MAX_INPUTS:
            raise ValueError(f"must hold 1 to {MAX_INPUTS} inputs")
        return value

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _not_zero(cls, value):
        if value == 0:
            raise ValueError("must be a number of tokens, or -1 for the model's limit")
        return value

    def neutral(self) -> EmbeddingRequest:
        given = self.input
        single = isinstance(given, str) or (given and isinstance(given[0], int))
        inputs = [given] if single else given
        return EmbeddingRequest(
            model=self.model,
            inputs=tuple(i if isinstance(i, str) else tuple(cast(list[int], i)) for i in inputs),
            dimensions=self.dimensions,
            keep_last_tokens=self.truncate_prompt_tokens,
        )


@dataclass
class EmbeddingEndpoints:
    service: ChatService

    def embeddings(self, raw: bytes, responder: Responder) -> dict:
        wire = parse(EmbeddingsRequest, raw)
        spec, result = self.service.embed(wire.neutral(), responder.context)
        encode = _base64 if wire.encoding_format == "base64" else _floats
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encode(vector)}
                for i, vector in enumerate(result.vectors)
            ],
            "model": wire.model or self.service.models.name(spec),
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        }


def _floats(vector: np.ndarray) -> list[float]:
    return vector.astype(np.float32).tolist()


def _base64(vector: np.ndarray) -> str:
    """OpenAI's base64: the little-endian float32 bytes."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode()
