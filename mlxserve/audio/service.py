"""Audio work on the generation thread, a bounded piece at a time (see
engine/loop/sharing.py): a transcription's forward passes, a synthesis's parts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np

from mlxserve.audio.speech import SpeechRequest, Synthesizer
from mlxserve.audio.transcription import (
    SAMPLE_RATE,
    SteppedWindow,
    Transcriber,
    TranscriptionOptions,
    Window,
)
from mlxserve.engine.generation.sampling import reseed_random
from mlxserve.engine.loop.sharing import shared_call
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import bad_request

SPEECH_SEED = 0


def transcribe(
    worker: GenerationWorker,
    spec: ModelSpec,
    audio: np.ndarray,
    options: TranscriptionOptions,
    client_gone: Callable[[], bool],
) -> Iterator[Window]:
    """The audio's windows, in order, each computed when the one before it is taken."""
    if options.language not in (None, "en"):
        multilingual = shared_call(
            worker, partial(worker.run_with, spec, lambda m: m.multilingual), client_gone
        )
        if not multilingual:
            raise bad_request("This model transcribes English only.", "language")
    start, previous = 0, ""
    while start < len(audio):
        begin = partial(_begin, audio, start, options, previous)
        stepped = shared_call(worker, partial(worker.run_with, spec, begin), client_gone)
        window = None
        try:
            while window is None:
                window = shared_call(worker, stepped.step, client_gone)
        finally:
            if window is None:  # the client left mid-window
                worker.call(stepped.close)
        yield window
        previous += window.text
        start = max(window.end, start + SAMPLE_RATE)  # always onwards


def _begin(audio, start, options, previous, model: Transcriber) -> SteppedWindow:
    return SteppedWindow(model, audio, start, options, previous)


def _next_part(parts: Iterator[Any]) -> np.ndarray | None:
    """The next part of the audio. Vocoders draw noise (KittenTTS's and Kokoro's harmonic
    source): it is drawn from a fixed seed, so that the same text gives the same audio;
    the random state the chat streams sample from is reseeded afterwards."""
    import mlx.core as mx

    mx.random.seed(SPEECH_SEED)
    try:
        part = next(parts, None)
        return None if part is None else np.array(part.audio, dtype=np.float32).reshape(-1)
    finally:
        reseed_random()


def synthesize(
    worker: GenerationWorker,
    spec: ModelSpec,
    request: SpeechRequest,
    client_gone: Callable[[], bool],
) -> tuple[int, Iterator[np.ndarray]]:
    """The model's sample rate, and its audio a part at a time (each computed when the one
    before is taken). An unknown voice is a 400 before any audio."""

    def begin(model: Synthesizer) -> tuple[int, Iterator[Any]]:
        return model.sample_rate, model.parts(request)

    rate, parts = shared_call(worker, partial(worker.run_with, spec, begin), client_gone)

    def audio() -> Iterator[np.ndarray]:
        while True:
            samples = shared_call(worker, partial(_next_part, parts), client_gone)
            if samples is None:
                return
            yield samples

    return rate, audio()
