"""Work that is not a token stream (embeddings, reranking, audio) shares the generation
thread with the chat streams: it runs in bounded pieces between the loop's steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from mlxserve.engine.worker import GenerationWorker
from mlxserve.protocol.errors import ClientGone

T = TypeVar("T")


def shared_call(
    worker: GenerationWorker, fn: Callable[[], T], client_gone: Callable[[], bool]
) -> T:
    """Run one piece of work on the generation thread. While chat streams decode, the
    caller then waits as long as the piece took before it sends the next, so that such
    work takes at most half of the thread from them; a client that has gone stops the
    work at the next piece."""
    if client_gone():
        raise ClientGone
    started = time.monotonic()
    result = worker.call(fn)
    if worker.running:  # chat streams decode: they get as long as this piece took
        time.sleep(time.monotonic() - started)
    return result
