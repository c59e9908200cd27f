"""POST /v1/audio/speech in OpenAI's shape: the whole file, or its bytes as they are
synthesised (stream_format "audio"), or speech.audio.delta events (stream_format
"sse")."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from mlxserve.api.openai.errors import error_body
from mlxserve.api.responder import RawReply, Responder
from mlxserve.api.sse import SSEWriter, stream_failure
from mlxserve.api.wire import Strict, parse
from mlxserve.audio.codec import OUTPUT_FORMATS, encode
from mlxserve.audio.speech import SpeechRequest
from mlxserve.protocol.errors import ClientGone, bad_request
from mlxserve.service.chat import ChatService
from mlxserve.service.context import RequestContext
from mlxserve.telemetry.record import Metered

MAX_INPUT_CHARS = 4096  # OpenAI's limit


class SpeechBody(Strict):
    model: str | None = None
    input: Annotated[str, Field(min_length=1, max_length=MAX_INPUT_CHARS)]
    voice: Annotated[str, Field(min_length=1)]
    instructions: str | None = None  # OpenAI's gpt-4o-mini-tts only: not used here
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Annotated[float, Field(ge=0.25, le=4.0)] = 1.0
    stream_format: Literal["audio", "sse"] | None = None


@dataclass
class SpeechEndpoints:
    service: ChatService

    def speech(self, raw: bytes, responder: Responder) -> RawReply | None:
        wire = parse(SpeechBody, raw)
        service = self.service
        spec = service.models.resolve_kind(
            wire.model,
            responder.context,
            "speech",
            "it does not synthesise speech",
            "model_not_speech",
        )
        if not wire.input.strip():
            raise bad_request("input must hold text to speak.", "input")
        request = SpeechRequest(wire.model, wire.input.strip(), wire.voice, wire.speed)
        rate, audio = service.media.synthesize(spec, request, responder.client_gone)
        encoded = encode(_metered(audio, rate, responder.context), rate, wire.response_format)
        fmt = OUTPUT_FORMATS[wire.response_format]
        if wire.stream_format == "sse":
            _events(responder, encoded)
        elif wire.stream_format == "audio":
            _chunks(responder, encoded, fmt.content_type)
        else:
            return RawReply(fmt.content_type, b"".join(encoded))
        return None


def _metered(
    parts: Iterator[np.ndarray], rate: int, context: RequestContext
) -> Iterator[np.ndarray]:
    """The audio's parts, its seconds charged to the request after the last."""
    samples = 0
    for part in parts:
        samples += len(part)
        yield part
    context.meter(Metered(audio_seconds=samples / rate))


def _chunks(responder: Responder, encoded, content_type: str) -> None:
    """The file's bytes as chunks of a chunked reply, each as soon as it is encoded. A
    failure once the audio has begun can only cut the reply short."""
    first = next(encoded)  # the first part's failures are still an HTTP error
    body = responder.open_stream(content_type)
    try:
        for data in itertools.chain([first], encoded):
            if data:
                body.write(b"%x\r\n%s\r\n" % (len(data), data))
                body.flush()
        body.write(b"0\r\n\r\n")
        body.flush()
    except OSError as e:
        raise ClientGone from e


def _events(responder: Responder, encoded) -> None:
    sse = SSEWriter(responder)
    try:
        for data in encoded:
            if data:
                audio = base64.b64encode(data).decode()
                sse.event({"type": "speech.audio.delta", "audio": audio})
        sse.event({"type": "speech.audio.done", "usage": None})
        sse.close()
    except Exception as e:
        sse.event(error_body(stream_failure(sse, e)))
        sse.close()
