"""The session's settings as the Realtime API (GA) spells them: what `session.update` and
`response.create` may set, validated; anything else is an `error` event naming it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mlxserve.audio.vad import TurnSettings

RATE = 24_000  # audio/pcm in and out, as OpenAI's
DEFAULT_INSTRUCTIONS = "You are a helpful assistant. Answer briefly: your words are spoken."


class _Body(BaseModel):
    # an unknown field is the client's mistake, named (as OpenAI's "Unknown parameter")
    model_config = ConfigDict(extra="forbid")


class AudioFormat(_Body):
    type: Literal["audio/pcm"] = "audio/pcm"  # pcmu and pcma (8 kHz telephony) are not served
    rate: Literal[24000] = 24000  # RATE


class ServerVad(_Body):
    type: Literal["server_vad"]
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    prefix_padding_ms: Annotated[int, Field(ge=0, le=10_000)] = 300
    silence_duration_ms: Annotated[int, Field(ge=0, le=10_000)] = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: None = None  # not served: a 400 unless null

    def settings(self) -> TurnSettings:
        return TurnSettings(self.threshold, self.prefix_padding_ms, self.silence_duration_ms)


class SemanticVad(_Body):
    """Served as server_vad with its defaults, waiting longer the lower the eagerness:
    there is no turn-end model here (docs/realtime.md)."""

    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True

    def settings(self) -> TurnSettings:
        silence = {"low": 1500, "medium": 800, "high": 300, "auto": 800}[self.eagerness]
        return TurnSettings(silence_duration_ms=silence)


TurnDetection = Annotated[ServerVad | SemanticVad, Field(discriminator="type")]


class Transcription(_Body):
    model: str | None = None  # a transcription model the server has; None: the first
    language: str | None = None
    prompt: str | None = None


class NoiseReduction(_Body):
    type: Literal["near_field", "far_field"]  # accepted; the audio goes in as it came


class AudioInput(_Body):
    format: AudioFormat | None = None
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = None
    noise_reduction: NoiseReduction | None = None


class AudioOutput(_Body):
    format: AudioFormat | None = None
    voice: str | None = None
    speed: Annotated[float, Field(ge=0.25, le=1.5)] | None = None


class Audio(_Body):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class FunctionTool(_Body):
    type: Literal["function"] = "function"
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class NamedFunction(_Body):
    type: Literal["function"]
    name: str


Modalities = Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=1)]
ToolChoice = Literal["auto", "none", "required"] | NamedFunction
MaxOutputTokens = Annotated[int, Field(ge=1, le=4096)] | Literal["inf"]


class _Answering(_Body):
    """What both the session and one response may set about an answer."""

    instructions: str | None = None
    output_modalities: Modalities | None = None
    audio: Audio | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: MaxOutputTokens | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None  # the beta's


class SessionBody(_Answering):
    """`session` of session.update (fields given replace those set; the rest stay)."""

    type: Literal["realtime"] = "realtime"
    model: str | None = None  # fixed by the connection's ?model=
    tracing: Literal["auto"] | dict | None = None  # accepted: there is no trace dashboard
    truncation: Literal["auto", "disabled"] | dict | None = None
    include: list[str] | None = None


class ResponseBody(_Answering):
    """`response` of response.create: this response's own settings over the session's."""

    conversation: Literal["auto", "none"] | None = None
    input: list[dict] | None = None  # items for this response only (out of band)
    metadata: dict[str, str] | None = None


class ContentPart(_Body):
    type: Literal["input_text", "input_audio", "text", "output_text", "output_audio", "audio"]
    text: str | None = None
    audio: str | None = None  # base64 pcm16 at 24 kHz
    transcript: str | None = None


class ItemBody(_Body):
    """`item` of conversation.item.create."""

    id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    type: Literal["message", "function_call", "function_call_output"]
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
