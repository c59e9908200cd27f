"""The kinds of model the server serves, in one registry: how a folder of each kind is
recognised (from its config.json, no weights read), how it is loaded, and how requests
reach it. A new kind is a new entry, registered by the package that serves it (see
mlxserve/registration.py); models/ imports none of those packages."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxserve.models.capabilities import is_embedding_model, is_vision_model


@dataclass(frozen=True)
class LoadRequest:
    """What a kind's loader is given."""

    path: Path
    tokenizer: Any  # the folder's text tokenizer; None for a kind that reads none
    trust_remote_code: bool


@dataclass(frozen=True)
class ModelKind:
    name: str
    detect: Callable[[Path], bool]
    # Folders are tried against the kinds in this order (lowest first): a sentence
    # transformer is an embedding model even when its network is a chat model's.
    order: int
    # The model from its folder; None: a language model, loaded by the model loader with its
    # draft model, drafting head, adapters and distributed split.
    load: Callable[[LoadRequest], Any] | None = None
    tokenizer: bool = True  # reads a text tokenizer (audio models bring their own)
    # Served by the generation loop's sessions (text out, a token at a time); other kinds
    # run as calls between the loop's steps.
    generative: bool = False
    endpoint: str = "/v1/chat/completions"  # where its requests go
    images: bool = False  # takes images in its prompts


class KindRegistry:
    def __init__(self, fallback: ModelKind, *kinds: ModelKind):
        self.fallback = fallback  # what a folder no other kind claims is
        self._kinds: dict[str, ModelKind] = {fallback.name: fallback}
        for kind in kinds:
            self.register(kind)

    def register(self, kind: ModelKind) -> None:
        """Add a kind (registering one of the same name again replaces it)."""
        self._kinds[kind.name] = kind
        self.of.cache_clear()

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one registry, for the process's life)
    def of(self, path: Path) -> ModelKind:
        """The kind of the model in `path`."""
        claimed = [k for k in self._kinds.values() if k is not self.fallback]
        for kind in sorted(claimed, key=lambda k: k.order):
            if kind.detect(path):
                return kind
        return self.fallback

    def named(self, name: str) -> ModelKind:
        return self._kinds[name]


def _load_embedding_model(request: LoadRequest) -> Any:
    from mlxserve.models.embedding import load_embedding_model

    pad_id = request.tokenizer.pad_token_id or 0
    return load_embedding_model(request.path, pad_id, request.trust_remote_code)


CHAT = ModelKind("chat", lambda path: True, order=1000, generative=True)
VISION = ModelKind("vision", is_vision_model, order=500, generative=True, images=True)
EMBEDDING = ModelKind(
    "embedding",
    is_embedding_model,
    order=100,
    load=_load_embedding_model,
    endpoint="/v1/embeddings",
)
KINDS = KindRegistry(CHAT, VISION, EMBEDDING)
