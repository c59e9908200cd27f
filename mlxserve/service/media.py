"""The work of the models that do not chat (speech to text, text to speech, reranking,
images), as the edge asks for it: each runs in pieces on the generation thread between
the chat streams' steps (engine/loop/sharing.py). With ChatService and ServedModels, the
edge's one door into the core."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from mlxserve.audio import service as audio
from mlxserve.audio.speech import SpeechRequest
from mlxserve.audio.transcription import TranscriptionOptions, Window
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.images.render import ImageJob
from mlxserve.images.service import Rendered, Renders
from mlxserve.models.spec import ModelSpec
from mlxserve.rerank.service import RerankRequest, Scores, score

Gone = Callable[[], bool]  # whether the client left (the work stops)


@dataclass
class Media:
    worker: GenerationWorker
    prefill_chunk: int  # the most padded tokens a rerank batch scores at once
    _renders: Renders = field(init=False)  # one image request renders at a time

    def __post_init__(self) -> None:
        self._renders = Renders(self.worker)

    def transcribe(
        self, spec: ModelSpec, samples: np.ndarray, options: TranscriptionOptions, gone: Gone
    ) -> Iterator[Window]:
        """The audio's windows, in order, each computed when the one before it is taken."""
        return audio.transcribe(self.worker, spec, samples, options, gone)

    def synthesize(
        self, spec: ModelSpec, request: SpeechRequest, gone: Gone
    ) -> tuple[int, Iterator[np.ndarray]]:
        """The model's sample rate, and its audio a part at a time."""
        return audio.synthesize(self.worker, spec, request, gone)

    def score(self, spec: ModelSpec, request: RerankRequest, gone: Gone) -> Scores:
        return score(self.worker, spec, request, self.prefill_chunk, gone)

    def render(self, spec: ModelSpec, jobs: list[ImageJob], gone: Gone) -> Iterator[Rendered]:
        """Each job's partial images and image, in order, once it is this request's turn."""
        return self._renders.render(spec, jobs, gone)
