"""How long a chat stream stalls while the same server embeds: the longest gap between
two tokens of a streamed reply (the 50M bench model), and its tokens per second, alone,
while another chat request's 2,000-token prompt is processed (the prefill-chunk stall a
chat user already sees), and while an embedding request of 64 inputs of 950 tokens runs on
an embedding model beside it (the 50M network with last-token pooling; the request is
dropped, by closing its connection, when the stream ends). Median of 3 rounds.

    make bench-embedding-fairness [ARGS="--source DIR"]

--source runs the server from another checkout of mlxserve (to compare with a version
before a change), with this virtualenv.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import models

ROUNDS = 3
WORDS = "the quick brown fox jumps over the lazy dog and runs far away "


def embedding_folder(chat: Path) -> Path:
    """The chat model's folder as a sentence-transformers embedding model (last-token
    pooling): its files linked, modules.json and the pooling config written."""
    out = chat.with_name(chat.name + "-embed")
    if not (out / "modules.json").is_file():
        out.mkdir(exist_ok=True)
        for item in chat.iterdir():
            if not (out / item.name).exists():
                (out / item.name).symlink_to(item)
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            },
        ]
        (out / "1_Pooling").mkdir(exist_ok=True)
        pooling = {"pooling_mode_lasttoken": True, "word_embedding_dimension": 512}
        (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        (out / "modules.json").write_text(json.dumps(modules))
    return out


def start(chat: Path, other: Path, source: Path | None) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "mlxserve", "--model", str(chat), "--model", str(other)]
    command += ["--port", "0", "--speculation", "off"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=source
    )
    for line in process.stdout:  # type: ignore[union-attr]
        if "mlxserve is ready:" in line:
            url = line.split("ready:")[1].split()[0].removesuffix("/v1")
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()  # type: ignore[union-attr]
            return process, url
    raise SystemExit("the server did not start")


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def stream_gaps(url: str, chat: str, during, tokens: int = 120) -> tuple[float, float]:
    """(the longest pause between two streamed tokens, tokens per second) while `during`
    runs beside it; `during` gets an event set when the stream ends."""
    body = {"model": chat, "messages": [{"role": "user", "content": "Tell me a story."}]}
    body |= {"max_tokens": tokens, "stream": True, "temperature": 0}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    arrivals: list[float] = []
    ended = threading.Event()
    side = None
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {"):
                arrivals.append(time.perf_counter())
                if len(arrivals) == 10 and during is not None:
                    side = threading.Thread(target=during, args=(ended,))
                    side.start()
    ended.set()
    if side is not None:
        side.join()
    measured = arrivals[10:]
    gap = max(b - a for a, b in itertools.pairwise(measured))
    return gap, (len(measured) - 1) / (measured[-1] - measured[0])


def compare(url: str, chat: Path, beside_name: str, beside, tokens: int = 120) -> None:
    """Print a stream's longest gap and speed (median of ROUNDS) alone, beside another
    chat request's 2,000-token prefill, and beside `beside`, which drops its request when
    the stream ends; then the ratio of `beside`'s stall to the prefill's. `tokens`: the
    stream's length (long enough to outlast what `beside` does, to measure all of it)."""

    def prefill(ended: threading.Event) -> None:
        message = {"role": "user", "content": WORDS * 160 + str(time.time())}  # ~2,000 tokens
        body = {"model": str(chat), "messages": [message], "max_tokens": 1}
        post(url, "/v1/chat/completions", body)

    results = {}
    for name, during in (("alone", None), ("2,000-token prefill", prefill), (beside_name, beside)):
        rounds = [stream_gaps(url, str(chat), during, tokens) for _ in range(ROUNDS)]
        results[name] = tuple(statistics.median(r[k] for r in rounds) for k in (0, 1))
        time.sleep(2)  # a dropped request's last piece ends
    print(f"a stream of {chat.name} (median of {ROUNDS}): longest gap, tokens per second")
    for name, (gap, speed) in results.items():
        print(f"  {name:22s} {gap * 1000:8.0f} ms  {speed:6.1f} tok/s")
    ratio = results[beside_name][0] / results["2,000-token prefill"][0]
    print(f"  longest gap, {beside_name} / prefill stall: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", type=Path, help="another mlxserve checkout to run")
    args = parser.parse_args()
    chat = models.build(models.MODELS["50m"])
    embed = embedding_folder(chat)
    process, url = start(chat, embed, args.source)
    try:
        inputs = [WORDS * 75] * 64  # 64 inputs of about 950 tokens

        def embedding(ended: threading.Event) -> None:
            host = url.removeprefix("http://")
            connection = http.client.HTTPConnection(host, timeout=600)
            body = json.dumps({"model": str(embed), "input": inputs})
            connection.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            ended.wait()
            connection.close()  # the server stops the request at its next batch

        post(url, "/v1/embeddings", {"model": str(embed), "input": inputs[:2]})  # warm-up
        compare(url, chat, "64 x 950 embeddings", embedding)
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
