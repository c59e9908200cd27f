"""Neutral embedding requests -> vectors: inputs tokenized and checked against the model's
limit, embedded on the generation thread in bounded pieces, cut to `dimensions`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from mlxserve.chat.templates import check_token_ids
from mlxserve.engine.loop.sharing import EMBED_BATCH, batches, shared_call
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.models.embedding import EmbeddingModel, PartialEmbedding
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import EmbeddingRequest

# Tokens kept beyond those a truncation asks for when a text is first cut by characters:
# the cut may tokenize differently near where it falls, never this far from it.
CUT_MARGIN = 16


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # float32, one row per input
    prompt_tokens: int


def cut_for_truncation(request: EmbeddingRequest, limit: int, longest: int) -> EmbeddingRequest:
    """With truncation asked for, each text cut to its last characters that could hold the
    tokens it keeps (no text of n * `longest` characters is fewer than n tokens): a
    megabyte is truncated, not refused by the size guard before it is tokenized, and
    never tokenized whole. Asking to keep more than `limit` keeps enough to be refused."""
    keep = request.keep_last_tokens
    if keep is None:
        return request
    wanted = limit if keep == -1 else min(keep, limit + 1)
    chars = (wanted + CUT_MARGIN) * longest
    inputs = tuple(
        given[-chars:] if isinstance(given, str) and len(given) > chars else given
        for given in request.inputs
    )
    return replace(request, inputs=inputs)


def tokenized(request: EmbeddingRequest, tokenizer, limit: int | None) -> list[list[int]]:
    """Each input as token ids, within the model's limit (or cut to it when asked)."""
    out = []
    for i, given in enumerate(request.inputs):
        param = f"{request.inputs_param}[{i}]" if len(request.inputs) > 1 else request.inputs_param
        if isinstance(given, str):
            ids = tokenizer.encode(given)
        else:
            ids = list(given)
            check_token_ids(tokenizer, ids, param)
        if not ids:
            raise bad_request("An input must not be empty.", param)
        keep = request.keep_last_tokens
        if keep is not None:
            ids = ids[-(limit if keep == -1 and limit else keep) :]
        if limit is not None and len(ids) > limit:
            raise bad_request(
                f"This input is {len(ids)} tokens, more than the model's limit of {limit}; "
                "shorten it, or set truncate_prompt_tokens to keep its last tokens.",
                param,
                code="context_length_exceeded",
            )
        out.append(ids)
    return out


def embed(
    worker: GenerationWorker,
    spec: ModelSpec,
    inputs: list[list[int]],
    chunk: int,
    client_gone: Callable[[], bool],
) -> np.ndarray:
    """The inputs' vectors, a bounded piece of work per call on the generation thread
    (see sharing.py): a batch of short inputs (see `batches`), or a `chunk` of a long one
    where the model takes an input in parts."""

    def piece(fn):
        return shared_call(worker, fn, client_gone)

    in_parts = worker.call(partial(worker.run_with, spec, _takes_parts))
    long = {i for i, ids in enumerate(inputs) if in_parts and len(ids) > chunk}
    short = [i for i in range(len(inputs)) if i not in long]
    vectors: list[np.ndarray] = [np.empty(0)] * len(inputs)  # each filled below
    for batch in batches([inputs[i] for i in short], chunk, EMBED_BATCH):
        batched = [inputs[short[j]] for j in batch]
        computed = piece(partial(worker.run_with, spec, partial(_embed, batched)))
        for row, j in enumerate(batch):
            vectors[short[j]] = computed[row]
    for i in sorted(long):
        part = None
        for start in range(0, len(inputs[i]), chunk):
            last = start + chunk >= len(inputs[i])
            ids = inputs[i][start:][:chunk]
            part = piece(partial(worker.run_with, spec, partial(_embed_part, part, ids, last)))
        assert part is not None  # a long input has parts
        vectors[i] = part.vector
    return np.stack(vectors)


# What runs on the generation thread, given the resident embedding model (models/embedding.py).


def _takes_parts(model: EmbeddingModel) -> bool:
    """Whether the model takes one input a part at a time."""
    return bool(model.in_parts)


def _embed(inputs: list[list[int]], model: EmbeddingModel) -> np.ndarray:
    """One batch of inputs in one forward pass, float32."""
    return np.array(model.embed(inputs))


def _embed_part(
    part: PartialEmbedding | None, ids: list[int], last: bool, model: EmbeddingModel
) -> PartialEmbedding:
    """The next part of one long input; after the last, the part holds its vector."""
    part = model.embed_part(part, ids)
    if last:
        part.vector = np.array(model.finish(part))[0]
    return part


def shortened(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first `dimensions` of each vector, renormalised (Matryoshka models are trained
    for this); a `dimensions` beyond the model's is a 400."""
    if dimensions is None:
        return vectors
    if dimensions > vectors.shape[1]:
        raise bad_request(
            f"dimensions must be at most {vectors.shape[1]} for this model.", "dimensions"
        )
    cut = vectors[:, :dimensions]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)
