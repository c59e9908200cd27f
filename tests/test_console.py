"""What the console shows: the start-up screen, one sentence for a start-up error, and
no traceback when a client resets its connection."""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys
import time

import pytest
from helpers.server import start_server


@pytest.fixture(scope="module")
def srv(tiny_model):
    started = start_server(tiny_model, "--log-level", "DEBUG")
    yield started
    started.stop()


def test_the_start_up_screen(srv, tiny_model):
    srv.log_lines("(or codex)")  # the screen's last line may trail the ready line
    text = "".join(srv.log)
    assert f"  Web app   {srv.url}/\n" in text
    assert f"  API       {srv.url}/v1  (OpenAI Chat Completions and Responses" in text
    resident = re.search(
        rf"  Models    {tiny_model}: chat, 4,096 tokens of context, (.*) in memory", text
    )
    assert resident and re.fullmatch(r"\d+ kB", resident[1]), text  # under 1 MB: units.format_bytes
    assert "  Memory    budget " in text
    assert f"    curl {srv.url}/v1/chat/completions" in text
    assert f"    mlxserve launch claude --url {srv.url}   (--list: the others)" in text


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a client killed mid-connection does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_a_reset_connection_costs_one_debug_line(srv):
    host, port = srv.url.removeprefix("http://").split(":")
    before = len(srv.log)
    kept = socket.create_connection((host, int(port)))
    kept.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert kept.recv(4096).startswith(b"HTTP/1.1 200")
    reset(kept)  # between requests on a kept-alive connection
    half = socket.create_connection((host, int(port)))
    half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    time.sleep(0.2)
    reset(half)  # mid-body
    time.sleep(0.5)
    assert srv.get("/health")[0] == 200
    written = "".join(srv.log[before:])
    assert "Traceback" not in written and "ERROR" not in written, written


def run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mlxserve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_a_port_in_use_is_one_sentence(srv, tiny_model):
    port = srv.url.rsplit(":", 1)[1]
    done = run("--model", str(tiny_model), "--port", port)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"mlxserve: port {port} on 127.0.0.1 is in use (another server?); stop that server "
        "or choose another port with --port."
    )


def test_a_model_that_is_nowhere_is_one_sentence(tmp_path):
    done = run("--model", str(tmp_path / "nothing"), "--port", "0")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"mlxserve: model '{tmp_path / 'nothing'}' is neither a folder nor a hub repo in the "
        "cache; give a model folder, or download it first with `mlxserve pull REPO` "
        "(`mlxserve ls` lists the models you have)."
    )
