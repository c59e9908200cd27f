"""Text to speech with mlx-audio's models: the audio comes a part at a time (the model's
own chunking of long text), each part one piece of work on the generation thread."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxserve.protocol.errors import bad_request

log = logging.getLogger(__name__)

# OpenAI's voices: clients send them by default (Open WebUI sends "alloy"); they are
# served by the model's first voice rather than refused.
OPENAI_VOICES = frozenset(
    [
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "onyx",
        "nova",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
    ]
)


@dataclass(frozen=True)
class SpeechRequest:
    model: str | None
    text: str
    voice: str
    speed: float = 1.0


class Synthesizer:
    """A loaded text-to-speech model (generation thread only)."""

    def __init__(self, model: Any, path: Path):
        self.model = model
        self._path = path
        self._told: set[str] = set()  # OpenAI's voices whose stand-in was logged

    def parameters(self) -> dict:
        """The weights (what residency counts)."""
        return self.model.parameters()

    @classmethod
    def load(cls, path: Path) -> Synthesizer:
        from mlx_audio.tts.utils import load_model

        return cls(load_model(path), path)

    @property
    def sample_rate(self) -> int:
        return int(self.model.sample_rate)

    @property
    def voices(self) -> list[str]:
        """The voices the model has: loaded with it (KittenTTS), or files in its voices/
        folder (Kokoro)."""
        loaded = getattr(self.model, "voices", None)
        if isinstance(loaded, dict) and loaded:
            return sorted(loaded)
        folder = self._path / "voices"
        return sorted({f.stem for f in folder.glob("*")}) if folder.is_dir() else []

    def voice(self, given: str) -> str:
        voices = self.voices
        if not voices or given in voices:
            return given
        if given in OPENAI_VOICES:
            if given not in self._told:  # once: a live session asks for every sentence
                self._told.add(given)
                log.info("Voice %r is OpenAI's: speaking with this model's %r", given, voices[0])
            return voices[0]
        raise bad_request(
            f"Unknown voice '{given}'. This model's voices: {', '.join(voices)}.", "voice"
        )

    def parts(self, request: SpeechRequest) -> Iterator[Any]:
        return iter(
            self.model.generate(request.text, voice=self.voice(request.voice), speed=request.speed)
        )
