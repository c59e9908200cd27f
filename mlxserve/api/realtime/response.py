"""One response of a Realtime session: the conversation's chat request through the
shared continuous batch, its text streamed as transcript (or text) deltas, its sentences
spoken as they complete, its tool calls as function_call items; `response.done` with the
usage at the end, cancelled when the client (or the user's voice) says so."""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from mlxserve.api.openai.errors import error_body
from mlxserve.api.openai.requests import ChatRequest as ChatWire
from mlxserve.api.openai.requests import chat_request
from mlxserve.api.realtime.conversation import Conversation, Spoken, new_id
from mlxserve.api.realtime.speaker import Sentences, Voice, speak
from mlxserve.api.realtime.wire import RATE, AudioFormat, FunctionTool, ToolChoice
from mlxserve.api.table import Turn
from mlxserve.api.wire import validate
from mlxserve.audio.codec import pcm16_bytes
from mlxserve.postprocess.events import Content, ToolCallArguments, ToolCallStart
from mlxserve.protocol.errors import ClientGone, ServiceError
from mlxserve.service.chat import ChatService
from mlxserve.service.context import RequestContext
from mlxserve.service.results import Usage

log = logging.getLogger(__name__)
REASONING_FORMAT = "separate"  # reasoning is not spoken


@dataclass
class ResponsePlan:
    """A response's settings: the session's, with response.create's over them."""

    model: str
    instructions: str
    modalities: list[str]
    tools: list[FunctionTool]
    tool_choice: ToolChoice
    max_output_tokens: int | str
    temperature: float | None
    voice: Voice | None  # None: text only
    in_conversation: bool = True  # "none": out of band, nothing added
    input: list[dict] | None = None  # out-of-band items instead of the conversation's
    metadata: dict | None = None


@dataclass
class _Output:
    """The output item being written: a message (its one part) or a function call."""

    item: dict
    index: int
    sentences: Sentences = field(default_factory=Sentences)
    spoken: Spoken = field(default_factory=Spoken)
    text: str = ""


class ResponseRun:
    def __init__(
        self,
        plan: ResponsePlan,
        service: ChatService,
        conversation: Conversation,
        lock: threading.Lock,
        send: Callable[[dict], None],
        gone: Callable[[], bool],
        turn: Turn,
    ):
        self.plan = plan
        self.id = new_id("resp")
        self._service = service
        self._conversation = conversation
        self._lock = lock
        self._send = send
        self._gone = gone
        self._turn = turn
        self._cancelled: str | None = None  # why: client_cancelled or turn_detected
        self._output: list[dict] = []
        self._open: _Output | None = None
        self._audio_ms = 0  # of the open item's audio
        self._silent = False  # nothing more is spoken (the response failed)

    def cancel(self, reason: str) -> None:
        """From the connection's thread: end at the next step, keep what was said."""
        self._cancelled = reason

    @property
    def cancelled(self) -> bool:
        return self._cancelled is not None

    def run(self) -> None:
        """On the session's work thread: the whole response, from response.created to
        response.done. Its generation is a request of its own (admitted, counted)."""
        self._send({"type": "response.created", "response": self._response("in_progress")})
        usage, status, details = Usage(), "completed", None
        try:
            with self._turn(self._gone) as context:
                usage, status, details = self._generate(context)
            if self._cancelled is None:  # the last words are spoken before it closes
                self._close_item("completed" if status == "completed" else "incomplete")
        except ServiceError as e:
            status, details = "failed", {"type": "failed", "error": _error(e)}
            self._send({"type": "error", "error": _error(e)})
        except ClientGone:
            return
        except Exception as e:  # a bug: this response fails, the session goes on
            log.exception("unhandled error in a Realtime response")
            status, details = "failed", {"type": "failed", "error": {"message": str(e)}}
        if self._cancelled is not None:
            status, details = "cancelled", {"type": "cancelled", "reason": self._cancelled}
        self._silent = True  # an item a failure left open closes without more speech
        self._close_item("incomplete")
        response = self._response(status, usage)
        response["status_details"] = details
        self._send({"type": "response.done", "response": response})

    def _generate(self, context: RequestContext) -> tuple[Usage, str, dict | None]:
        request = chat_request(self._chat())
        run = self._service.run(self._service.prepare_chat(request, context, REASONING_FORMAT))
        finish = None
        for step in run.steps():
            if self._cancelled is not None:
                run.finish_early()
            for event in step.events:
                if self._cancelled is None:
                    self._event(event)
            if step.finished:
                finish = step.choice.finish_reason
        if finish == "length" and self._cancelled is None:
            return run.usage, "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        return run.usage, "completed", None

    def _chat(self) -> ChatWire:
        plan = self.plan
        with self._lock:
            history = self._conversation.messages(plan.input)
        body: dict = {
            "model": plan.model,
            "messages": [{"role": "system", "content": plan.instructions}, *history],
        }
        if plan.tools and plan.tool_choice != "none":
            body["tools"] = [
                {
                    "type": "function",
                    "function": tool.model_dump(exclude={"type"}, exclude_none=True),
                }
                for tool in plan.tools
            ]
            choice = plan.tool_choice
            body["tool_choice"] = (
                choice
                if isinstance(choice, str)
                else {"type": "function", "function": {"name": choice.name}}
            )
        if plan.max_output_tokens != "inf":
            body["max_tokens"] = plan.max_output_tokens
        if plan.temperature is not None:
            body["temperature"] = plan.temperature
        return validate(ChatWire, body)

    # output ------------------------------------------------------------------------------

    def _event(self, event) -> None:
        if isinstance(event, Content):
            self._text(event.text)
        elif isinstance(event, ToolCallStart):
            self._close_item("completed")
            item = {
                "id": new_id("item"),
                "type": "function_call",
                "object": "realtime.item",
                "status": "in_progress",
                "call_id": event.id,
                "name": event.name,
                "arguments": "",
            }
            self._open_item(item)
        elif isinstance(event, ToolCallArguments) and self._open is not None:
            self._open.item["arguments"] += event.text
            self._send(
                {
                    "type": "response.function_call_arguments.delta",
                    **self._where(),
                    "call_id": self._open.item["call_id"],
                    "delta": event.text,
                }
            )

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._open is None or self._open.item["type"] != "message":
            self._close_item("completed")
            self._open_message()
        assert self._open is not None
        self._open.text += text
        kind = "output_audio_transcript" if self._audio else "output_text"
        self._send(
            {"type": f"response.{kind}.delta", **self._where(), "content_index": 0, "delta": text}
        )
        if self._audio:
            self._speak(self._open, self._open.sentences.feed(text))

    @property
    def _audio(self) -> bool:
        return self.plan.voice is not None

    def _open_message(self) -> None:
        part_type = "output_audio" if self._audio else "output_text"
        item: dict = {
            "id": new_id("item"),
            "type": "message",
            "object": "realtime.item",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self._open_item(item)
        part = {"type": "audio", "transcript": ""} if self._audio else {"type": "text", "text": ""}
        self._send(
            {
                "type": "response.content_part.added",
                **self._where(),
                "content_index": 0,
                "part": part,
            }
        )
        item["content"] = [
            {"type": part_type, "transcript": ""}
            if self._audio
            else {"type": part_type, "text": ""}
        ]

    def _open_item(self, item: dict) -> None:
        self._open = _Output(item, len(self._output))
        self._output.append(item)
        self._audio_ms = 0
        previous = None
        if self.plan.in_conversation:
            with self._lock:
                previous = self._conversation.add(item)
        self._send(
            {
                "type": "response.output_item.added",
                "response_id": self.id,
                "output_index": self._open.index,
                "item": item,
            }
        )
        if self.plan.in_conversation:
            self._send(
                {"type": "conversation.item.added", "previous_item_id": previous, "item": item}
            )

    def _speak(self, out: _Output, sentences: list[str]) -> None:
        voice = self.plan.voice
        for sentence in sentences:
            if voice is None or self._cancelled is not None:
                return
            try:
                self._say(out, voice, sentence)
            except (ClientGone, ServiceError):
                raise
            except Exception:  # the speech model failed on this text: the rest goes on
                log.warning("could not speak %r", sentence, exc_info=True)
            said = out.spoken.text_ends[-1] if out.spoken.text_ends else 0
            out.spoken.text_ends.append(said + len(sentence))  # sentences are the text in order
            out.spoken.audio_ends.append(self._audio_ms)

    def _say(self, out: _Output, voice: Voice, sentence: str) -> None:
        for samples in speak(voice, sentence, self._gone):
            if self._cancelled is not None:
                return  # the sentence was cut: what was sent is what was said
            self._audio_ms += samples.size * 1000 // RATE
            delta = base64.b64encode(pcm16_bytes(samples)).decode("ascii")
            self._send(
                {
                    "type": "response.output_audio.delta",
                    **_where(self.id, out),
                    "content_index": 0,
                    "delta": delta,
                }
            )

    def _close_item(self, status: str) -> None:
        out, self._open = self._open, None
        if out is None:
            return
        if (
            self._audio
            and out.item["type"] == "message"
            and not self._cancelled
            and not self._silent
        ):
            self._speak(out, out.sentences.rest())  # what the last sentence end left
        item, where = out.item, _where(self.id, out)
        if item["type"] == "function_call":
            self._send(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        else:
            text = out.text
            if self._audio:
                if self._cancelled is not None:  # what was spoken, not what was written
                    text = text[: out.spoken.text_ends[-1]] if out.spoken.text_ends else ""
                self._send({"type": "response.output_audio.done", **where, "content_index": 0})
                self._send(
                    {
                        "type": "response.output_audio_transcript.done",
                        **where,
                        "content_index": 0,
                        "transcript": text,
                    }
                )
                part = {"type": "audio", "transcript": text}
                item["content"] = [{"type": "output_audio", "transcript": text}]
                if self.plan.in_conversation:
                    with self._lock:
                        self._conversation.spoken[item["id"]] = out.spoken
            else:
                self._send(
                    {"type": "response.output_text.done", **where, "content_index": 0, "text": text}
                )
                part = {"type": "text", "text": text}
                item["content"] = [{"type": "output_text", "text": text}]
            self._send(
                {"type": "response.content_part.done", **where, "content_index": 0, "part": part}
            )
        item["status"] = status
        self._send(
            {
                "type": "response.output_item.done",
                "response_id": self.id,
                "output_index": out.index,
                "item": item,
            }
        )
        if self.plan.in_conversation:
            self._send({"type": "conversation.item.done", "item": item})

    def _where(self) -> dict:
        assert self._open is not None
        return _where(self.id, self._open)

    def _response(self, status: str, usage: Usage | None = None) -> dict:
        plan = self.plan
        audio_format = AudioFormat().model_dump()
        return {
            "object": "realtime.response",
            "id": self.id,
            "status": status,
            "status_details": None,
            "output": self._output,
            "conversation_id": "conv_default" if plan.in_conversation else None,
            "output_modalities": plan.modalities,
            "max_output_tokens": plan.max_output_tokens,
            "audio": {
                "output": {
                    "format": audio_format,
                    "voice": plan.voice.voice if plan.voice else None,
                }
            },
            "usage": None if usage is None else _usage(usage),
            "metadata": plan.metadata,
        }


def _where(response_id: str, out: _Output) -> dict:
    """The fields that place an event in its response: the response, item, output index."""
    return {"response_id": response_id, "item_id": out.item["id"], "output_index": out.index}


def _usage(usage: Usage) -> dict:
    return {
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "input_token_details": {
            "text_tokens": usage.prompt_tokens,
            "audio_tokens": 0,
            "image_tokens": 0,
            "cached_tokens": usage.cached_tokens,
            "cached_tokens_details": {
                "text_tokens": usage.cached_tokens,
                "audio_tokens": 0,
                "image_tokens": 0,
            },
        },
        "output_token_details": {"text_tokens": usage.completion_tokens, "audio_tokens": 0},
    }


def _error(error: ServiceError) -> dict:
    return error_body(error)["error"]
