"""How long a chat stream stalls while the same server embeds: the longest gap between
two tokens of a streamed reply (the 50M bench model) alone, while another chat request's
2,000-token prompt is processed (the prefill-chunk stall a chat user already sees), and
while an embedding request of 64 inputs of 950 tokens runs on an embedding model beside
it (the 50M network with last-token pooling). Median of 3 rounds.

    .venv/bin/python bench/embedding_fairness.py [--source DIR]

--source runs the server from another checkout of mlxserve (to compare with a version
before a change), with this virtualenv.
"""

from __future__ import annotations

import argparse
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
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        (out / "1_Pooling").mkdir(exist_ok=True)
        pooling = {"pooling_mode_lasttoken": True, "word_embedding_dimension": 512}
        (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        (out / "modules.json").write_text(json.dumps(modules))
    return out


def start(chat: Path, embed: Path, source: Path | None) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "mlxserve", "--model", str(chat), "--model", str(embed)]
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


def longest_gap(url: str, chat: str, during) -> float:
    """The longest pause between two streamed tokens while `during` runs beside it."""
    body = {"model": chat, "messages": [{"role": "user", "content": "Tell me a story."}]}
    body |= {"max_tokens": 300, "stream": True, "temperature": 0}
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    arrivals: list[float] = []
    side = None
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {"):
                arrivals.append(time.perf_counter())
                if len(arrivals) == 20 and during is not None:
                    side = threading.Thread(target=during)
                    side.start()
    if side is not None:
        side.join()
    return max(b - a for a, b in zip(arrivals[20:], arrivals[21:], strict=False))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", type=Path, help="another mlxserve checkout to run")
    args = parser.parse_args()
    chat = models.build(models.MODELS["50m"])
    embed = embedding_folder(chat)
    process, url = start(chat, embed, args.source)
    try:
        long_prompt = WORDS * 160  # about 2,000 tokens
        inputs = [WORDS * 75] * 64  # 64 inputs of about 950 tokens

        def prefill() -> None:
            message = {"role": "user", "content": long_prompt + str(time.time())}
            post(url, "/v1/chat/completions", {"model": str(chat), "messages": [message], "max_tokens": 1})

        def embedding() -> None:
            post(url, "/v1/embeddings", {"model": str(embed), "input": inputs})

        post(url, "/v1/embeddings", {"model": str(embed), "input": inputs[:2]})  # warm-up
        results = {}
        for name, during in (("alone", None), ("2,000-token prefill", prefill), ("64 x 950 embeddings", embedding)):
            results[name] = statistics.median(longest_gap(url, str(chat), during) for _ in range(ROUNDS))
        print(f"longest gap between two streamed tokens ({chat.name}, median of {ROUNDS}):")
        for name, gap in results.items():
            print(f"  {name:22s} {gap * 1000:8.0f} ms")
        ratio = results["64 x 950 embeddings"] / results["2,000-token prefill"]
        print(f"  embeddings / prefill stall: {ratio:.2f}x")
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
