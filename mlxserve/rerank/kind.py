"""The rerank kind: cross-encoders and decoder rerankers, served by POST /v1/rerank."""

from __future__ import annotations

from pathlib import Path

from mlxserve.models.capabilities import is_cross_encoder, is_decoder_reranker
from mlxserve.models.kinds import LoadRequest, ModelKind
from mlxserve.rerank.model import Reranker, load_reranker


def is_reranker(path: Path) -> bool:
    return is_cross_encoder(path) or is_decoder_reranker(path)


def _load(request: LoadRequest) -> Reranker:
    return load_reranker(request.path, request.tokenizer, request.trust_remote_code)


RERANK = ModelKind("rerank", is_reranker, order=200, load=_load, endpoint="/v1/rerank")
