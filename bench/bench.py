"""Single-stream benchmark: mlxserve vs mlx_lm.server vs raw mlx_lm.stream_generate.

Black-box: both servers run as subprocesses from this venv on the same model and are
measured over HTTP with streaming, in interleaved rounds (A, B, A, B...). The raw
in-process `stream_generate` run is the limit both are compared against. Every run
decodes exactly `--tokens` tokens (the end-of-turn token is forbidden by logit_bias).

    make bench                      # the demo model
    make bench ARGS="--model PATH --rounds 5 --tokens 256"
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROMPT = "Write a long story about a fisherman and a silver bottle."


@dataclass
class Sample:
    ttft: float  # seconds to the first token
    decode_tps: float  # tokens per second after the first


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, process: subprocess.Popen, path: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"server on port {port} did not start")


def start(name: str, model: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    module = {"mlxserve": "mlxserve", "mlx_lm.server": "mlx_lm.server"}[name]
    command = [sys.executable, "-m", module, "--model", model, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, process, "/health" if name == "mlxserve" else "/v1/models")
    return process, port


def http_sample(port: int, body: dict) -> Sample:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = conn.getresponse()
    stamps = []
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            stamps.append(time.perf_counter())
    conn.close()
    return Sample(stamps[0] - start, (len(stamps) - 1) / (stamps[-1] - stamps[0]))


def raw_sample(model, tokenizer, prompt: list[int], tokens: int, end_token: int) -> Sample:
    import mlx.core as mx
    from mlx_lm import stream_generate

    def no_end(_tokens, logits):
        return logits.at[:, end_token].add(mx.array(-100.0))

    start = time.perf_counter()
    stamps = []
    for _ in stream_generate(
        model, tokenizer, prompt, max_tokens=tokens, logits_processors=[no_end]
    ):
        stamps.append(time.perf_counter())
    return Sample(stamps[0] - start, (len(stamps) - 1) / (stamps[-1] - stamps[0]))


def summary(values: list[float]) -> str:
    return f"{min(values):8.3f} {statistics.median(values):8.3f} {max(values):8.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()

    from mlx_lm import load

    from mlxserve.models.provider import resolve_model_path

    path = str(resolve_model_path(args.model))
    model, tokenizer = load(path)
    messages = [{"role": "user", "content": PROMPT}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    end_token = next(iter(tokenizer.eos_token_ids))
    body = {
        "messages": messages,
        "max_tokens": args.tokens,
        "stream": True,
        "temperature": 0.0,
        "logit_bias": {str(end_token): -100},
    }
    servers = {name: start(name, path) for name in ("mlxserve", "mlx_lm.server")}
    results: dict[str, list[Sample]] = {"raw": [], "mlxserve": [], "mlx_lm.server": []}
    try:
        for _, port in servers.values():
            http_sample(port, body)  # warm-up
        raw_sample(model, tokenizer, prompt, args.tokens, end_token)
        for _ in range(args.rounds):
            results["raw"].append(raw_sample(model, tokenizer, prompt, args.tokens, end_token))
            for name, (_, port) in servers.items():
                # Each request differs in its first message so no prompt cache is reused.
                fresh = {
                    **body,
                    "messages": [{"role": "user", "content": f"{time.time()} {PROMPT}"}],
                }
                results[name].append(http_sample(port, fresh))
    finally:
        for process, _ in servers.values():
            process.terminate()

    raw_tps = statistics.median(s.decode_tps for s in results["raw"])
    print(
        f"\nmodel: {Path(path).name}; {args.tokens} tokens; {args.rounds} rounds (min median max)"
    )
    print(f"{'':15} {'decode tok/s':>26}   {'ratio vs raw':>26}   {'TTFT s':>26}")
    for name, samples in results.items():
        tps = [s.decode_tps for s in samples]
        ratios = [t / raw_tps for t in tps]
        ttft = [s.ttft for s in samples]
        print(f"{name:15} {summary(tps)}   {summary(ratios)}   {summary(ttft)}")


if __name__ == "__main__":
    main()
