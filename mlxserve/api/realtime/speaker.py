"""An answer's speech while it is still being written: the text is cut at sentence ends
and each sentence synthesised as soon as it is complete, its audio resampled to the
session's 24 kHz pcm16."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from mlxserve.api.realtime.wire import RATE
from mlxserve.audio.codec import Resampler
from mlxserve.audio.speech import SpeechRequest
from mlxserve.models.spec import ModelSpec
from mlxserve.service.media import Media

# A sentence ends at . ! ? ; : (then a space) or a line break.
SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")
# Text that runs on longer without one is spoken from its last space: speech starts
# without waiting for the end of a run-on sentence (or of an answer that has none). The
# first piece is cut shorter: it is what the user waits for.
LONGEST_PIECE = 200
LONGEST_FIRST_PIECE = 60
CHUNK_SAMPLES = RATE // 5  # 200 ms an audio delta


@dataclass(frozen=True)
class Voice:
    """The speech model a session speaks with, and how."""

    media: Media
    spec: ModelSpec
    name: str  # the model's served name
    voice: str
    speed: float


class Sentences:
    """Text in as it streams; whole sentences out (the rest at the end). The pieces
    are the text in order, nothing dropped."""

    def __init__(self) -> None:
        self._held = ""
        self._longest = LONGEST_FIRST_PIECE

    def feed(self, text: str) -> list[str]:
        self._held += text
        ends = list(SENTENCE_END.finditer(self._held))
        if ends:
            cut = ends[-1].end()
        elif len(self._held) > self._longest and " " in self._held.strip():
            cut = self._held.rstrip().rindex(" ") + 1
        else:
            return []
        done, self._held = self._held[:cut], self._held[cut:]
        self._longest = LONGEST_PIECE
        return [done]

    def rest(self) -> list[str]:
        done, self._held = self._held, ""
        return [done] if done.strip() else []


def speak(voice: Voice, text: str, gone: Callable[[], bool]) -> Iterator[np.ndarray]:
    """`text`'s speech at 24 kHz, a piece of at most CHUNK_SAMPLES at a time; nothing for
    a piece with nothing to say (punctuation, a quote: KittenTTS fails on those)."""
    if not any(c.isalnum() for c in text):
        return
    request = SpeechRequest(voice.name, text.strip(), voice.voice, voice.speed)
    rate, parts = voice.media.synthesize(voice.spec, request, gone)
    resampler = Resampler(rate, RATE)
    for part in parts:
        yield from _pieces(resampler(part))
    yield from _pieces(resampler.flush())


def _pieces(samples: np.ndarray) -> Iterator[np.ndarray]:
    for start in range(0, samples.size, CHUNK_SAMPLES):
        yield samples[start : start + CHUNK_SAMPLES]
