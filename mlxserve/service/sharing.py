"""Work that is not a token stream (embeddings, reranking, audio) shares the generation
thread with the chat streams: it runs in bounded pieces between the loop's steps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.protocol.errors import ClientGone

T = TypeVar("T")

# When the calling thread (a request's) may send its next piece: a piece's result goes back
# at once, and the wait that gives the chat streams their share comes before the next.
_next_piece = threading.local()


def shared_call(
    worker: GenerationWorker, fn: Callable[[], T], client_gone: Callable[[], bool]
) -> T:
    """Run one piece of work on the generation thread. While chat streams decode, the
    caller's next piece waits as long as this one took, so that such work takes at most
    half of the thread from them; the result is the caller's meanwhile (a spoken
    sentence plays, a transcript streams). A client that has gone stops the work at the
    next piece."""
    wait = getattr(_next_piece, "at", 0.0) - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    if client_gone():
        raise ClientGone
    started = time.monotonic()
    result = worker.call(fn)
    ended = time.monotonic()
    # chat streams decode: they get as long as this piece took
    _next_piece.at = ended + (ended - started) if worker.running else 0.0
    return result
