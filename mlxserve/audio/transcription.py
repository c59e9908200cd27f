"""Speech to text with Whisper-family models (mlx-audio's Whisper), a 30-second window
at a time, so that long audio never holds more than its samples and one window's
features.

A window runs as a coroutine (a greenlet) on the generation thread: it pauses before each
encoder block's and each decoder step's forward pass, so that the generation loop runs a
window a pass at a time, between its chat steps, rather than all at once. The greenlet never
leaves the generation thread, the only one that touches MLX."""

from __future__ import annotations

from collections.abc import Callable
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
        _pause_before_passes(model)

    def parameters(self) -> dict:
        """The weights (what residency counts)."""
        return self.model.parameters()

    @classmethod
    def load(cls, path: Path) -> Transcriber:
        """mlx-audio builds Whisper in float16: fast on a GPU, but on a CPU (MLX's CPU
        backend has no fast half-precision matmul) an encoder block takes seconds, so
        there it runs in float32."""
        import mlx.core as mx
        from mlx_audio.stt.utils import load_model

        model = load_model(path)
        if mx.default_device() == mx.cpu:
            model.set_dtype(mx.float32)
            model.dtype = mx.float32  # what it casts each window's features to
        return cls(model)

    @property
    def multilingual(self) -> bool:
        return bool(self.model.is_multilingual)

    def window(
        self, audio: np.ndarray, start: int, options: TranscriptionOptions, previous: str
    ) -> Window:
        """Transcribe the window of `audio` that begins at sample `start`. Unless it is the
        last, a final segment that runs into the window's end is left to the next window,
        which then begins where it began."""
        import mlx.core as mx

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
            fp16=self.model.dtype == mx.float16,
        )
        offset = start / SAMPLE_RATE
        segments = [_segment(s, offset) for s in result.segments or []]
        end = stop
        window_end = stop / SAMPLE_RATE
        if stop < len(audio) and len(segments) > 1 and segments[-1].end > window_end - CUT_MARGIN:
            end = int(segments.pop().start * SAMPLE_RATE)
        return Window(segments, str(result.language or options.language or "en"), end)


class SteppedWindow:
    """One window's transcription, a forward pass per `step` (generation thread only)."""

    def __init__(self, transcriber: Transcriber, *args: Any):
        from greenlet import greenlet

        self._run = greenlet(lambda: transcriber.window(*args))
        self._run.stepping = True  # type: ignore[attr-defined]  # what _pause looks for

    def step(self) -> Window | None:
        """Run to the next forward pass; the window once it is transcribed."""
        result = self._run.switch()
        return result if self._run.dead else None

    def close(self) -> None:
        """Abandon the window (its client left)."""
        if not self._run.dead:
            self._run.throw()


def _pause() -> None:
    """Inside a SteppedWindow: hand the generation thread back until the next step."""
    from greenlet import getcurrent

    current = getcurrent()
    if getattr(current, "stepping", False) and current.parent is not None:
        current.parent.switch()


def _pause_before_passes(model: Any) -> None:
    """Make each block of the encoder, and the decoder, pause before its forward pass and
    compute its output before it returns (MLX is lazy: else the work would pile up into
    the next piece). Their classes are swapped, for this model only, for subclasses."""
    for module in (*model.encoder.blocks, model.decoder):
        base = type(module)
        module.__class__ = type(f"Pausing{base.__name__}", (base,), {"__call__": _pausing(base)})


def _pausing(base: type) -> Callable[..., Any]:
    def call(self, *args, **kwargs):
        import mlx.core as mx
        from mlx.utils import tree_flatten

        _pause()
        out = base.__call__(self, *args, **kwargs)
        arrays = [pair[1] for pair in tree_flatten(out) if isinstance(pair[1], mx.array)]
        mx.eval(arrays)
        return out

    return call


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
