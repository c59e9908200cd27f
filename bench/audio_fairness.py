"""How long a chat stream stalls while the same server transcribes a minute of speech: the
longest gap between two tokens of a streamed reply (the 50M bench model), and its tokens
per second, alone, while another chat request's 2,000-token prompt is processed (the
prefill-chunk stall a chat user already sees), and while a 60-second espeak-ng recording
is transcribed beside it by a Whisper the size of whisper-base (74M parameters, random
weights, temperature 0.5 so that each window decodes once; the request is dropped, by
closing its connection, when the stream ends). Median of 3 rounds.

    make bench-audio-fairness [ARGS="--source DIR"]

--source runs the server from another checkout of mlxserve (to compare with a version
before a change), with this virtualenv.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import uuid
from pathlib import Path

import models
from embedding_fairness import compare, start

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "fixtures"))
import audio_fixture

BASE = {  # whisper-base's dimensions
    "model_type": "whisper",
    "n_mels": 80,
    "n_audio_ctx": 1500,
    "n_audio_state": 512,
    "n_audio_head": 8,
    "n_audio_layer": 6,
    "n_text_ctx": 448,
    "n_text_state": 512,
    "n_text_head": 8,
    "n_text_layer": 6,
}
SPEECH = " ".join(audio_fixture.UTTERANCES) + " "


def whisper_base() -> Path:
    """A random-weight Whisper of whisper-base's size, built once beside the bench models."""
    out = models.build(models.MODELS["50m"]).with_name("whisper-base-random")
    if (out / "model.safetensors").is_file():
        return out
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    out.mkdir(exist_ok=True)
    tokenizer = audio_fixture.write_processor(out, BASE["n_mels"])
    config = {**BASE, "n_vocab": len(tokenizer)}
    mx.random.seed(0)
    model = Model(ModelDimensions.from_dict(config))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(config))
    return out


def a_minute_of_speech() -> bytes:
    """espeak-ng reading the fixture's sentences over and over, cut at 60 seconds."""
    from mlxserve.audio.codec import decode, encode

    samples = decode(audio_fixture.speak(SPEECH * 12), 16_000)[: 60 * 16_000]
    return b"".join(encode([samples], 16_000, "flac"))


def form(fields: dict[str, str], audio: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.flac"\r\n\r\n'.encode()
        + audio
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), boundary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", type=Path, help="another mlxserve checkout to run")
    args = parser.parse_args()
    chat = models.build(models.MODELS["50m"])
    whisper = whisper_base()
    audio = a_minute_of_speech()
    process, url = start(chat, whisper, args.source)
    try:
        body, boundary = form({"model": str(whisper), "temperature": "0.5"}, audio)
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}

        def transcription(ended: threading.Event) -> None:
            connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=600)
            connection.request("POST", "/v1/audio/transcriptions", body, headers)
            ended.wait()
            connection.close()  # the server stops the request at its next piece

        started = time.perf_counter()
        connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=900)
        connection.request("POST", "/v1/audio/transcriptions", body, headers)
        connection.getresponse().read()  # warm-up, and the time the minute takes alone
        alone = time.perf_counter() - started
        print(f"the 60 s recording alone: transcribed in {alone:.1f} s")
        compare(url, chat, "60 s transcription", transcription)
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
