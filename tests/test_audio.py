"""Speech to text and text to speech through OpenAI's audio endpoints, on a Whisper that has
learned espeak-ng utterances and a KittenTTS, served by one server: the `openai` SDK and
raw multipart HTTP, every response format, streams, and bad input as 4xx."""

from __future__ import annotations

import http.client
import io
import json
import urllib.request
import uuid

import av
import numpy as np
import openai
import pytest
from audio_fixture import KITTEN_VOICES, UTTERANCES, speak
from helpers.server import start_server

from mlxserve.audio.codec import decode
from mlxserve.audio.service import SPEECH_SEED
from mlxserve.audio.speech import SpeechRequest, Synthesizer
from mlxserve.audio.transcription import SteppedWindow, Transcriber, TranscriptionOptions


@pytest.fixture(scope="module")
def server(whisper_model, kitten_model):
    srv = start_server(whisper_model, "--model", str(kitten_model), "--max-audio-bytes", "2000000")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none")


def form(fields: dict, file: bytes, name: str = "speech.wav") -> tuple[bytes, str]:
    """A multipart form with `file` in its field "file": (body, content type)."""
    boundary = uuid.uuid4().hex
    parts = []
    for key, value in fields.items():
        for item in value if isinstance(value, list) else [value]:
            parts.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{item}\r\n'.encode()
            )
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + file
        + b"\r\n"
    )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def upload(server, path: str, fields: dict, file: bytes, name: str = "speech.wav"):
    """A multipart form POST; returns (status, content type, body bytes)."""
    body, content_type = form(fields, file, name)
    request = urllib.request.Request(
        server.url + path, data=body, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def as_format(wav: bytes, container: str, codec: str) -> bytes:
    """The recording re-encoded (mp3, flac, ogg, m4a, webm) with PyAV."""
    samples = decode(wav, 16_000)
    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as c:
        stream = c.add_stream(codec, rate=48_000 if codec == "libopus" else 16_000, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None], format="flt", layout="mono")
        frame.sample_rate = 16_000
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=stream.rate)
        for part in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(part):
                c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize("text", UTTERANCES)
def test_the_sdk_transcribes_an_espeak_recording(client, whisper_model, text):
    result = client.audio.transcriptions.create(
        model=str(whisper_model), file=("speech.wav", speak(text))
    )
    assert result.text == text


@pytest.mark.parametrize(
    "container, codec",
    [
        ("mp3", "libmp3lame"),
        ("flac", "flac"),
        ("ogg", "libopus"),
        ("ipod", "aac"),
        ("webm", "libopus"),
    ],
)
def test_other_formats_decode_in_process(server, whisper_model, container, codec):
    """Each file's audio reaches the model whole: its duration is the recording's (a lossy
    codec's padding aside); a lossless one is heard word for word."""
    wav = speak(UTTERANCES[0])
    fields = {"model": str(whisper_model), "response_format": "verbose_json"}
    status, _, body = upload(
        server, "/v1/audio/transcriptions", fields, as_format(wav, container, codec)
    )
    assert status == 200, body
    seconds = len(decode(wav, 16_000)) / 16_000
    assert json.loads(body)["duration"] == pytest.approx(seconds, abs=0.15)
    if container == "flac":
        assert json.loads(body)["text"] == UTTERANCES[0]


def test_verbose_json_has_segments_and_words(client, whisper_model):
    result = client.audio.transcriptions.create(
        model=str(whisper_model),
        file=("speech.wav", speak(UTTERANCES[3])),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert result.text == UTTERANCES[3]
    assert result.language == "english" and result.duration > 1.0
    segment = result.segments[0]
    assert 0.0 == segment.start <= segment.end <= result.duration + 0.5
    assert segment.text.strip() == UTTERANCES[3]
    assert [w.word for w in result.words] == UTTERANCES[3].split()
    assert all(w.start <= w.end for w in result.words)


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt"])
def test_text_and_subtitles(server, whisper_model, fmt):
    fields = {"model": str(whisper_model), "response_format": fmt}
    status, content_type, body = upload(
        server, "/v1/audio/transcriptions", fields, speak(UTTERANCES[0])
    )
    assert status == 200 and content_type.startswith("text/plain")
    text = body.decode()
    if fmt == "text":
        assert text == UTTERANCES[0] + "\n"
    elif fmt == "srt":
        assert text.startswith("1\n00:00:00,000 --> 00:00:01,")
        assert text.splitlines()[2] == UTTERANCES[0]
    else:
        assert text.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.")
        assert text.splitlines()[3] == UTTERANCES[0]


def test_a_streamed_transcription(server, whisper_model):
    fields = {"model": str(whisper_model), "stream": "true"}
    status, content_type, body = upload(
        server, "/v1/audio/transcriptions", fields, speak(UTTERANCES[2])
    )
    assert status == 200 and content_type.startswith("text/event-stream")
    events = [
        json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")
    ]
    assert [e["type"] for e in events] == ["transcript.text.delta", "transcript.text.done"]
    assert events[0]["delta"].strip() == UTTERANCES[2]
    assert events[1]["text"] == UTTERANCES[2]
    assert events[1]["usage"]["type"] == "duration"


def test_translation_to_english(client, whisper_model):
    result = client.audio.translations.create(
        model=str(whisper_model), file=("speech.wav", speak(UTTERANCES[3]))
    )
    assert result.text == UTTERANCES[3]


@pytest.fixture(scope="module")
def long_recording() -> bytes:
    """Twelve utterances, 2.5 s apart (about 50 s), as a wav file."""
    from mlxserve.audio.codec import encode

    gap = np.zeros(40_000, np.float32)
    pieces = [decode(speak(UTTERANCES[i % 4]), 16_000) for i in range(12)]
    audio = np.concatenate([np.concatenate([p, gap]) for p in pieces])
    return b"".join(encode([audio], 16_000, "wav"))


def test_a_long_recording_is_transcribed_a_window_at_a_time(server, whisper_model, long_recording):
    """Two windows, in order."""
    fields = {"model": str(whisper_model), "response_format": "verbose_json"}
    status, _, body = upload(server, "/v1/audio/transcriptions", fields, long_recording)
    assert status == 200, body
    reply = json.loads(body)
    assert reply["duration"] > 45
    starts = [s["start"] for s in reply["segments"]]
    assert starts == sorted(starts) and starts[0] == 0.0 and starts[-1] >= 30


def test_a_window_is_a_forward_pass_per_step(whisper_model):
    """What lets chat streams step between a transcription's passes: run as the server
    runs it, a window pauses before each encoder block and each decoder step (at least one
    per token of its transcript), and gives the transcript it gives in one go."""
    transcriber = Transcriber.load(whisper_model)
    audio = decode(speak(UTTERANCES[1]), 16_000)
    whole = transcriber.window(audio, 0, TranscriptionOptions(), "")
    stepped = SteppedWindow(transcriber, audio, 0, TranscriptionOptions(), "")
    steps = 1
    while (window := stepped.step()) is None:
        steps += 1
    assert window.text == whole.text == " " + UTTERANCES[1]
    blocks = json.loads((whisper_model / "config.json").read_text())["n_audio_layer"]
    assert steps >= blocks + len(whole.segments[0].tokens)


def test_a_client_that_leaves_mid_transcription_stops_it(server, whisper_model, long_recording):
    """A streamed transcription whose client leaves after the first window's text: the
    server stops at its next pass (the window abandoned on the generation thread), logs
    one line, and serves the next request."""
    fields = {"model": str(whisper_model), "stream": "true"}
    body, content_type = form(fields, long_recording)
    connection = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=120)
    connection.request("POST", "/v1/audio/transcriptions", body, {"Content-Type": content_type})
    response = connection.getresponse()
    assert response.status == 200
    while not response.readline().startswith(b"data: "):
        pass  # the first window's first delta
    connection.close()
    gone = "client closed the connection: POST /v1/audio/transcriptions"
    assert server.log_lines(gone)
    status, _, body = upload(
        server, "/v1/audio/transcriptions", {"model": str(whisper_model)}, speak(UTTERANCES[2])
    )
    assert status == 200 and json.loads(body)["text"] == UTTERANCES[2]
    assert not [line for line in server.log if "Traceback" in line or "unhandled" in line]


@pytest.mark.parametrize(
    "fields, file, status, param",
    [
        ({}, b"", 400, "file"),
        ({}, b"this is not audio at all", 400, "file"),
        ({}, b"\0" * 2_000_001, 413, "file"),
        ({"response_format": "mp4"}, None, 400, "response_format"),
        ({"language": "klingon"}, None, 400, "language"),
        ({"temperature": "2"}, None, 400, "temperature"),
        ({"stream": "true", "response_format": "srt"}, None, 400, "stream"),
        ({"timestamp_granularities[]": "syllable"}, None, 400, "timestamp_granularities"),
    ],
)
def test_bad_uploads_are_4xx(server, whisper_model, fields, file, status, param):
    data = speak(UTTERANCES[0]) if file is None else file
    got, _, body = upload(
        server, "/v1/audio/transcriptions", {"model": str(whisper_model), **fields}, data
    )
    assert got == status, body
    error = json.loads(body)["error"]
    assert error["param"] == param


def test_a_json_body_is_refused_and_the_model_must_transcribe(server, whisper_model, kitten_model):
    status, _, reply = server.post("/v1/audio/transcriptions", {"model": str(whisper_model)})
    assert status == 400 and "multipart/form-data" in reply["error"]["message"]
    status, _, body = upload(
        server, "/v1/audio/transcriptions", {"model": str(kitten_model)}, speak("hi")
    )
    assert status == 400 and json.loads(body)["error"]["code"] == "model_not_transcription"


def in_process_speech(folder, text: str, voice: str) -> np.ndarray:
    """The model's audio for `text`, its noise drawn from the server's seed."""
    import mlx.core as mx

    synthesizer = Synthesizer.load(folder)
    parts = synthesizer.parts(SpeechRequest(None, text, voice))
    audio = []
    while True:
        mx.random.seed(SPEECH_SEED)
        part = next(parts, None)
        if part is None:
            return np.concatenate(audio)
        audio.append(np.array(part.audio, np.float32).reshape(-1))


def test_the_sdk_synthesises_speech(client, kitten_model):
    text = "Hello there, this is a test."
    expected = in_process_speech(kitten_model, text, KITTEN_VOICES[0])
    reply = client.audio.speech.create(
        model=str(kitten_model), voice=KITTEN_VOICES[0], input=text, response_format="pcm"
    )
    samples = np.frombuffer(reply.content, "<i2").astype(np.float32) / 32767
    assert len(samples) == len(expected)
    assert np.abs(samples - np.clip(expected, -1, 1)).max() < 2e-4


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_every_format_decodes_to_the_speech(client, kitten_model, fmt):
    text = "Good morning."
    expected = in_process_speech(kitten_model, text, KITTEN_VOICES[1])
    reply = client.audio.speech.create(
        model=str(kitten_model), voice=KITTEN_VOICES[1], input=text, response_format=fmt
    )
    heard = decode(reply.content, 24_000)
    assert abs(len(heard) - len(expected)) < 0.1 * 24_000  # codecs pad a frame or two
    if fmt in ("flac", "wav"):  # lossless
        assert np.abs(heard[: len(expected)] - expected).max() < 2e-4


def test_speech_streams_as_audio_and_as_events(server, kitten_model):
    body = {
        "model": str(kitten_model),
        "voice": KITTEN_VOICES[0],
        "input": "Hello there.",
        "response_format": "pcm",
    }
    whole = urllib.request.urlopen(_json_request(server, body), timeout=120).read()
    with urllib.request.urlopen(
        _json_request(server, {**body, "stream_format": "audio"}), timeout=120
    ) as r:
        assert r.headers["Transfer-Encoding"] == "chunked"
        assert r.read() == whole
    with urllib.request.urlopen(
        _json_request(server, {**body, "stream_format": "sse"}), timeout=120
    ) as r:
        events = [
            json.loads(line[6:])
            for line in r.read().decode().splitlines()
            if line.startswith("data: ")
        ]
    import base64

    assert events[-1]["type"] == "speech.audio.done"
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == whole


def _json_request(server, body):
    return urllib.request.Request(
        server.url + "/v1/audio/speech",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )


def test_voices_unknown_openai_and_bad_input(server, kitten_model):
    base = {"model": str(kitten_model), "input": "Hi."}
    status, _, reply = server.post("/v1/audio/speech", {**base, "voice": "nobody"})
    assert status == 400 and reply["error"]["param"] == "voice"
    assert all(v in reply["error"]["message"] for v in KITTEN_VOICES)
    request = _json_request(server, {**base, "voice": "alloy", "response_format": "pcm"})
    with urllib.request.urlopen(request, timeout=120) as r:
        assert len(r.read()) > 0  # OpenAI's default voice: the model's first
    for bad, param in [
        ({"voice": KITTEN_VOICES[0], "input": ""}, "input"),
        ({"voice": KITTEN_VOICES[0], "input": "  \n "}, "input"),
        ({"voice": KITTEN_VOICES[0], "speed": 9}, "speed"),
        ({"voice": KITTEN_VOICES[0], "response_format": "ogg"}, "response_format"),
    ]:
        status, _, reply = server.post("/v1/audio/speech", {**base, **bad})
        assert status == 400 and reply["error"]["param"] == param, reply


def test_models_lists_the_audio_kinds(server, whisper_model, kitten_model):
    _, _, reply = server.get("/v1/models")
    kinds = {m["id"]: m["kind"] for m in reply["data"]}
    assert kinds[str(whisper_model)] == "transcription"
    assert kinds[str(kitten_model)] == "speech"


def test_audio_models_unload_and_load_like_the_others(server, client, whisper_model):
    name = str(whisper_model)
    status, _, reply = server.post("/v1/models/unload", {"model": name})
    assert status == 200 and reply["state"] == "not-loaded", reply
    text = client.audio.transcriptions.create(model=name, file=("a.wav", speak(UTTERANCES[0])))
    assert text.text == UTTERANCES[0]  # loaded again on demand
    status, _, reply = server.post("/v1/models/load", {"model": name})
    assert status == 200 and reply["state"] == "loaded", reply
