"""A Realtime session's settings: the defaults it opens with, session.update applied over
them (each field given replaces the one set), and the `session` object the client sees."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from mlxserve.api.realtime.wire import (
    DEFAULT_INSTRUCTIONS,
    AudioFormat,
    FunctionTool,
    NoiseReduction,
    SemanticVad,
    ServerVad,
    SessionBody,
    ToolChoice,
    Transcription,
)
from mlxserve.protocol.errors import bad_request

DEFAULT_VOICE = "alloy"  # OpenAI's; a speech model without it speaks with its first voice


@dataclass
class SessionSettings:
    model: str
    speaks: bool  # whether the server has a speech model (audio out is offered)
    id: str = field(default_factory=lambda: f"sess_{secrets.token_hex(10)}")
    instructions: str = DEFAULT_INSTRUCTIONS
    modalities: list[str] = field(default_factory=list)
    turn_detection: ServerVad | SemanticVad | None = field(
        default_factory=lambda: ServerVad(type="server_vad")
    )
    transcription: Transcription | None = None
    noise_reduction: NoiseReduction | None = None
    voice: str = DEFAULT_VOICE
    speed: float = 1.0
    tools: list[FunctionTool] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    max_output_tokens: int | str = "inf"
    temperature: float | None = None
    include: list[str] | None = None

    def __post_init__(self):
        self.modalities = self.modalities or (["audio"] if self.speaks else ["text"])

    def update(self, body: SessionBody) -> None:
        """session.update: the fields it gives, checked first, then applied together."""
        given = body.model_fields_set
        if body.model is not None and body.model != self.model:
            raise bad_request(
                "The session's model is the connection's (?model=); it cannot change.",
                "session.model",
            )
        if "output_modalities" in given and body.output_modalities is not None:
            self.check_modalities(list(body.output_modalities), "session.output_modalities")
        for name in (
            "instructions",
            "tools",
            "tool_choice",
            "max_output_tokens",
            "temperature",
            "include",
        ):
            if name in given:
                value = getattr(body, name)
                setattr(self, name, [] if name == "tools" and value is None else value)
        if "output_modalities" in given and body.output_modalities is not None:
            self.modalities = list(body.output_modalities)
        audio = body.audio
        if audio is not None and audio.input is not None:
            sent = audio.input.model_fields_set
            for name in ("turn_detection", "transcription", "noise_reduction"):
                if name in sent:
                    setattr(self, name, getattr(audio.input, name))
        if audio is not None and audio.output is not None:
            if audio.output.voice is not None:
                self.voice = audio.output.voice
            if audio.output.speed is not None:
                self.speed = audio.output.speed

    def check_modalities(self, modalities: list[str], param: str) -> None:
        if "audio" in modalities and not self.speaks:
            raise bad_request(
                "This server has no speech model: audio output is not offered "
                '(serve one with --model, or ask for ["text"]).',
                param,
                "no_speech_model",
            )

    def as_json(self) -> dict:
        fmt = AudioFormat().model_dump()
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": self.model,
            "output_modalities": self.modalities,
            "instructions": self.instructions,
            "tools": [tool.model_dump() for tool in self.tools],
            "tool_choice": self.tool_choice
            if isinstance(self.tool_choice, str)
            else self.tool_choice.model_dump(),
            "max_output_tokens": self.max_output_tokens,
            "tracing": None,
            "truncation": "auto",
            "prompt": None,
            "expires_at": 0,
            "include": self.include,
            "audio": {
                "input": {
                    "format": fmt,
                    "transcription": _dumped(self.transcription),
                    "noise_reduction": _dumped(self.noise_reduction),
                    "turn_detection": _dumped(self.turn_detection),
                },
                "output": {"format": fmt, "voice": self.voice, "speed": self.speed},
            },
        }


def _dumped(value) -> dict | None:
    return None if value is None else value.model_dump()
