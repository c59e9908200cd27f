"""Real `mlxserve` processes on free ports, and plain HTTP to them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CHAT = "/v1/chat/completions"
STARTUP_SECONDS = 180


@dataclass
class Server:
    """A running `mlxserve` process; its log is kept for assertions and failures."""

    process: subprocess.Popen
    url: str  # http://host:port
    log: list[str] = field(default_factory=list)
    group: bool = False  # mlx.launch and its ranks: stopped as Ctrl-C in a terminal does

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def post(self, path: str, body, headers: dict | None = None, timeout: float = 120):
        """POST JSON (or raw bytes); returns (status, headers, decoded JSON or text)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        return _send(request, timeout)

    def get(self, path: str, headers: dict | None = None, timeout: float = 30):
        return _send(urllib.request.Request(self.url + path, headers=headers or {}), timeout)

    def delete(self, path: str, timeout: float = 30):
        return _send(urllib.request.Request(self.url + path, method="DELETE"), timeout)

    def log_lines(self, text: str, timeout: float = 10) -> list[str]:
        """The log's lines holding `text`, once there is one (the log is read on another
        thread: a line can trail the reply it is about)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.log if text in line]
            if lines or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def stop(self) -> None:
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            if self.group:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process.kill()


def _send(request, timeout):
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers, _decode(response.read(), response.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.headers, _decode(e.read(), e.headers)


def _decode(raw: bytes, headers):
    if "application/json" in headers.get("Content-Type", ""):
        return json.loads(raw)
    return raw.decode("utf-8")


def start_server(
    model: str | Path,
    *args: str,
    env: dict | None = None,
    preexec: Callable[[], None] | None = None,
    ranks: int = 1,
) -> Server:
    """Start `python -m mlxserve` on a free port and wait until it says it is ready.
    `preexec` runs in the child before it starts (to set resource limits). `ranks` > 1:
    as a distributed server, `mlx.launch --backend ring` on this machine, the launcher
    and its ranks in a process group of their own, its input an open pipe never written:
    mlx.launch (0.32.4) can hang at a SIGINT when its input is always readable, as
    `/dev/null` is (docs/distributed.md)."""
    command = [sys.executable, "-m", "mlxserve", "--model", str(model), "--port", "0", *args]
    if ranks > 1:
        bin_dir = Path(sys.executable).parent
        launcher = [str(bin_dir / "mlx.launch"), "--backend", "ring", "-n", str(ranks)]
        launcher += ["--starting-port", str(_free_ports(ranks))]
        command = [*launcher, str(bin_dir / "mlxserve"), *command[3:]]
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE if ranks > 1 else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        preexec_fn=preexec,
        start_new_session=ranks > 1,
    )
    log: list[str] = []
    ready = threading.Event()
    url: list[str] = []

    def read_output() -> None:
        for line in process.stdout:
            if ranks > 1 and not log:  # the launcher's threads relay it: they all exist now
                _yield_the_cpu(process.pid)
            log.append(line)
            if "mlxserve is ready:" in line and not ready.is_set():
                url.append(line.split("ready:")[1].split()[0].removesuffix("/v1"))
                ready.set()
        ready.set()

    threading.Thread(target=read_output, daemon=True).start()
    if not ready.wait(STARTUP_SECONDS) or not url:
        process.kill()
        raise RuntimeError("mlxserve did not start:\n" + "".join(log))
    server = Server(process, url[0], log, group=ranks > 1)
    STARTED.append(server)
    return server


STARTED: list[Server] = []  # every server of the session, in order (their logs on failure)


def _yield_the_cpu(launcher: int) -> None:
    """mlx.launch (0.32.4) polls its ranks' pipes without waiting, 1.5 cores busy while the
    ranks idle (docs/distributed.md): its threads at the lowest priority from its first
    line on (before the ranks measure this device), it takes the cores only when nothing
    else wants them (what it does is unchanged). Linux sets a priority per thread; macOS,
    which has no /proc, per process."""
    tasks = Path(f"/proc/{launcher}/task")
    for thread in [int(t) for t in os.listdir(tasks)] if tasks.is_dir() else [launcher]:
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, thread, 19)


def _free_ports(count: int) -> int:
    """The first of `count` consecutive ports free now (the ring backend's, one per rank)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as held:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue


def server_model(server):
    return server.get("/v1/models")[2]["data"][0]["id"]
