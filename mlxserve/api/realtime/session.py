"""One Realtime session on its WebSocket (the GA protocol, event for event): the
connection's thread reads the client's events and answers each at once; the work they
start (a transcription, a response) runs in order on the session's one work thread, so
the user can talk over a response (barge-in) or cancel it while it is written. Every
mistake is an `error` event naming the event and the field; the socket stays open."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

import numpy as np

from mlxserve.api.openai.errors import error_body
from mlxserve.api.realtime.conversation import Conversation, item_from, new_id
from mlxserve.api.realtime.input_audio import MIN_COMMIT_MS, SAMPLES_PER_MS, InputAudio
from mlxserve.api.realtime.response import ResponsePlan, ResponseRun
from mlxserve.api.realtime.settings import SessionSettings
from mlxserve.api.realtime.speaker import Voice
from mlxserve.api.realtime.wire import RATE, ItemBody, ResponseBody, SessionBody
from mlxserve.api.table import Turn
from mlxserve.api.websocket import ClosedSocket, WebSocket
from mlxserve.api.wire import validate
from mlxserve.audio.codec import pcm16_samples, resample
from mlxserve.audio.transcription import SAMPLE_RATE, TranscriptionOptions
from mlxserve.protocol.errors import ClientGone, ServiceError, bad_request
from mlxserve.service.chat import ChatService
from mlxserve.service.context import RequestContext

log = logging.getLogger(__name__)


class RealtimeSession:
    def __init__(
        self,
        service: ChatService,
        socket_: WebSocket,
        opening: RequestContext,
        turn: Turn,
    ):
        self._service = service
        self._socket = socket_
        self._opening = opening  # the upgrade request's (its key may use the session's model)
        self._turn = turn  # each response and transcription is a request of its own
        self._lock = threading.Lock()  # the conversation, between the two threads
        self._conversation = Conversation()
        self._audio = InputAudio()
        self._work = ThreadPoolExecutor(1, thread_name_prefix="realtime")
        self._active: ResponseRun | None = None  # the response queued or running
        self._speech_item: str | None = None  # the item id the turn being spoken will take
        self._settings: SessionSettings | None = None
        self._handlers: dict[str, Callable[[dict], None]] = {
            "session.update": self._session_update,
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit_event,
            "input_audio_buffer.clear": self._clear,
            "conversation.item.create": self._item_create,
            "conversation.item.retrieve": self._item_retrieve,
            "conversation.item.delete": self._item_delete,
            "conversation.item.truncate": self._item_truncate,
            "response.create": self._response_create,
            "response.cancel": self._response_cancel,
        }

    def serve(self) -> None:
        try:
            self._settings = self._open()
        except ServiceError as e:  # no such model: told, then closed
            self._error(e, None)
            self._socket.close(1008, e.message[:120])
            return
        self._audio.listen(self._turn_settings())
        self._send({"type": "session.created", "session": self._settings.as_json()})
        try:
            for message in self._socket:
                self._message(message)
        finally:
            if self._active is not None:
                self._active.cancel("client_cancelled")
            self._work.shutdown(wait=True)

    def _open(self) -> SessionSettings:
        """The session's chat model (?model=, the served one when absent) and whether the
        server can speak."""
        query = parse_qs(urlsplit(self._socket.path).query)
        named = query.get("model")
        requested = named[0] if named else None
        spec = self._service.models.resolve(requested, self._opening)
        if not spec.generative:  # chat and vision models (an adapter is its base's kind)
            raise bad_request(
                f"The model '{requested}' is a {spec.kind} model; it cannot hold a conversation.",
                "model",
                "model_not_chat",
            )
        name = self._service.models.name(spec)
        return SessionSettings(requested or name, self._served("speech") is not None)

    def _left(self) -> bool:
        """Whether the client has gone, for the work thread: only the connection's thread
        reads the socket (two readers would split its bytes), so this only looks."""
        return self._socket.closed

    def _served(self, kind: str) -> str | None:
        """The session's model of `kind` (transcription, speech): the one the settings
        name, else the first the server lists."""
        config = self._service.config
        named = {
            "transcription": config.realtime_transcription_model,
            "speech": config.realtime_speech_model,
        }[kind]
        if named is not None:
            return named
        return next(
            (name for name, spec in self._service.models.listed().items() if spec.kind == kind),
            None,
        )

    # events in ---------------------------------------------------------------------------

    def _message(self, message: str | bytes) -> None:
        event_id = None
        try:
            event = _event(message)
            event_id = event.get("event_id")
            handler = self._handlers.get(event["type"])
            if handler is None:
                raise bad_request(
                    f"Invalid value: '{event['type']}'. Supported values are: "
                    + ", ".join(f"'{name}'" for name in self._handlers)
                    + ".",
                    "type",
                    "invalid_value",
                )
            handler(event)
        except ServiceError as e:
            self._error(e, event_id)
        except ClosedSocket:
            pass

    def _session_update(self, event: dict) -> None:
        settings = self._settings
        assert settings is not None
        body = _validated(SessionBody, _field(event, "session", dict), "session")
        settings.update(body)
        self._audio.listen(self._turn_settings())
        self._send({"type": "session.updated", "session": settings.as_json()})

    def _turn_settings(self):
        detection = self._settings.turn_detection if self._settings else None
        return None if detection is None else detection.settings()

    def _append(self, event: dict) -> None:
        audio = _field(event, "audio", str)
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as e:
            raise bad_request("audio must be base64-encoded pcm16 audio.", "audio") from e
        limit = self._service.config.max_audio_bytes  # as an upload's: pcm16 bytes held
        if (self._audio.held_ms * SAMPLES_PER_MS + len(data) // 2) * 2 > limit:
            raise bad_request(
                f"The input audio buffer is full ({limit} bytes of pcm16, --max-audio-bytes): "
                f"commit or clear it.",
                "audio",
                "input_audio_buffer_full",
            )
        for edge in self._audio.append(pcm16_samples(data)):
            if edge.started:
                self._speech_started(edge.ms)
            else:
                self._speech_stopped(edge.ms)

    def _speech_started(self, ms: int) -> None:
        self._speech_item = new_id("item")
        self._send(
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": ms,
                "item_id": self._speech_item,
            }
        )
        detection = self._settings.turn_detection if self._settings else None
        if self._active is not None and detection is not None and detection.interrupt_response:
            self._active.cancel("turn_detected")  # barge-in

    def _speech_stopped(self, ms: int) -> None:
        item_id = self._speech_item or new_id("item")
        self._speech_item = None
        self._send(
            {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ms, "item_id": item_id}
        )
        self._commit(self._audio.take(ms), item_id)
        detection = self._settings.turn_detection if self._settings else None
        if detection is not None and detection.create_response and self._idle():
            self._respond(ResponseBody())

    def _commit_event(self, event: dict) -> None:
        if self._audio.held_ms < MIN_COMMIT_MS:
            raise bad_request(
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {self._audio.held_ms}ms of "
                f"audio.",
                None,
                "input_audio_buffer_commit_empty",
            )
        item_id, self._speech_item = self._speech_item or new_id("item"), None
        self._commit(self._audio.take(), item_id)
        self._audio.clear()  # a turn the detector was in is over

    def _commit(self, samples: np.ndarray, item_id: str) -> None:
        item = {
            "id": item_id,
            "type": "message",
            "object": "realtime.item",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        with self._lock:
            previous = self._conversation.add(item)
        self._send(
            {
                "type": "input_audio_buffer.committed",
                "previous_item_id": previous,
                "item_id": item_id,
            }
        )
        self._added(item, previous)
        self._work.submit(self._transcribe, item, 0, samples)

    def _clear(self, event: dict) -> None:
        self._audio.clear()
        self._speech_item = None
        self._send({"type": "input_audio_buffer.cleared"})

    def _item_create(self, event: dict) -> None:
        body = _validated(ItemBody, _field(event, "item", dict), "item")
        item = item_from(body)
        audio = [
            (i, pcm16_samples(_b64(part.audio, f"item.content[{i}].audio")))
            for i, part in enumerate(body.content or [])
            if part.type == "input_audio" and part.audio is not None and part.transcript is None
        ]
        with self._lock:
            previous = self._conversation.add(item, event.get("previous_item_id"))
        self._added(item, previous)
        for index, samples in audio:
            self._work.submit(self._transcribe, item, index, samples)

    def _added(self, item: dict, previous: str | None) -> None:
        self._send({"type": "conversation.item.added", "previous_item_id": previous, "item": item})
        self._send({"type": "conversation.item.done", "previous_item_id": previous, "item": item})

    def _item_retrieve(self, event: dict) -> None:
        with self._lock:
            item = self._conversation.get(_field(event, "item_id", str))
        self._send({"type": "conversation.item.retrieved", "item": item})

    def _item_delete(self, event: dict) -> None:
        item_id = _field(event, "item_id", str)
        with self._lock:
            self._conversation.delete(item_id)
        self._send({"type": "conversation.item.deleted", "item_id": item_id})

    def _item_truncate(self, event: dict) -> None:
        item_id = _field(event, "item_id", str)
        index, end = _field(event, "content_index", int), _field(event, "audio_end_ms", int)
        with self._lock:
            self._conversation.truncate(item_id, index, end)
        self._send(
            {
                "type": "conversation.item.truncated",
                "item_id": item_id,
                "content_index": index,
                "audio_end_ms": end,
            }
        )

    def _response_create(self, event: dict) -> None:
        if not self._idle():
            assert self._active is not None
            raise bad_request(
                f"Conversation already has an active response in progress: "
                f"{self._active.id}. Wait until the response is finished before creating "
                f"a new one.",
                None,
                "conversation_already_has_active_response",
            )
        self._respond(_validated(ResponseBody, event.get("response") or {}, "response"))

    def _response_cancel(self, event: dict) -> None:
        active = self._active
        wanted = event.get("response_id")
        if active is None or (wanted is not None and wanted != active.id):
            raise bad_request(
                "Cancellation failed: no active response found.", None, "response_cancel_not_active"
            )
        active.cancel("client_cancelled")

    # work ----------------------------------------------------------------------------------

    def _idle(self) -> bool:
        """No response runs, or the one that does was cancelled (the next one queues
        behind its last steps)."""
        return self._active is None or self._active.cancelled

    def _respond(self, body: ResponseBody) -> None:
        run = ResponseRun(
            self._plan(body),
            self._service,
            self._conversation,
            self._lock,
            self._send,
            self._left,
            self._turn,
        )
        self._active = run
        self._work.submit(self._run, run)

    def _run(self, run: ResponseRun) -> None:
        try:
            run.run()
        except Exception:  # a bug: told in the log, the session goes on
            log.exception("unhandled error in a Realtime response")
        finally:
            if self._active is run:
                self._active = None

    def _plan(self, body: ResponseBody) -> ResponsePlan:
        settings = self._settings
        assert settings is not None
        modalities = list(body.output_modalities or settings.modalities)
        settings.check_modalities(modalities, "response.output_modalities")
        output = body.audio.output if body.audio is not None else None
        voice = None
        if "audio" in modalities:
            name = self._served("speech")
            assert name is not None  # check_modalities
            spec = self._service.models.resolve_kind(
                name, self._opening, "speech", "it does not synthesise speech", "model_not_speech"
            )
            voice = Voice(
                self._service.media,
                spec,
                name,
                (output.voice if output and output.voice else None) or settings.voice,
                (output.speed if output and output.speed else None) or settings.speed,
            )
        given = body.model_fields_set
        return ResponsePlan(
            model=settings.model,
            instructions=body.instructions
            if body.instructions is not None
            else settings.instructions,
            modalities=modalities,
            tools=body.tools if "tools" in given and body.tools is not None else settings.tools,
            tool_choice=body.tool_choice or settings.tool_choice,
            max_output_tokens=body.max_output_tokens or settings.max_output_tokens,
            temperature=body.temperature if body.temperature is not None else settings.temperature,
            voice=voice,
            in_conversation=body.conversation != "none",
            input=[item_from(_validated(ItemBody, item, "response.input")) for item in body.input]
            if body.input is not None
            else None,
            metadata=body.metadata,
        )

    def _transcribe(self, item: dict, index: int, samples: np.ndarray) -> None:
        """The audio part's transcript (what the chat model reads), told to the client
        when the session asked for input transcription."""
        settings = self._settings
        assert settings is not None
        wanted = settings.transcription
        try:
            with self._turn(self._left) as context:
                name = (wanted.model if wanted else None) or self._served("transcription")
                if name is None:
                    raise bad_request(
                        "This server has no transcription model: audio input cannot be "
                        "understood (serve one with --model).",
                        None,
                        "no_transcription_model",
                    )
                spec = self._service.models.resolve_kind(
                    name,
                    context,
                    "transcription",
                    "it does not transcribe speech",
                    "model_not_transcription",
                )
                options = TranscriptionOptions(
                    language=wanted.language if wanted else None,
                    prompt=wanted.prompt if wanted else None,
                )
                audio = resample(samples, RATE, SAMPLE_RATE)
                text = ""
                for window in self._service.media.transcribe(
                    spec, audio, options, context.client_gone
                ):
                    text += window.text
                    if wanted is not None and window.text:
                        self._send(
                            {
                                "type": "conversation.item.input_audio_transcription.delta",
                                "item_id": item["id"],
                                "content_index": index,
                                "delta": window.text,
                            }
                        )
        except ServiceError as e:
            self._send(
                {
                    "type": "conversation.item.input_audio_transcription.failed",
                    "item_id": item["id"],
                    "content_index": index,
                    "error": error_body(e)["error"],
                }
            )
            return
        except ClientGone:
            return
        text = text.strip()
        with self._lock:
            item["content"][index]["transcript"] = text
        if wanted is not None:
            self._send(
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": item["id"],
                    "content_index": index,
                    "transcript": text,
                    "usage": {"type": "duration", "seconds": round(samples.size / RATE, 3)},
                }
            )

    # events out --------------------------------------------------------------------------

    def _send(self, event: dict) -> None:
        try:
            self._socket.send_json({"event_id": new_id("event"), **event})
        except ClosedSocket:
            log.debug("a Realtime event after the client left: %s", event["type"])

    def _error(self, error: ServiceError, event_id: str | None) -> None:
        body = error_body(error)["error"]
        log.info("Realtime error event: %s", error.message)
        self._send({"type": "error", "error": {**body, "event_id": event_id}})


def _event(message: str | bytes) -> dict:
    if isinstance(message, bytes):
        raise bad_request("Send each event as a JSON text frame, not a binary one.")
    try:
        event = json.loads(message)
    except ValueError as e:
        raise bad_request(f"The event is not valid JSON: {e}", None, "invalid_json") from e
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise bad_request("Each event must be a JSON object with a 'type'.", "type")
    return event


def _field(event: dict, name: str, kind: type):
    value = event.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise bad_request(
            f"Missing or invalid '{name}' ({kind.__name__} expected).", name, "invalid_value"
        )
    return value


def _validated(model, value: dict, prefix: str):
    """`value` as `model`; a mistake's param is named from the event (`session.audio...`)."""
    try:
        return validate(model, value)
    except ServiceError as e:
        e.param = f"{prefix}.{e.param}" if e.param else prefix
        raise


def _b64(value: str, param: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"{param} must be base64-encoded pcm16 audio.", param) from e
