"""A server in the test process itself, for tests that reach into its parts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from helpers.server import Server
from mlxserve.config import ModelSettings, ServerConfig
from mlxserve.server import build_server


@contextmanager
def in_process(model, monkeypatch, **settings) -> Iterator[Server]:
    """A server in this process (so a test can patch the engine), stopped afterwards;
    `settings`: more of its ServerConfig."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = ServerConfig(models=(ModelSettings(str(model)),), port=0, **settings)
    server = build_server(config)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Server(process=None, url=server.url.removesuffix("/v1"))
    finally:
        server.shutdown()
        server.server_close()
        server.routes.service.worker.stop()
