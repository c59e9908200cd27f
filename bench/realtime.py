"""A spoken question answered aloud, on one server: over the Realtime API (/v1/realtime)
against the same exchange done by a client as three HTTP calls (transcribe the recording,
then a chat completion, then /v1/audio/speech streamed as pcm). Measured from the end of
the user's speech to the first byte of the answer's audio, and to its last: median of 3
rounds for each of

- `chain`: the three calls, each waiting for the one before;
- `realtime push-to-talk`: the recording appended as it was spoken, then commit and
  response.create (`turn_detection: null`);
- `realtime server VAD`: the recording streamed at the pace it was spoken, then silence;
  the server hears the end of the turn (its 500 ms of silence are part of the time).

The chat model answers with the same instructions, temperature 0 and `--tokens` tokens in
each. Whisper and KittenTTS are the test fixtures'; the chat model a bench model (random
weights: its answer runs on without sentence ends, so the realtime path speaks it in
200-character pieces) or `fixture` (tiny-chat).

    make bench-realtime [ARGS="--chat 350m --tokens 128"]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import models
import numpy as np
from harness import Target
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "fixtures"))
import audio_fixture
import catalog

from mlxserve.audio.codec import decode, encode, pcm16_bytes

RATE = 24_000
ROUNDS = 3
INSTRUCTIONS = "You are a helpful assistant. Answer briefly: your words are spoken."
PIECE = RATE // 10  # 100 ms an append
HEARING, SPEAKING = str(catalog.whisper_model()), str(catalog.kitten_model())


def recording() -> np.ndarray:
    """The fixture's sentences spoken by espeak-ng, at 24 kHz."""
    return decode(audio_fixture.speak(" ".join(audio_fixture.UTTERANCES[:2])), RATE)


def wav(samples: np.ndarray) -> bytes:
    return b"".join(encode([samples], RATE, "wav"))


def chain(port: int, chat: str, voice: np.ndarray, tokens: int) -> tuple[float, float]:
    """(first audio byte, last) in seconds after the speech ended, and the audio's
    seconds, over three calls (the
    transcription and speech models named: the chat model is the server's default)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    boundary = uuid.uuid4().hex
    form = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{HEARING}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="q.wav"\r\n\r\n'
        ).encode()
        + wav(voice)
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    connection.request("POST", "/v1/audio/transcriptions", form, headers)
    heard = json.loads(connection.getresponse().read())["text"]
    body = {
        "model": chat,
        "temperature": 0,
        "max_tokens": tokens,
        "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": heard},
        ],
    }
    connection.request("POST", "/v1/chat/completions", json.dumps(body))
    answer = json.loads(connection.getresponse().read())["choices"][0]["message"]["content"]
    body = {
        "model": SPEAKING,
        "input": answer[:4096] or ".",
        "voice": "alloy",
        "response_format": "pcm",
        "stream_format": "audio",
    }
    connection.request("POST", "/v1/audio/speech", json.dumps(body))
    response = connection.getresponse()
    assert response.status == 200, response.read()
    audio = response.read1(1)
    first = time.perf_counter() - started
    audio += response.read()
    return first, time.perf_counter() - started, len(audio) / 2 / RATE


def realtime(port: int, chat: str, voice: np.ndarray, tokens: int, vad: bool):
    """(first audio byte, last) in seconds after the speech ended, and the audio's
    seconds, over /v1/realtime."""
    with connect(f"ws://127.0.0.1:{port}/v1/realtime?model={chat}", max_size=None) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        detection = {"type": "server_vad", "silence_duration_ms": 500} if vad else None
        session = {
            "type": "realtime",
            "instructions": INSTRUCTIONS,
            "temperature": 0,
            "max_output_tokens": tokens,
            "audio": {"input": {"turn_detection": detection}},
        }
        ws.send(json.dumps({"type": "session.update", "session": session}))
        assert json.loads(ws.recv())["type"] == "session.updated"
        paced = np.concatenate([voice, np.zeros(2 * RATE, np.float32)]) if vad else voice
        start = time.perf_counter()
        for i in range(0, paced.size, PIECE):
            if vad:  # as the microphone gives it
                time.sleep(max(0.0, start + i / RATE - time.perf_counter()))
            audio = base64.b64encode(pcm16_bytes(paced[i : i + PIECE])).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        ended = start + voice.size / RATE if vad else time.perf_counter()
        if not vad:
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            ws.send(json.dumps({"type": "response.create"}))
        first, samples = None, 0
        while True:
            event = json.loads(ws.recv())
            assert event["type"] != "error", event
            if event["type"] == "response.output_audio.delta":
                samples += len(base64.b64decode(event["delta"])) // 2
                if first is None:
                    first = time.perf_counter() - ended
            if event["type"] == "response.done":
                assert first is not None, event
                return first, time.perf_counter() - ended, samples / RATE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chat", default="50m", choices=[*sorted(models.MODELS), "fixture"])
    parser.add_argument("--tokens", type=int, default=96, help="the answer's tokens")
    args = parser.parse_args()
    import mlx.core as mx

    chat = (
        catalog.tiny_model() if args.chat == "fixture" else models.build(models.MODELS[args.chat])
    )
    voice = recording()
    print(
        f"device {mx.default_device()}, {chat.name}, a {voice.size / RATE:.1f} s question, ", end=""
    )
    print(f"{args.tokens}-token answers")
    target = Target("mlxserve", chat, "--model", HEARING, "--model", SPEAKING)
    paths = {
        "chain": lambda: chain(target.port, str(chat), voice, args.tokens),
        "realtime push-to-talk": lambda: realtime(
            target.port, str(chat), voice, args.tokens, False
        ),
        "realtime server VAD": lambda: realtime(target.port, str(chat), voice, args.tokens, True),
    }
    try:
        for run in paths.values():
            run()  # warm: each model loaded, each kernel compiled
        results = {name: [run() for _ in range(ROUNDS)] for name, run in paths.items()}
    finally:
        target.stop()
    print(f"{'':24s} first audio   last audio  (s after the speech ended, median of {ROUNDS})")
    print(f"{'':24s} {'':10s}   {'':10s}   audio s (how much was spoken)")
    medians = {}
    for name, rows in results.items():
        medians[name] = [statistics.median(r[k] for r in rows) for k in (0, 1, 2)]
        first, last, spoken = medians[name]
        print(f"{name:24s} {first:10.3f}   {last:10.3f}   {spoken:7.1f}")
    for name in list(paths)[1:]:
        print(f"{name} / chain, first audio: {medians[name][0] / medians['chain'][0]:.2f}x")


if __name__ == "__main__":
    main()
