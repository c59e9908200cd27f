"""Audio files <-> float32 samples, in-process with PyAV (FFmpeg's libraries, bundled in
its wheels): every format browsers and phones record (wav, mp3, flac, ogg, m4a, webm)
decodes, and every format OpenAI's speech endpoint offers encodes."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from mlxserve.protocol.errors import bad_request


@dataclass(frozen=True)
class OutputFormat:
    container: str | None  # None: raw samples (pcm)
    codec: str
    content_type: str
    sample_rate: int | None = None  # None: the model's own; else resampled to it


# OpenAI's speech formats: pcm is raw signed 16-bit little-endian, mono, at the model's
# rate (OpenAI's is 24 kHz; a model's own rate is what it says in X-Sample-Rate).
OUTPUT_FORMATS = {
    "mp3": OutputFormat("mp3", "libmp3lame", "audio/mpeg"),
    "opus": OutputFormat("ogg", "libopus", "audio/ogg", 48000),
    "aac": OutputFormat("adts", "aac", "audio/aac"),
    "flac": OutputFormat("flac", "flac", "audio/flac"),
    "wav": OutputFormat("wav", "pcm_s16le", "audio/wav"),
    "pcm": OutputFormat(None, "pcm_s16le", "audio/pcm"),
}


def decode(
    data: bytes,
    sample_rate: int,
    param: str = "file",
    max_seconds: float | None = None,
    code: str | None = None,
) -> np.ndarray:
    """A file's first audio stream as mono float32 samples at `sample_rate`; a 400 naming
    `param` (with `code`) where it is no audio PyAV can read, or lasts over `max_seconds`."""
    import av

    if not data:
        raise bad_request("The audio file is empty.", param, code=code)
    most = None if max_seconds is None else int(max_seconds * sample_rate)
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise bad_request(
                    f"The file ({_format_name(container)}) has no audio stream.", param, code=code
                )
            resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
            parts: list[np.ndarray] = []
            held = 0
            for frame in container.decode(container.streams.audio[0]):
                new = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
                parts.extend(new)
                held += sum(len(part) for part in new)
                if most is not None and held > most:
                    raise bad_request(
                        f"The audio is longer than the server's limit of {max_seconds:g} s "
                        "(see --max-audio-seconds).",
                        param,
                        code="audio_too_long",
                    )
            parts.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(None))
    except av.FFmpegError as e:
        raise bad_request(
            f"The file is not audio in a format this server decodes (wav, mp3, flac, ogg, "
            f"m4a, webm, ...): {e}",
            param,
            code=code,
        ) from e
    samples = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if samples.size == 0:
        raise bad_request("The audio file holds no samples.", param, code=code)
    return samples.astype(np.float32)


def _format_name(container) -> str:
    return str(getattr(container.format, "name", "unknown"))


def encode(chunks: Iterable[np.ndarray], sample_rate: int, name: str) -> Iterator[bytes]:
    """Encoded bytes of `chunks` (float32 mono samples) as they become available, in
    OpenAI's speech format `name`: each chunk's bytes are yielded as soon as the encoder
    gives them, the rest when the samples end."""
    import av

    fmt = OUTPUT_FORMATS[name]
    if fmt.container is None:
        for chunk in chunks:
            yield _pcm16(chunk).tobytes()
        return
    sink = _Sink()
    options = {"write_xing": "0"} if fmt.container == "mp3" else {}
    with av.open(sink, mode="w", format=fmt.container, options=options) as container:
        rate = fmt.sample_rate or sample_rate
        stream = container.add_stream(fmt.codec, rate=rate, layout="mono")
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=rate)
        for chunk in chunks:
            frame = av.AudioFrame.from_ndarray(
                chunk.astype(np.float32)[None], format="flt", layout="mono"
            )
            frame.sample_rate = sample_rate
            for part in resampler.resample(frame):
                for packet in stream.encode(part):
                    container.mux(packet)
            yield sink.take()
        for part in resampler.resample(None):
            for packet in stream.encode(part):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    yield sink.take()


def _pcm16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")


def pcm16_bytes(samples: np.ndarray) -> bytes:
    """Float32 samples as raw signed 16-bit little-endian (the Realtime API's audio/pcm)."""
    return _pcm16(samples).tobytes()


def pcm16_samples(data: bytes) -> np.ndarray:
    """Raw signed 16-bit little-endian audio as float32 samples; a 400 for an odd length."""
    if len(data) % 2:
        raise bad_request("16-bit PCM audio must be an even number of bytes.", "audio")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


class Resampler:
    """Mono float32 samples from one rate to another, a piece at a time: the filter's
    state carries across pieces, so a stream resampled in parts equals it resampled whole."""

    def __init__(self, rate: int, to: int):
        import av

        self._rate = rate
        self._same = rate == to
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=to)

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        if self._same or samples.size == 0:
            return samples.astype(np.float32)
        import av

        frame = av.AudioFrame.from_ndarray(
            samples.astype(np.float32)[None], format="flt", layout="mono"
        )
        frame.sample_rate = self._rate
        return _joined(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """What the filter still holds, at the end of the stream."""
        return np.zeros(0, np.float32) if self._same else _joined(self._resampler.resample(None))


def resample(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    """A whole clip at another rate."""
    resampler = Resampler(rate, to)
    return np.concatenate([resampler(samples), resampler.flush()])


def _joined(frames) -> np.ndarray:
    parts = [f.to_ndarray().reshape(-1) for f in frames]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


class _Sink(io.RawIOBase):
    """A write-only file PyAV muxes into; what was written is taken as it comes. A
    container that seeks back to finish its header (wav) rewrites bytes still held."""

    def __init__(self):
        self._held = bytearray()
        self._taken = 0  # bytes already given out
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data) -> int:
        self._held[self._pos - self._taken : self._pos - self._taken + len(data)] = data
        self._pos += len(data)
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._held)
        self._taken += len(out)
        self._held.clear()
        return out
