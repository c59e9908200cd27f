"""A video file -> the frames a vision-language model reads, in-process with PyAV
(FFmpeg's libraries, bundled in its wheels): any container and codec FFmpeg reads (mp4,
mov, webm, mkv, avi; H.264, HEVC, VP8/9, AV1, MPEG-4), never a shelled-out binary.

Frames are sampled evenly over the clip at the request's rate, at most `max_frames` (a
longer clip is sampled more sparsely), and shrunk to at most FRAME_PIXELS each; the
model's processor then resizes them as the model wants. Runs on HTTP threads (no MLX);
every failure is a 400 naming the content part."""

from __future__ import annotations

import io
import math
import threading
from dataclasses import dataclass

import numpy as np

from mlxserve.protocol.errors import bad_request

# Frames are shrunk to this many pixels (aspect kept) as they are decoded: above what
# Qwen-VL's video processors keep a frame at (768 patches of 28x28, 0.6 MP), so no model
# sees less, and a clip's frames stay small in memory (32 frames: 75 MB).
FRAME_PIXELS = 1024 * 768
# Where the next frame wanted lies this many seconds or more on, the decoder seeks to the
# keyframe before it instead of decoding every frame between (keyframes come every few
# seconds at most in the clips people record).
SEEK_GAP = 2.0
# Clips decoded at once, whatever the number of requests: bounds the peak memory and CPU.
_DECODING = threading.BoundedSemaphore(2)


@dataclass(frozen=True)
class VideoLimits:
    """What a request's clips may be (their defaults: `config.ServerConfig`)."""

    max_seconds: float
    fps: float  # frames sampled a second where a request names no rate
    max_fps: float  # the highest rate a request may ask for
    max_frames: int  # frames sampled from one clip at most


@dataclass(frozen=True)
class Clip:
    frames: np.ndarray  # [frames, height, width, 3] uint8 RGB
    fps: float  # the rate the frames were sampled at (lower than asked where capped)
    timestamps: tuple[float, ...]  # seconds into the clip, each frame's


def decode_video(data: bytes, param: str, limits: VideoLimits, fps: float | None) -> Clip:
    """The clip's frames sampled at `fps` (None: the server's rate), or a 400 naming
    `param`: not a video PyAV reads, longer than the limit, a rate beyond the limit."""
    import av

    rate = limits.fps if fps is None else fps
    if rate > limits.max_fps:
        raise bad_request(
            f"A video is sampled at {limits.max_fps} frames a second at most on this server "
            f"(see --max-video-fps); this part asks for {rate}.",
            param=param,
            code="invalid_video",
        )
    if not data:
        raise bad_request("The video is empty.", param=param, code="invalid_video")
    try:
        with _DECODING, av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise bad_request(
                    "The file has no video stream.", param=param, code="invalid_video"
                )
            stream = container.streams.video[0]
            duration = _duration(container, stream)
            if duration > limits.max_seconds:
                raise _too_long(duration, limits, param)
            count = max(1, min(limits.max_frames, math.ceil(duration * rate)))
            wanted = [duration * (i + 0.5) / count for i in range(count)]
            container.seek(0)
            frames, times = _sampled(container, stream, wanted, limits, param)
    except av.FFmpegError as e:
        raise bad_request(
            f"The data is not a video this server decodes (mp4, mov, webm, mkv, ...): {e}",
            param=param,
            code="invalid_video",
        ) from e
    if not frames:
        raise bad_request("The video holds no frames.", param=param, code="invalid_video")
    return Clip(np.stack(frames), len(frames) / max(duration, 1e-6), tuple(times))


def _duration(container, stream) -> float:
    """The clip's length in seconds: as the stream or container declares it, else from
    its packets' timestamps (a recording streamed to a file may declare none)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    end = 0.0
    for packet in container.demux(stream):
        if packet.pts is not None and packet.time_base is not None:
            end = max(end, float((packet.pts + (packet.duration or 0)) * packet.time_base))
    return end


def _sampled(container, stream, wanted: list[float], limits: VideoLimits, param: str):
    """The frame on screen at each of the `wanted` times: decoded on from the last one,
    or, where the next is SEEK_GAP or more later, from the keyframe before it (a long
    clip sampled sparsely is not decoded whole)."""
    frames: list[np.ndarray] = []
    times: list[float] = []
    half = _half_frame(stream)
    for target in wanted:
        if frames and target - times[-1] >= SEEK_GAP:
            container.seek(int(target / stream.time_base), stream=stream, backward=True)
        for frame in container.decode(stream):
            at = frame.time if frame.time is not None else 0.0
            if at > limits.max_seconds:
                raise _too_long(at, limits, param)
            if at + half >= target:
                frames.append(_rgb(frame))
                times.append(round(at, 3))
                break
    return frames, times


def _half_frame(stream) -> float:
    rate = stream.average_rate or stream.guessed_rate
    return 0.5 / float(rate) if rate else 0.0


def _rgb(frame) -> np.ndarray:
    pixels = frame.width * frame.height
    if pixels > FRAME_PIXELS:
        scale = (FRAME_PIXELS / pixels) ** 0.5
        width, height = max(2, int(frame.width * scale)), max(2, int(frame.height * scale))
        return frame.to_ndarray(format="rgb24", width=width, height=height)
    return frame.to_ndarray(format="rgb24")


def _too_long(seconds: float, limits: VideoLimits, param: str):
    return bad_request(
        f"The video is {seconds:.1f} s long, longer than the server's limit of "
        f"{limits.max_seconds:g} s (see --max-video-seconds).",
        param=param,
        code="video_too_long",
    )
