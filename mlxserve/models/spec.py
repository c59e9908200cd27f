"""Which weights to serve: the identity the prompt cache and residency key on, and what
they take on disk."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from mlxserve.models.capabilities import media_modalities, weight_files
from mlxserve.models.kinds import KINDS, ModelKind
from mlxserve.protocol.errors import ServiceError, bad_request

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """Which weights to serve: the identity the prompt cache and residency key on."""

    path: Path
    adapter_path: str | None = None
    draft_path: Path | None = None
    as_text: bool = False  # a vision-language checkpoint served as text (--text-only)

    @property
    def key(self) -> str:
        return f"{self.path}|{self.adapter_path}|{self.draft_path}" + (
            "|text" if self.as_text else ""
        )

    @property
    def model_kind(self) -> ModelKind:
        """What the folder serves (models/kinds.py): a vision checkpoint served as text is
        a chat model."""
        kind = KINDS.of(self.path)
        return KINDS.named("chat") if kind.images and self.as_text else kind

    @property
    def kind(self) -> str:
        """chat, vision, embedding, rerank, transcription, speech: a registered kind."""
        return self.model_kind.name

    @property
    def vision(self) -> bool:
        """Takes images: served by mlx-vlm instead of mlx-lm."""
        return self.model_kind.images

    @property
    def media(self) -> frozenset[str]:
        """The media its prompts take ("image", "video", "audio"): none for a text model."""
        return media_modalities(self.path) if self.vision else frozenset()

    @property
    def generative(self) -> bool:
        """Served by the generation loop's sessions (text out, a token at a time); the
        other kinds run as calls between the loop's steps."""
        return self.model_kind.generative


def stored_bytes(spec: ModelSpec) -> int:
    """What a model's weights take on disk: about what they take in memory once loaded."""
    folders = [spec.path, *([spec.draft_path] if spec.draft_path else [])]
    return sum(f.stat().st_size for folder in folders for f in weight_files(folder))


def load_error(spec: ModelSpec, error: Exception) -> ServiceError:
    log.error("Loading %s failed: %s", spec.path, error)
    return bad_request(
        f"The model at '{spec.path.name}' could not be loaded: {error}",
        param="model",
        code="model_load_failed",
    )
