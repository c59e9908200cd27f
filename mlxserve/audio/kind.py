"""The audio kinds: transcription (Whisper) and speech (mlx-audio's text-to-speech), served
by /v1/audio/*. Their models bring their own tokenizers."""

from __future__ import annotations

from mlxserve.audio.speech import Synthesizer
from mlxserve.audio.transcription import Transcriber
from mlxserve.models.capabilities import is_speech_model, is_transcription_model
from mlxserve.models.kinds import LoadRequest, ModelKind


def _transcriber(request: LoadRequest) -> Transcriber:
    return Transcriber.load(request.path)


def _synthesizer(request: LoadRequest) -> Synthesizer:
    return Synthesizer.load(request.path)


TRANSCRIPTION = ModelKind(
    "transcription",
    is_transcription_model,
    order=300,
    load=_transcriber,
    tokenizer=False,
    endpoint="/v1/audio/transcriptions",
)
SPEECH = ModelKind(
    "speech",
    is_speech_model,
    order=400,
    load=_synthesizer,
    tokenizer=False,
    endpoint="/v1/audio/speech",
)
