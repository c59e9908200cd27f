"""Neutral rerank requests -> one relevance score per document, computed on the
generation thread a bounded batch of pairs at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from mlxserve.engine.loop.sharing import EMBED_BATCH, batches, shared_call
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import bad_request
from mlxserve.rerank.model import CrossEncoder, Pair, Reranker


@dataclass(frozen=True)
class RerankRequest:
    """Pairs to score: `queries[i]` with `documents[i]`."""

    model: str | None
    queries: tuple[str, ...]
    documents: tuple[str, ...]
    instruction: str | None = None  # decoder rerankers' task line; None: their default


@dataclass(frozen=True)
class Scores:
    scores: np.ndarray  # float32, one per document, in the request's order
    tokens: int  # the tokens of every pair read


def score(
    worker: GenerationWorker,
    spec: ModelSpec,
    request: RerankRequest,
    chunk: int,
    client_gone: Callable[[], bool],
) -> Scores:
    """Every document's score: the pairs tokenized once on the generation thread's model,
    then scored in batches of at most `chunk` padded tokens (see embeddings.batches)."""
    pairs: list[Pair] = shared_call(
        worker, partial(worker.run_with, spec, partial(_pairs, request)), client_gone
    )
    scores = np.zeros(len(pairs), dtype=np.float32)
    ids = [p.input_ids for p in pairs]
    for batch in batches(ids, chunk, EMBED_BATCH):
        scoring = partial(_score, [pairs[i] for i in batch])
        computed = shared_call(worker, partial(worker.run_with, spec, scoring), client_gone)
        scores[batch] = computed
    return Scores(scores, sum(map(len, ids)))


def _pairs(request: RerankRequest, model: Reranker) -> list[Pair]:
    queries, documents = list(request.queries), list(request.documents)
    if isinstance(model, CrossEncoder):
        if request.instruction is not None:
            raise bad_request(
                "This reranker is a cross-encoder: it takes no instruction.", "instruction"
            )
        return model.pairs(queries, documents)
    return model.pairs(queries, documents, request.instruction)


def _score(pairs: list[Pair], model: Reranker) -> np.ndarray:
    return model.score(pairs)
