"""A chat stream beside requests whose MCP server hangs: the stream's decode tok/s alone,
and while 4 Responses requests wait on an MCP server that accepts their connections and
never answers (a request's server_url, allowed by --mcp-allow-url; each waits out
--mcp-call-timeout on the server's MCP thread). Issue #63's target: >= 0.90x. Interleaved
rounds, one server, the 50M model by default.

    make bench-mcp-hang                          # 50m model, 5 rounds
    make bench-mcp-hang ARGS="--model 7m --rounds 3"
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request

import models
from harness import Target

from bench import Workload

HUNG = 4  # Responses requests waiting on the hung MCP server during a measured stream
TIMEOUT = 60  # --mcp-call-timeout: longer than a measured stream


class SilentServer:
    """Accepts connections and reads them, answers nothing: a hung MCP server."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            self._held.append(connection)

    def release(self) -> None:
        """Drop the connections held: the requests waiting on them end (a 424)."""
        held, self._held = self._held, []
        for connection in held:
            connection.close()

    def close(self) -> None:
        self._socket.close()
        self.release()


def hang(target: Target, url: str, statuses: list[int]) -> None:
    """One Responses request whose MCP server never lists its tools: a 424 once the
    server drops it."""
    body = {
        "input": "Hello",
        "tools": [{"type": "mcp", "server_label": "hung", "server_url": url}],
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{target.port}/v1/responses",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        statuses.append(urllib.request.urlopen(request, timeout=TIMEOUT + 30).status)
    except urllib.error.HTTPError as e:
        statuses.append(e.code)


def round_(target: Target, w: Workload, silent: SilentServer | None, tokens: int) -> float:
    """One stream's decode tok/s, beside HUNG requests stuck on `silent` (None: alone)."""
    url = f"http://127.0.0.1:{silent.port}/mcp" if silent else ""
    statuses: list[int] = []
    count = HUNG if silent else 0
    hung = [threading.Thread(target=hang, args=(target, url, statuses)) for _ in range(count)]
    for thread in hung:
        thread.start()
    time.sleep(0.5)  # they are waiting on the MCP server by now
    reply = target.chat(w.user(40), tokens, w.logit_bias)
    assert all(thread.is_alive() for thread in hung), "a hung request ended before the stream"
    if silent is not None:
        silent.release()
    for thread in hung:
        thread.join()
    assert statuses == [424] * count, statuses
    return reply.decode_tps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="decoded per reply")
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    w = Workload(path, args.tokens, 2000)
    silent = SilentServer()
    print(f"device {mx.default_device()}, {path.name}, {args.tokens} tokens a reply")
    target = Target(
        "mlxserve",
        path,
        *("--mcp-allow-url", "http://127.0.0.1:*", "--mcp-call-timeout", str(TIMEOUT)),
    )
    alone: list[float] = []
    beside: list[float] = []
    try:
        round_(target, w, None, 16)  # warm-up
        for n in range(args.rounds):
            for with_hung in (False, True) if n % 2 == 0 else (True, False):
                tps = round_(target, w, silent if with_hung else None, args.tokens)
                (beside if with_hung else alone).append(tps)
                target.settle()
    finally:
        silent.close()
        target.stop()
    ratios = [b / a for a, b in zip(alone, beside, strict=True)]
    print(f"stream alone          {statistics.median(alone):8.1f} tok/s")
    print(f"beside {HUNG} hung calls   {statistics.median(beside):8.1f} tok/s")
    print(
        f"beside/alone: median {statistics.median(ratios):.3f}x "
        f"({', '.join(f'{r:.3f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
