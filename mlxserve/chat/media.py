"""A request's media parts -> what a vision-language model's processor takes: images
(decoded by `images.py`), video clips sampled into frames (`video/codec.py`) and audio
clips as samples at the processor's rate (`audio/codec.py`), each with the SHA-256 of its
bytes, which the prompt cache keys on.

Runs on HTTP threads (no MLX); every failure is a 400 naming the part."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from mlxserve.audio.codec import decode as decode_audio
from mlxserve.chat.images import ImageLimits, load_image
from mlxserve.chat.sources import SourceRules, read_source
from mlxserve.config import ServerConfig
from mlxserve.protocol.request import AudioPart, ImagePart, MediaPart, VideoPart
from mlxserve.video.codec import VideoLimits, decode_video


@dataclass(frozen=True)
class MediaLimits:
    """What a request's images, clips and audio may be (from `config.ServerConfig`)."""

    image: ImageLimits
    video: VideoLimits
    video_sources: SourceRules
    audio_sources: SourceRules
    max_audio_seconds: float

    @classmethod
    def from_config(cls, config: ServerConfig) -> MediaLimits:
        image = ImageLimits.from_config(config)
        where = (image.fetch_timeout, image.allowed_dirs, image.allow_local_urls)
        return cls(
            image=image,
            video=VideoLimits(
                config.max_video_seconds,
                config.video_fps,
                config.max_video_fps,
                config.max_video_frames,
            ),
            video_sources=SourceRules("video", config.max_video_bytes, "--max-video-bytes", *where),
            audio_sources=SourceRules("audio", config.max_audio_bytes, "--max-audio-bytes", *where),
            max_audio_seconds=config.max_audio_seconds,
        )


@dataclass(frozen=True)
class LoadedMedia:
    kind: str  # "image", "video" or "audio"
    value: Any  # a PIL image, a video/codec.Clip, or float32 mono samples
    digest: bytes  # sha256 of the part's bytes: the prompt cache keys on it


def load_media(part: MediaPart, limits: MediaLimits, audio_rate: int) -> LoadedMedia:
    """The part decoded, or a 400 naming it; audio resampled to `audio_rate`."""
    if isinstance(part, ImagePart):
        image = load_image(part.url, part.param, limits.image)
        return LoadedMedia("image", image.image, image.digest)
    if isinstance(part, VideoPart):
        data = read_source(part.url, part.param, limits.video_sources)
        clip = decode_video(data, part.param, limits.video, part.fps)
        digest = hashlib.sha256(data)
        digest.update(repr(clip.timestamps).encode())  # other frames of it: another key
        return LoadedMedia("video", clip, digest.digest())
    assert isinstance(part, AudioPart)
    data = read_source(part.url, part.param, limits.audio_sources)
    samples = decode_audio(
        data, audio_rate, part.param, limits.max_audio_seconds, code="invalid_audio"
    )
    return LoadedMedia("audio", samples, hashlib.sha256(data).digest())
