"""The session's input audio buffer: pcm16 at 24 kHz as the client appends it, on a
timeline counted from the session's first sample (what `audio_start_ms` and
`audio_end_ms` measure), with the voice-activity detector listening when turn detection
is on."""

from __future__ import annotations

import numpy as np

from mlxserve.api.realtime.wire import RATE
from mlxserve.audio.codec import Resampler
from mlxserve.audio.vad import VAD_RATE, SpeechEdge, TurnDetector, TurnSettings

SAMPLES_PER_MS = RATE // 1000
MIN_COMMIT_MS = 100  # OpenAI's: a shorter buffer cannot be committed


class InputAudio:
    def __init__(self) -> None:
        self._held = np.zeros(0, np.float32)
        self._held_from = 0  # the timeline's sample where the held audio begins
        self._detector: TurnDetector | None = None
        self._to_vad: Resampler | None = None
        self._detector_from = 0  # the timeline's sample the detector started at

    @property
    def held_ms(self) -> int:
        return self._held.size // SAMPLES_PER_MS

    @property
    def speaking(self) -> bool:
        return self._detector is not None and self._detector.speaking

    def listen(self, settings: TurnSettings | None) -> None:
        """Turn detection on with these settings (a new detector), or off (None)."""
        if settings is None:
            self._detector, self._to_vad = None, None
        elif self._detector is None or self._detector.settings != settings:
            self._detector, self._to_vad = TurnDetector(settings), Resampler(RATE, VAD_RATE)
            self._detector_from = self._held_from + self._held.size

    def append(self, samples: np.ndarray) -> list[SpeechEdge]:
        """Hold the samples; the speech edges the detector heard in them, on the
        session's timeline."""
        self._held = np.concatenate([self._held, samples])
        if self._detector is None or self._to_vad is None:
            return []
        offset = self._detector_from // SAMPLES_PER_MS
        edges = [
            SpeechEdge(e.started, e.ms + offset) for e in self._detector.feed(self._to_vad(samples))
        ]
        for edge in edges:
            if edge.started:  # the audio before the turn (its padding kept) is dropped
                self._drop_before(edge.ms * SAMPLES_PER_MS)
        return edges

    def take(self, until_ms: int | None = None) -> np.ndarray:
        """The held audio (up to `until_ms` on the timeline), which leaves the buffer."""
        cut = self._held.size
        if until_ms is not None:
            cut = min(max(until_ms * SAMPLES_PER_MS - self._held_from, 0), cut)
        taken, self._held = self._held[:cut], self._held[cut:]
        self._held_from += cut
        return taken

    def clear(self) -> None:
        self.take()
        if self._detector is not None:
            self._detector.reset()

    def _drop_before(self, sample: int) -> None:
        drop = min(max(sample - self._held_from, 0), self._held.size)
        self._held = self._held[drop:]
        self._held_from += drop
