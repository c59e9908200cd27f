"""POST /v1/audio/transcriptions and /v1/audio/translations in OpenAI's shape: a
multipart form in; json, text, srt, vtt or verbose_json out, or a stream of
transcript.text.delta events."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from mlxserve.api.multipart import Form, parse_form
from mlxserve.api.openai.errors import error_body
from mlxserve.api.responder import RawReply, Responder
from mlxserve.api.sse import SSEWriter, stream_failure
from mlxserve.audio.codec import decode
from mlxserve.audio.transcription import (
    SAMPLE_RATE,
    Segment,
    TranscriptionOptions,
    Window,
    language_code,
    language_name,
)
from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request
from mlxserve.service.chat import ChatService
from mlxserve.telemetry.record import Metered, RequestRecord

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
STREAMED_FORMATS = ("json", "text")  # a stream carries text; timings need the whole


@dataclass(frozen=True)
class TranscriptionForm:
    model: str | None
    audio: bytes
    options: TranscriptionOptions
    response_format: str
    stream: bool


def read_form(form: Form, task: str, max_bytes: int) -> TranscriptionForm:
    audio = form.files.get("file")
    if audio is None:
        raise bad_request("Send the audio as a file in the form field 'file'.", "file")
    if len(audio) > max_bytes:
        raise ServiceError(
            ErrorKind.TOO_LARGE,
            f"The audio file is {len(audio)} bytes, more than this server's limit of "
            f"{max_bytes} (--max-audio-bytes).",
            "file",
            "file_too_large",
        )
    response_format = form.text("response_format") or "json"
    if response_format not in FORMATS:
        raise bad_request(
            f"response_format must be one of {', '.join(FORMATS)}.", "response_format"
        )
    granularities = [
        *form.fields.get("timestamp_granularities[]", []),
        *form.fields.get("timestamp_granularities", []),
    ]
    if unknown := set(granularities) - {"word", "segment"}:
        raise bad_request(
            f"Unknown timestamp granularity {sorted(unknown)[0]!r}: word or segment.",
            "timestamp_granularities",
        )
    stream = _flag(form.text("stream"), "stream")
    if stream and response_format not in STREAMED_FORMATS:
        raise bad_request(
            f"A streamed transcription is json or text, not {response_format}.", "stream"
        )
    options = TranscriptionOptions(
        task=task,
        language=language_code(form.text("language")) if task == "transcribe" else None,
        prompt=form.text("prompt") or None,
        temperature=_temperature(form.text("temperature")),
        words="word" in granularities and response_format == "verbose_json",
    )
    return TranscriptionForm(form.text("model"), audio, options, response_format, stream)


def _flag(value: str | None, name: str) -> bool:
    if value is None or value.lower() in ("false", "0", ""):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise bad_request(f"{name} must be true or false.", name)


def _temperature(value: str | None) -> float:
    if value is None or value == "":
        return 0.0
    try:
        temperature = float(value)
    except ValueError:
        temperature = math.nan
    if not 0.0 <= temperature <= 1.0:
        raise bad_request("temperature must be a number from 0 to 1.", "temperature")
    return temperature


@dataclass
class TranscriptionEndpoints:
    service: ChatService

    def transcriptions(self, raw: bytes, responder: Responder) -> dict | RawReply | None:
        return self._answer(raw, responder, "transcribe")

    def translations(self, raw: bytes, responder: Responder) -> dict | RawReply | None:
        return self._answer(raw, responder, "translate")

    def _answer(self, raw: bytes, responder: Responder, task: str) -> dict | RawReply | None:
        service = self.service
        form = read_form(
            parse_form(responder.header("Content-Type"), raw), task, service.config.max_audio_bytes
        )
        spec = service.models.resolve_kind(
            form.model,
            responder.context,
            "transcription",
            "it does not transcribe speech",
            "model_not_transcription",
        )
        audio = decode(form.audio, SAMPLE_RATE)
        seconds = len(audio) / SAMPLE_RATE
        windows = _counted(
            service.media.transcribe(spec, audio, form.options, responder.client_gone),
            seconds,
            responder.context.record,
        )
        if form.stream:
            _stream(responder, windows, seconds)
            return None
        return _reply(form, list(windows), seconds)


def _counted(
    windows: Iterator[Window], seconds: float, record: RequestRecord | None
) -> Iterator[Window]:
    """The windows, each one's transcript tokens counted in the request's record (the
    access log and metrics: as completion tokens), and the audio's `seconds` once the
    last is out."""
    for window in windows:
        if record is not None:
            record.add_usage(0, 0, sum(len(s.tokens) for s in window.segments))
        yield window
    if record is not None:
        record.meter(Metered(audio_seconds=seconds))


def _usage(seconds: float) -> dict:
    return {"type": "duration", "seconds": math.ceil(seconds)}


def _stream(responder: Responder, windows, seconds: float) -> None:
    sse = SSEWriter(responder)
    text = ""
    try:
        for window in windows:
            for segment in window.segments:
                text += segment.text
                sse.event(
                    {"type": "transcript.text.delta", "delta": segment.text, "logprobs": None}
                )
        sse.event({"type": "transcript.text.done", "text": text.strip(), "usage": _usage(seconds)})
        sse.close()
    except Exception as e:
        sse.event(error_body(stream_failure(sse, e)))
        sse.close()


def _reply(form: TranscriptionForm, windows: list[Window], seconds: float) -> dict | RawReply:
    segments = [s for w in windows for s in w.segments]
    text = "".join(s.text for s in segments).strip()
    fmt = form.response_format
    if fmt == "json":
        return {"text": text, "usage": _usage(seconds)}
    if fmt == "text":
        return RawReply("text/plain; charset=utf-8", (text + "\n").encode())
    if fmt in ("srt", "vtt"):
        return RawReply("text/plain; charset=utf-8", _subtitles(segments, fmt).encode())
    language = windows[0].language if windows else (form.options.language or "en")
    reply: dict = {
        "task": form.options.task,
        "language": language_name(language) if form.options.task == "transcribe" else "english",
        "duration": round(seconds, 2),
        "text": text,
        "segments": [_segment_json(i, s) for i, s in enumerate(segments)],
        "usage": _usage(seconds),
    }
    if form.options.words:
        reply["words"] = [
            {"word": w.word.strip(), "start": w.start, "end": w.end}
            for s in segments
            for w in s.words
        ]
    return reply


def _segment_json(index: int, segment: Segment) -> dict:
    return {
        "id": index,
        "seek": int(segment.start * 100),
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }


def _subtitles(segments: list[Segment], fmt: str) -> str:
    """SubRip (numbered cues, a comma before milliseconds) or WebVTT (a header, a dot)."""
    mark = "," if fmt == "srt" else "."
    cues = []
    for i, segment in enumerate(segments, 1):
        timing = f"{_clock(segment.start, mark)} --> {_clock(segment.end, mark)}"
        number = f"{i}\n" if fmt == "srt" else ""
        cues.append(f"{number}{timing}\n{segment.text.strip()}\n")
    body = "\n".join(cues)
    return f"WEBVTT\n\n{body}" if fmt == "vtt" else body


def _clock(seconds: float, mark: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{mark}{millis:03d}"
