"""The audio routes (OpenAI's): speech to text, and text to speech."""

from __future__ import annotations

from mlxserve.api.audio.speech import SpeechBody, SpeechEndpoints
from mlxserve.api.audio.transcriptions import TranscriptionEndpoints
from mlxserve.api.openai.errors import ERRORS
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON, SSE, TEXT
from mlxserve.api.table import Route, upload, with_body
from mlxserve.audio.codec import OUTPUT_FORMATS

TRANSCRIPTION_FORM = s.obj(
    {"file": s.binary("application/octet-stream"), "model": s.STRING},
    {
        "language": s.STRING,
        "prompt": s.STRING,
        "response_format": {"enum": ["json", "text", "srt", "verbose_json", "vtt"]},
        "temperature": s.NUMBER,
        "timestamp_granularities[]": s.array({"enum": ["word", "segment"]}),
        "stream": s.BOOLEAN,
    },
)
TRANSCRIBED = {JSON: s.TRANSCRIPTION, TEXT: s.STRING, SSE: s.SSE_EVENT}
SPOKEN = {
    **{f.content_type: s.binary(f.content_type) for f in OUTPUT_FORMATS.values()},
    SSE: s.SSE_EVENT,
}
AUDIO_UPLOAD = upload(lambda config: config.max_audio_bytes)

TRANSCRIPTION_ROUTES: tuple[Route[TranscriptionEndpoints], ...] = (
    Route("POST", "/v1/audio/transcriptions", with_body(TranscriptionEndpoints.transcriptions), "Speech to text", "audio", TRANSCRIBED, ERRORS, TRANSCRIPTION_FORM, body_limit=AUDIO_UPLOAD),
    Route("POST", "/v1/audio/translations", with_body(TranscriptionEndpoints.translations), "Speech to English text", "audio", TRANSCRIBED, ERRORS, TRANSCRIPTION_FORM, body_limit=AUDIO_UPLOAD),
)  # fmt: skip

SPEECH_ROUTES: tuple[Route[SpeechEndpoints], ...] = (
    Route("POST", "/v1/audio/speech", with_body(SpeechEndpoints.speech), "Text to speech", "audio", SPOKEN, ERRORS, SpeechBody),
)  # fmt: skip
