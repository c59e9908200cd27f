"""Servers as black boxes: start one from this venv (alone, or on several ranks through
mlx.launch), stream chat requests at it, read its CPU time, stop it (SIGTERM, as a service
manager would; Ctrl-C, as in a terminal, for a launcher and its ranks)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MODULES = {
    "mlxserve": "mlxserve",
    "mlx_lm.server": "mlx_lm.server",
    "mlx_vlm.server": "mlx_vlm.server",
}


@dataclass
class Reply:
    """One streamed reply: when it was sent, when each content chunk arrived, and usage."""

    sent: float
    stamps: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    text: str = ""

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.sent

    @property
    def finished(self) -> float:
        return self.stamps[-1]

    @property
    def decode_tps(self) -> float:
        return (self.completion_tokens - 1) / (self.stamps[-1] - self.stamps[0])


def print_figures(rows: dict[str, list[float]], digits: int = 3) -> dict[str, float]:
    """Each figure's median over the rounds, as a table; the medians, by name."""
    width = max(len(name) for name in rows) + 2
    print(f"\n{'median over rounds':{width}}{'value':>10}")
    medians = {name: statistics.median(values) for name, values in rows.items()}
    for name, value in medians.items():
        print(f"  {name:{width - 2}}{value:10.{digits}f}")
    return medians


def print_medians(rows: dict[str, list[dict[str, float]]], ttft: str) -> None:
    """Each row's median tok/s and `ttft` figure over the rounds, as a table."""
    width = max(len(name) for name in rows) + 2
    print(f"\n{'median over rounds':{width + 2}}{'tok/s':>10}{ttft:>16}")
    for name, values in rows.items():
        tps = statistics.median(v["tok/s"] for v in values)
        first = statistics.median(v[ttft] for v in values)
        print(f"  {name:{width}}{tps:10.1f}{first:16.2f}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Target:
    def __init__(self, kind: str, model: Path, *args: str, ranks: int = 1, key: str = ""):
        """`ranks` > 1: `mlx.launch --backend ring` on this machine starts the server;
        `key`: the API key every request sends."""
        self.kind = kind
        self.key = key
        self.model = str(model)
        self.port = free_port()
        self.ranks = ranks
        command = [sys.executable, "-m", MODULES[kind], "--model", str(model)]
        command += ["--port", str(self.port), *args]
        if ranks > 1:
            bin_dir = Path(sys.executable).parent
            launcher = [str(bin_dir / "mlx.launch"), "--backend", "ring", "-n", str(ranks)]
            launcher += ["--starting-port", str(free_port())]
            command = [*launcher, str(bin_dir / MODULES[kind]), *command[3:]]
        if kind == "mlxserve" and "--speculation" not in args:
            # The random bench models' greedy output repeats itself: speculation's best
            # case, measured on its own by bench/speculation.py, not in every comparison.
            command += ["--speculation", "off"]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if ranks > 1 else None,  # not /dev/null: docs/distributed.md
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=ranks > 1,
        )
        self._wait_ready()
        self._ps = psutil.Process(self.process.pid)

    def _wait_ready(self) -> None:
        path = "/health" if self.kind == "mlxserve" else "/v1/models"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.process.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", path)
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.kind} did not start")

    def cpu_seconds(self) -> float:
        times = self._ps.cpu_times()
        return times.user + times.system

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the server is idle (it may still be dropping abandoned streams), so
        that it does not slow whatever is measured next."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = self.cpu_seconds()
            time.sleep(0.2)
            if self.cpu_seconds() - before < 0.01:
                return

    def chat(
        self,
        messages: list[dict],
        max_tokens: int,
        logit_bias: dict,
        reply: Reply | None = None,
        stop: threading.Event | None = None,
        model: str | None = None,
        temperature: float = 0.0,
        fields: dict | None = None,
    ) -> Reply:
        """Stream one reply into `reply` (read by other threads meanwhile); hang up early
        once `stop` is set. `model`: which of the server's models (None: its default);
        `fields`: more of the request body (mlx_lm.server's `adapters`)."""
        body = {
            **(fields or {}),
            **({"model": model} if model else {}),
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "logit_bias": logit_bias,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        reply = reply or Reply(time.perf_counter())
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{self.kind}: HTTP {response.status} {response.read()[:300]}")
        for raw in response:
            if stop is not None and stop.is_set():
                break
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
                reply.completion_tokens = usage["completion_tokens"]
                reply.prompt_tokens = usage.get("prompt_tokens") or 0
                details = usage.get("prompt_tokens_details") or {}
                reply.cached_tokens = details.get("cached_tokens") or 0
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                reply.stamps.append(time.perf_counter())
                reply.text += chunk["choices"][0]["delta"]["content"]
        conn.close()
        return reply

    def chat_together(
        self,
        requests: list[tuple[list[dict], int]],
        logit_bias: dict,
        models: list[str | None] | None = None,
        temperature: float = 0.0,
        fields: list[dict] | None = None,
    ) -> list:
        """Send all requests at once, each on its own connection (request i to
        `models[i]`, with `fields[i]`, when given)."""
        replies: list[Reply | None] = [None] * len(requests)
        start = threading.Barrier(len(requests))

        def run(i: int) -> None:
            start.wait()
            model = models[i] if models else None
            more = fields[i] if fields else None
            replies[i] = self.chat(
                *requests[i], logit_bias, model=model, temperature=temperature, fields=more
            )

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return replies

    def stop(self) -> None:
        if self.ranks > 1:
            os.killpg(self.process.pid, signal.SIGINT)
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            if self.ranks > 1:
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.kill()
