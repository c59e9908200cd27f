"""Video clips -> sampled frames (video/codec.py), and audio parts -> samples: the frames
taken at the right times from every container, a long clip sampled sparsely by seeking,
and every limit a 400 naming the part."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from conversations import COLOURS, tone_wav

from mlxserve.audio.codec import decode
from mlxserve.protocol.errors import ServiceError
from mlxserve.video.codec import VideoLimits, decode_video

PARAM = "messages[0].content[0]"
LIMITS = VideoLimits(max_seconds=60.0, fps=2.0, max_fps=8.0, max_frames=32)
ORDER = list(COLOURS)  # the colour of second k of a clip: ORDER[k % 3]


def seconds_clip(
    seconds: int, codec: str = "mpeg4", container: str = "mp4", side: int = 64
) -> bytes:
    """A clip at 10 fps whose colour changes every second (keyframes every 12 frames)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=10)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = 12
        for i in range(seconds * 10):
            pixels = np.full((side, side, 3), COLOURS[ORDER[(i // 10) % 3]], np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def colours(frames: np.ndarray) -> list[str]:
    """The colour each frame shows (the nearest of COLOURS at its centre)."""
    named = []
    for frame in frames:
        pixel = frame[frame.shape[0] // 2, frame.shape[1] // 2].astype(int)
        named.append(min(COLOURS, key=lambda c: np.abs(pixel - COLOURS[c]).sum()))
    return named


def refused(code: str, *args) -> None:
    with pytest.raises(ServiceError) as caught:
        decode_video(*args)
    assert (caught.value.code, caught.value.param) == (code, PARAM)


@pytest.mark.parametrize(
    ("codec", "container"),
    [("mpeg4", "mp4"), ("libx264", "mp4"), ("libvpx-vp9", "webm"), ("mpeg4", "avi")],
)
def test_frames_are_sampled_at_the_rate_at_their_times(codec, container):
    clip = decode_video(seconds_clip(3, codec, container), PARAM, LIMITS, None)
    assert clip.frames.shape == (6, 64, 64, 3) and clip.frames.dtype == np.uint8
    assert clip.timestamps == (0.2, 0.7, 1.2, 1.7, 2.2, 2.7)
    assert clip.fps == pytest.approx(2.0)
    assert colours(clip.frames) == ["red", "red", "blue", "blue", "green", "green"]


def test_a_request_rate_and_the_frame_budget():
    data = seconds_clip(4)
    assert len(decode_video(data, PARAM, LIMITS, 4.0).frames) == 16
    assert len(decode_video(data, PARAM, LIMITS, 0.5).frames) == 2
    sparse = decode_video(data, PARAM, VideoLimits(60.0, 2.0, 8.0, 3), None)
    assert sparse.fps == pytest.approx(0.75)  # 3 frames over 4 seconds
    refused("invalid_video", data, PARAM, LIMITS, 9.0)


def test_a_long_clip_sampled_sparsely_takes_each_second_it_names():
    """Frames 3 seconds apart: the decoder seeks to the keyframe before each."""
    clip = decode_video(seconds_clip(24), PARAM, VideoLimits(60.0, 2.0, 8.0, 8), None)
    assert clip.timestamps == (1.5, 4.5, 7.5, 10.5, 13.5, 16.5, 19.5, 22.5)
    expected = [ORDER[int(t) % 3] for t in clip.timestamps]
    assert colours(clip.frames) == expected


def test_large_frames_are_shrunk_as_they_are_decoded():
    clip = decode_video(seconds_clip(1, side=1600), PARAM, LIMITS, None)
    height, width = clip.frames.shape[1:3]
    assert height * width <= 1024 * 768 and height == width


def test_what_is_no_video_or_too_long_is_refused():
    refused("invalid_video", b"", PARAM, LIMITS, None)
    refused("invalid_video", b"not a video at all", PARAM, LIMITS, None)
    refused("invalid_video", tone_wav("low"), PARAM, LIMITS, None)  # audio only
    refused("video_too_long", seconds_clip(4), PARAM, VideoLimits(3.0, 2.0, 8.0, 32), None)


def test_an_audio_part_is_resampled_and_its_limit_named():
    samples = decode(tone_wav("low", 1.0, rate=44100), 16000, PARAM, 5.0, "invalid_audio")
    assert samples.dtype == np.float32 and abs(len(samples) - 16000) < 100
    with pytest.raises(ServiceError) as caught:
        decode(tone_wav("low", 2.0), 16000, PARAM, 1.5, "invalid_audio")
    assert (caught.value.code, caught.value.param) == ("audio_too_long", PARAM)
    with pytest.raises(ServiceError) as caught:
        decode(b"not audio", 16000, PARAM, 5.0, "invalid_audio")
    assert (caught.value.code, caught.value.param) == ("invalid_audio", PARAM)
