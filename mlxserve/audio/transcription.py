"""Speech to text with Whisper-family models (mlx-audio's Whisper), a 30-second window
at a time: each window is one piece of work on the generation thread (chat streams step
between them), and long audio never holds more than its samples and one window's
features."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlxserve.protocol.errors import bad_request

SAMPLE_RATE = 16_000  # what Whisper hears
WINDOW_SECONDS = 30  # what it hears at once
CUT_MARGIN = 1.0  # a window's last segment ending this near its end may be cut short
PROMPT_CHARS = 400  # the previous window's text that conditions the next (Whisper's way)
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # Whisper's, for temperature 0


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float


@dataclass(frozen=True)
class Segment:
    start: float  # seconds from the start of the file
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class TranscriptionOptions:
    task: str = "transcribe"  # or "translate" (into English)
    language: str | None = None  # a code ("en"); None: detected
    prompt: str | None = None
    temperature: float = 0.0
    words: bool = False  # word timestamps


@dataclass
class Window:
    """What one window of the audio gave."""

    segments: list[Segment]
    language: str
    end: int  # the sample where the next window starts
    text: str = field(init=False)

    def __post_init__(self):
        self.text = "".join(s.text for s in self.segments)


class Transcriber:
    """A loaded Whisper model (generation thread only)."""

    def __init__(self, model: Any):
        self.model = model

    def parameters(self) -> dict:
        """The weights (what residency counts)."""
        return self.model.parameters()

    @classmethod
    def load(cls, path: Path) -> Transcriber:
        from mlx_audio.stt.utils import load_model

        return cls(load_model(path))

    @property
    def multilingual(self) -> bool:
        return bool(self.model.is_multilingual)

    def window(
        self, audio: np.ndarray, start: int, options: TranscriptionOptions, previous: str
    ) -> Window:
        """Transcribe the window of `audio` that begins at sample `start`. Unless it is the
        last, a final segment that runs into the window's end is left to the next window,
        which then begins where it began."""
        stop = min(start + WINDOW_SECONDS * SAMPLE_RATE, len(audio))
        temperature = options.temperature or FALLBACK_TEMPERATURES
        prompt = " ".join(p for p in (options.prompt, previous[-PROMPT_CHARS:]) if p) or None
        result = self.model.generate(
            audio[start:stop],
            language=options.language,
            task=options.task,
            temperature=temperature,
            initial_prompt=prompt,
            word_timestamps=options.words,
            verbose=None,
        )
        offset = start / SAMPLE_RATE
        segments = [_segment(s, offset) for s in result.segments or []]
        end = stop
        window_end = stop / SAMPLE_RATE
        if stop < len(audio) and len(segments) > 1 and segments[-1].end > window_end - CUT_MARGIN:
            end = int(segments.pop().start * SAMPLE_RATE)
        return Window(segments, str(result.language or options.language or "en"), end)


def _segment(raw: dict, offset: float) -> Segment:
    words = tuple(
        Word(str(w["word"]), round(w["start"] + offset, 2), round(w["end"] + offset, 2))
        for w in raw.get("words") or []
    )
    return Segment(
        start=round(float(raw["start"]) + offset, 2),
        end=round(float(raw["end"]) + offset, 2),
        text=str(raw["text"]),
        tokens=tuple(int(t) for t in raw.get("tokens", [])),
        temperature=float(raw.get("temperature", 0.0)),
        avg_logprob=float(raw.get("avg_logprob", 0.0)),
        compression_ratio=float(raw.get("compression_ratio", 0.0)),
        no_speech_prob=float(raw.get("no_speech_prob", 0.0)),
        words=words,
    )


def language_code(given: str | None) -> str | None:
    """An ISO-639-1 code Whisper knows, from a code or a language's English name."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    if given is None:
        return None
    code = given.strip().lower()
    code = TO_LANGUAGE_CODE.get(code, code)
    if code not in LANGUAGES:
        raise bad_request(f"Unknown language '{given}': give an ISO-639-1 code.", "language")
    return code


def language_name(code: str) -> str:
    """Whisper's English name of a language ("english"), as verbose_json gives it."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

    return str(LANGUAGES.get(code, code))
